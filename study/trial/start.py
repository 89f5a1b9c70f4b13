"""The weights a trial starts from (model.init_from, study.config.init_from).

- trm:PATH: a TinyRecursiveModels / HRM checkpoint (study.models.trm_checkpoint). Before the trials are built
  (`resolve_init_from`, from the spec or trial file) the model keys a spec leaves out come from the checkpoint's
  config and its tensors' shapes, and a key the spec sets that contradicts them is refused, naming both values;
  PATH is made absolute against the spec's folder, as task data files are; an object-store URI is read from a copy
  in each machine's cache (study.config.init_from.checkpoint_file). Then every trial's model is checked to
  take every tensor in its shape (`check_init_from`), before any trial starts. The carry rules' own parameters,
  which TRM has none of, keep their fresh init.
- STUDY/TRIAL_ID: that trial's stored final weights in the same store, checked against the hash its row keeps.
  Given the store when the spec is read, the model keys those weights mean (study.config.init_from.WEIGHT_KEYS)
  come from the stored trial's row as a checkpoint's do, with the same refusal of a contradicting key.

`load_start` loads them into a trial's freshly built model before training (or, with train.steps 0, before it is
only read at eval.depths) and returns the sha256 of what it read, which the trial's row records (init_sha256).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from study.config import TrialConfig
from study.config.identity import file_digest
from study.config.init_from import TRM, WEIGHT_KEYS, checkpoint_file, stored_trial, trm_path
from study.errors import ConfigError
from study.paths import is_uri, normalized_uri, redacted


@functools.lru_cache(maxsize=8)
def _read(path: str, size: int, mtime_ns: int) -> Facts:
    from study.models.trm_checkpoint import halting_defaults, published_keys, read_arch, read_tensors, shape_facts

    tensors = read_tensors(Path(path))
    kind, arch = read_arch(Path(path))
    return Facts(kind, published_keys(kind, arch, tensors, path), shape_facts(tensors)["puzzles"],
                 halting_defaults(kind, arch))


@dataclass(frozen=True)
class Facts:
    """What a checkpoint says of itself: 'trm' or 'hrm', the model keys it implies, its puzzle-embedding rows, and
    the keys of its own halting (defaults a spec may change)."""

    kind: str
    keys: dict[str, Any]
    puzzle_rows: int
    defaults: dict[str, Any]


def checkpoint_facts(path: str) -> Facts:
    """The checkpoint's Facts, read once per file version."""
    path = checkpoint_file(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"model.init_from {TRM}{path}: {e.strerror}") from None
    return _read(os.path.abspath(path), st.st_size, st.st_mtime_ns)


def resolve_init_from(data: dict[str, Any], base: Path, source: str, store_root: str | None = None) -> dict[str, Any]:
    """A trial or spec dict with `model.init_from` completed from what it names (in place; returns data): for
    trm:PATH, PATH absolute against `base` and every model key the checkpoint fixes; for STUDY/TRIAL_ID (with the
    results root `store_root`), every key of WEIGHT_KEYS from the stored trial. Each is filled in where the dict
    leaves it out; a key it sets to another value is refused, naming both."""
    model = data.get("model")
    if not isinstance(model, dict):
        return data
    where = stored_trial(model.get("init_from"))
    if where is not None and store_root is not None:
        fill_keys(model, stored_keys(store_root, *where), source, f"the stored trial {model['init_from']}")
    if trm_path(model.get("init_from")) is None:
        return data
    path = trm_path(model["init_from"])
    if is_uri(path):
        path = normalized_uri(path)
    else:
        path = Path(path).expanduser()
        path = str(path if path.is_absolute() else (base / path).resolve())
    model["init_from"] = TRM + path
    facts = checkpoint_facts(path)
    fill_keys(model, facts.keys, source, f"the checkpoint {redacted(path)}")
    fill_keys(model, facts.defaults, source, "", refuse=False)
    return data


