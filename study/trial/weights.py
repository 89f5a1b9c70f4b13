"""A trial's weights in the results store, so that a finished study can be read again without training again.

Each trained trial keeps its final evaluation weights (the EMA copy) as a safetensors file under `_weights/`
(study/store/layout.py), on the same local, NFS or object-store root as its rows, and optionally the weights of
every `train.keep_checkpoints`-th checkpoint along training. safetensors holds tensors and a text header only:
loading never runs code, unlike a pickle. The header says what the file is on its own (study, trial id, training
step, the trial's config as JSON); the trial's row in the trials table keeps the file's sha256 and size, and every
load checks the bytes against that hash.

Size: 4 bytes per parameter (fp32, as evaluated: bf16 trains under autocast with fp32 weights), so a 7M-parameter
TRM-size reasoner is a 28 MB file (14 MB were it stored in bf16, which would no longer read back the stored
numbers exactly); ARC's puzzle embedding at 1,000 versions adds 374M parameters (1.5 GB) to a paper-size trial.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch

import study
from study.config import TrialConfig, to_dict
from study.errors import StoreError
from study.store import Store
from study.store.layout import weights_file


@dataclass(frozen=True)
class StoredWeights:
    """One stored weights file: where (relative to the root), its sha256 and its size in bytes."""

    path: str
    sha256: str
    bytes: int


def save_weights(store: Store, study_name: str, tid: str, cfg: TrialConfig, state: dict[str, torch.Tensor],
                 step: int, final: bool) -> StoredWeights:
    """Write one trial's weights (a state dict) atomically; returns where, and the hash its row keeps."""
    from safetensors.torch import save

    # own CPU copies: safetensors refuses tensors that share memory (a tied embedding is one tensor, two keys)
    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in state.items()}
    meta = {"study": study_name, "trial_id": tid, "step": str(step), "loopstudy": study.__version__,
            "config": json.dumps(to_dict(cfg), sort_keys=True)}
    data = save(tensors, metadata=meta)
    path = weights_file(study_name, tid, None if final else step)
    store.put_bytes(path, data)
    return StoredWeights(path, hashlib.sha256(data).hexdigest(), len(data))


def load_weights(store: Store, study_name: str, tid: str, sha256: str, step: int | None = None
                 ) -> dict[str, torch.Tensor]:
    """A stored trial's weights (the final ones, or those kept at `step`), checked against the hash its row
    keeps; StoreError when the file is missing or its bytes are not the ones that were stored."""
    from safetensors.torch import load

    path = weights_file(study_name, tid, step)
    data = store.get_bytes(path)
    if data is None:
        raise StoreError(f"trial {tid}: its weights file {store.uri}/{path} is missing (its trials row says it "
                         "was stored): restore the file, or run the trial again")
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise StoreError(f"trial {tid}: its weights file {store.uri}/{path} has sha256 {got[:12]}..., its trials row "
                         f"says {sha256[:12]}...: the file was changed or damaged after the trial stored it; "
                         "restore it, or run the trial again")
    return load(data)

