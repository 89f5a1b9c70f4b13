"""`model.init_from`'s two forms, read (torch-free; what they load and how: study.trial.start):

- `trm:PATH`: a checkpoint written by TinyRecursiveModels' (or HRM's) pretrain.py, TRM_CONFIG beside it; PATH is a
  local path (shared by the nodes) or an object-store URI as `--store` takes, which each machine reads from a copy
  in its cache (`checkpoint_file`). Its sha256, not its path, is part of the trial's identity
  (study.config.identity), as a task data file's is.
- `STUDY/TRIAL_ID`: another study's stored weights in the same store (fine-tuning from them).
"""

from __future__ import annotations

TRM = "trm:"
TRM_CONFIG = "all_config.yaml"  # the run's config that pretrain.py writes beside its checkpoints

# The model keys a stored trial's weights mean (their shapes and the arithmetic that reads them), which
# `STUDY/TRIAL_ID` takes from the stored trial as `trm:PATH` takes its keys from the checkpoint. Left to the new
# trial: how weights are made or trained (init, grad_steps, inner_grad_steps) and test-time halting.
WEIGHT_KEYS = ("kind", "hidden", "heads", "n_layers", "expansion", "norm", "conv", "residual_scaling", "pos", "mixer",
               "h_layers", "swiglu_multiple", "init_states", "head_norm", "puzzle_prefix", "q_head", "H", "L",
               "recall", "carry.rule", "carry.placement")


def trm_path(value: str | None) -> str | None:
    """The checkpoint path of a `trm:PATH` value (None for anything else)."""
    return value[len(TRM):] if isinstance(value, str) and value.startswith(TRM) else None


def stored_trial(value: str | None) -> tuple[str, str] | None:
    """(study, trial id) of a `STUDY/TRIAL_ID` value (None for anything else)."""
    if not isinstance(value, str) or trm_path(value) is not None or value.count("/") != 1:
        return None
    study, tid = value.split("/")
    return (study, tid) if study and tid else None


def checkpoint_file(path: str) -> str:
    """A local path of the `trm:` checkpoint `path` names, TRM_CONFIG beside it (an object-store URI: fetched into
    this machine's cache once per object version)."""
    from study.errors import ConfigError, StoreError, first_line
    from study.paths import local_copy, redacted

    try:
        return local_copy(path, TRM_CONFIG)
    except (StoreError, OSError) as e:
        raise ConfigError(f"model.init_from {TRM}{redacted(path)}: {first_line(e)}") from None