def fill_keys(model: dict[str, Any], keys: dict[str, Any], source: str, origin: str, refuse: bool = True) -> None:
    """`keys` (dotted within the model section) into the spec's model dict where it leaves them out; one it sets to
    another value is refused, naming both (refuse False: the spec's value stands)."""
    for key, value in keys.items():
        *path, name = key.split(".")
        section = model
        for part in path:
            section = section.setdefault(part, {})
        if name not in section:
            section[name] = value
        elif refuse and section[name] != value:
            raise ConfigError(f"{source}: model.{key}={section[name]!r} contradicts {origin}, whose model.{key} is "
                              f"{value!r}; leave model.{key} out to take its value")


def stored_keys(store_root: str, study_name: str, tid: str) -> dict[str, Any]:
    """WEIGHT_KEYS of a stored trial, from its row (a key added after the row was written: the value that
    reproduces the behaviour from before it, as the trial's identity reads it)."""
    from study.config.identity import ADDED_LATER
    from study.store import Store

    store = Store(store_root)
    row = store.trial_row(study_name, tid)
    if not row:
        raise ConfigError(f"model.init_from {study_name}/{tid}: no trial {tid} in study {study_name!r} in "
                          f"{store.uri}")
    out = {}
    for key in WEIGHT_KEYS:
        value = row.get(f"model.{key}")
        out[key] = ADDED_LATER.get(("model", key), None) if value is None else value
    return out


def check_init_from(configs: list[TrialConfig], source: str) -> None:
    """Every trial that starts from a TRM checkpoint gets all of its tensors, each in the shape the trial's model
    has (the task's vocabulary and length included): refused before any trial starts, naming the tensor."""
    from study.tasks import TASKS

    seen = set()
    for cfg in configs:
        path = trm_path(cfg.model.init_from)
        if path is None:
            continue
        # torch only for a spec that names a checkpoint: the reading commands load saved specs too
        from study.models.reasoner import build_reasoner
        from study.models.trm_checkpoint import read_tensors, to_state_dict

        spec = TASKS[cfg.task.name].spec(cfg.task)
        if (path, repr(cfg.model), spec) in seen:
            continue
        seen.add((path, repr(cfg.model), spec))
        facts = checkpoint_facts(path)
        rows = facts.puzzle_rows
        if rows > 1 and not (cfg.task.name == "arc" and cfg.task.identifiers):
            # Sudoku and Maze have one identifier (0); ARC's rows follow its builder's identifiers.json
            raise ConfigError(f"{source}: checkpoint {redacted(path)} has {rows} puzzle-embedding rows (an ARC model), "
                              "numbered by the dataset builder's identifiers.json; give that file as task.identifiers "
                              "(task arc), so each puzzle version reads its own row")
        to_state_dict(read_tensors(Path(checkpoint_file(path))), facts.kind, build_reasoner(cfg.model, spec),
                      f"{source}: checkpoint {redacted(path)}")


def load_start(model, cfg: TrialConfig, store=None) -> str | None:
    """Load cfg.model.init_from's weights into `model`; returns their sha256 (None: nothing to load)."""
    source = cfg.model.init_from
    path = trm_path(source)
    if path is not None:
        from study.models.trm_checkpoint import read_tensors, to_state_dict

        local = checkpoint_file(path)
        state = to_state_dict(read_tensors(Path(local)), checkpoint_facts(path).kind, model,
                              f"checkpoint {redacted(path)}")
        model.load_state_dict(state, strict=False)  # (only the carry rules' own parameters are not in it)
        return file_digest(local)
    where = stored_trial(source)
    if where is None:
        return None
    from study.trial.weights import load_weights

    study_name, tid = where
    row = store.trial_row(study_name, tid) if store is not None else None
    if not row or not row.get("weights_sha256"):
        raise ConfigError(f"model.init_from {source}: no stored weights of trial {tid} in study {study_name!r}"
                          + (f" in {store.uri}" if store is not None else " (no results store given)"))
    weights = load_weights(store, study_name, tid, row["weights_sha256"])
    mine = model.state_dict()
    wrong = sorted(k for k in weights if k not in mine or tuple(mine[k].shape) != tuple(weights[k].shape))
    if wrong or set(mine) - set(weights):
        raise ConfigError(f"model.init_from {source}: its weights do not fit this trial's model "
                          f"({', '.join(wrong[:3]) or ', '.join(sorted(set(mine) - set(weights))[:3])}): the model "
                          "keys must be the ones that trial was trained with")
    model.load_state_dict(weights)
    return row["weights_sha256"]
