"""glibc's malloc in a trial's process: freed activation memory stays on the heap instead of going back to the kernel.

A looped model allocates and frees the same few hundred KiB at every layer. glibc adapts two thresholds to what a
process has freed so far: blocks above the mmap threshold get a mapping of their own, and free memory above the
trim threshold at the heap's top is handed back. Depending on that history, a process may give back a layer's
memory at each layer and fault it in again, zeroed page by page, at the next: bench/heap.py's rollout at batch 64
took 237-354 page faults per layer that way and ran 11-18% slower (at batch 8 the activations stay below the
thresholds, and nothing changes). Which way a process went changed from run to run. Fixed thresholds keep the
memory on the heap. The cost: a process's resident memory stays at its peak rather than shrinking after it.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (<malloc.h>)
MMAP_THRESHOLD = 32 << 20  # where glibc's adaptive threshold stops rising on 64-bit: larger blocks keep a mapping
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Fix glibc malloc's mmap and trim thresholds for this process (see the module docstring). Idempotent; False,
    doing nothing, where the C library is not glibc (macOS, musl)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) & bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
