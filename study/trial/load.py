"""`load_model`: a stored trial's model, ready to roll out, from the results store alone.

The weights file says what it is on its own (study.trial.weights: the trial's config in its header), so the model
is rebuilt from that config and the task's shape, its weights checked against the hash the trial's row keeps."""

from __future__ import annotations

import json
import struct

from study.config import build_trial
from study.errors import StoreError
from study.store import Store


def stored_config(data: bytes, where: str):
    """The trial config a weights file's header holds (safetensors: an 8-byte little-endian length, then a JSON
    header whose __metadata__ loopstudy fills)."""
    (n,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8:8 + n]).get("__metadata__") or {}
    if "config" not in meta:
        raise StoreError(f"{where}: the weights file's header holds no trial config")
    return build_trial(json.loads(meta["config"]), where)


def load_model(store: Store | str, study: str, trial_id: str | None = None):
    """The stored final weights of trial `trial_id` of `study` (None: the study's only trial with stored weights)
    in the model they were trained as, in eval mode: `model.rollout(tokens, n_steps)` runs n_steps outer cycles
    (iterations for a flat model) from a fresh state and returns the state; `model.logits(state)` gives one row of
    logits per token. Tokens are in the task's encoding (Sudoku: TRM's, 0 pad, 1 blank, digits from 2)."""
    from study.models.reasoner import build_reasoner
    from study.store.layout import weights_file
    from study.tasks import TASKS
    from study.trial.weights import load_weights

    store = Store(store) if isinstance(store, str) else store
    rows = store.scan("trials", study, skip_bad=True).collect()
    stored = {r["trial_id"]: r for r in rows.iter_rows(named=True)
              if r.get("status") == "complete" and r.get("weights_sha256")}
    if trial_id is None:
        if len(stored) != 1:
            raise StoreError(f"study {study!r} has {len(stored)} trials with stored weights; name one of them: "
                             + (", ".join(sorted(stored)[:20]) or "none"))
        trial_id = next(iter(stored))
    if trial_id not in stored:
        raise StoreError(f"study {study!r} has no stored weights of trial {trial_id!r}; trials with weights: "
                         + (", ".join(sorted(stored)[:20]) or "none"))
    weights = load_weights(store, study, trial_id, stored[trial_id]["weights_sha256"])
    cfg = stored_config(store.get_bytes(weights_file(study, trial_id)), f"{store.uri}/{weights_file(study, trial_id)}")
    model = build_reasoner(cfg.model, TASKS[cfg.task.name].spec(cfg.task))
    model.load_state_dict(weights)
    return model.eval()
