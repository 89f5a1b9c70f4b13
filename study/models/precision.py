"""A run's precision (train.dtype, eval.dtype): fp32 or bf16, on a GPU or on the CPU.

Training in bf16 runs under autocast (float32 master weights, bf16 matmuls). A bf16 reading runs as TRM runs its
forward (`forward_dtype: bfloat16`): a copy of the model in bf16 (`reading_model`), its states between layers in bf16,
the norms, RoPE and the Q head's logits in float32 (the model's own casts), and the carry rules and FPRM's residual
scalars in float32 (modules with `keeps_float32`), InfiLoop's accumulators with them.

bf16 pays on a CPU with bf16 matrix units (AMX, AVX512-BF16: a bf16 matmul several times fp32's rate); without them
PyTorch emulates bf16 and a bf16 run is slower than fp32. Such a CPU is said once per process, in one line, when a
bf16 run starts there (`autocast`, `reading_model`), never a silent slowdown."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch

from study.console import eprint

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names of the CPU's bf16 matrix instructions


def has_bf16_units(cpuinfo: str) -> bool:
    """Whether a /proc/cpuinfo text names bf16 matrix instructions among its CPU's flags."""
    flags = set(cpuinfo.split())
    return any(f in flags for f in BF16_FLAGS)


@functools.cache
def cpu_has_bf16_units() -> bool | None:
    """Whether this CPU has bf16 matrix units (None: cannot tell, not Linux)."""
    try:
        return has_bf16_units(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None


@functools.cache
def _say_slow_bf16() -> None:
    eprint("loopstudy: this CPU has no bf16 matrix units (AMX / AVX512-BF16): bf16 runs here are emulated and slower "
           "than fp32 (bench/precision.py measures both); use train.dtype / eval.dtype fp32 on this machine")


def _check(device: str, dtype: str) -> None:
    if dtype == "bf16" and not device.startswith("cuda") and cpu_has_bf16_units() is False:
        _say_slow_bf16()


def autocast(device: str, dtype: str):
    """The context training's forward passes run in: bf16 autocast for dtype 'bf16', else a no-op."""
    _check(device, dtype)
    return torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16,
                          enabled=dtype == "bf16")


def reading_model(model: torch.nn.Module, device: str, dtype: str) -> torch.nn.Module:
    """The model a reading runs: itself for fp32; for bf16 a copy in bf16 whose `keeps_float32` modules stay in
    float32 (see the module docstring)."""
    _check(device, dtype)
    if dtype != "bf16":
        return model
    copied = copy.deepcopy(model).to(torch.bfloat16)
    for module in copied.modules():
        if getattr(module, "keeps_float32", False):
            module.float()
    return copied

