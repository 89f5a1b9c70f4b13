"""`model.init_from`'s two forms, read (torch-free; what they load and how: study.trial.start):

- `trm:PATH`: a checkpoint written by TinyRecursiveModels' (or HRM's) pretrain.py; its sha256, not its path, is
  part of the trial's identity (study.config.identity), as a task data file's is.
- `STUDY/TRIAL_ID`: another study's stored weights in the same store (fine-tuning from them).
"""

from __future__ import annotations

TRM = "trm:"


def trm_path(value: str | None) -> str | None:
    """The checkpoint path of a `trm:PATH` value (None for anything else)."""
    return value[len(TRM):] if isinstance(value, str) and value.startswith(TRM) else None


def stored_trial(value: str | None) -> tuple[str, str] | None:
    """(study, trial id) of a `STUDY/TRIAL_ID` value (None for anything else)."""
    if not isinstance(value, str) or trm_path(value) is not None or value.count("/") != 1:
        return None
    study, tid = value.split("/")
    return (study, tid) if study and tid else None
