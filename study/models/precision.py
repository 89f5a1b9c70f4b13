"""A run's precision (train.dtype, eval.dtype): fp32, or bf16 autocast, on a GPU or on the CPU.

bf16 pays on a CPU with bf16 matrix units (AMX, AVX512-BF16: a bf16 matmul several times fp32's rate); without them
PyTorch emulates bf16 and a bf16 run is slower than fp32. Such a CPU is said once per process, in one line, when a
bf16 run starts there (`autocast`), never a silent slowdown."""

from __future__ import annotations

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


def autocast(device: str, dtype: str):
    """The context a run's forward passes run in: bf16 autocast for dtype 'bf16', else a no-op."""
    on_gpu = device.startswith("cuda")
    if dtype == "bf16" and not on_gpu and cpu_has_bf16_units() is False:
        _say_slow_bf16()
    return torch.autocast("cuda" if on_gpu else "cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")
