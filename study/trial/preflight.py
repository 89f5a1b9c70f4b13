"""The checks one trial makes on the machine it runs on, before training: the device it asks for exists, the
results store can be written. Each refusal is one ConfigError line naming the fix."""

from __future__ import annotations

import uuid

from study.config import TrialConfig
from study.errors import ConfigError, StoreError
from study.store import Store
from study.store.layout import write_probe


def check_writable(store: Store) -> None:
    """Write and remove a probe file under the root, so a read-only or full store fails now, not after training."""
    probe = write_probe(uuid.uuid4().hex)
    try:
        store.put_text(probe, "loopstudy write check\n")
        store.remove_text(probe)
    except (OSError, StoreError) as e:
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise ConfigError(f"results store {store.uri} cannot be written ({reason}); nothing was run. Give a "
                          "writable --store") from None


def check_device(cfg: TrialConfig) -> None:
    """A CUDA device asked of a machine without one."""
    import torch

    if cfg.train.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={cfg.train.device!r} but this machine has no CUDA GPU; use train.device=cpu")


def preflight_trial(cfg: TrialConfig, store: Store | None) -> None:
    """Every check of one trial on this machine, in order."""
    check_device(cfg)
    if store is not None:
        check_writable(store)
