"""InfiLoop's fused CPU step (infiloop_cpu.cpp), built with this machine's C++ compiler on first use and cached.

Eager PyTorch spends about 13 small kernels on one InfiLoop step; at the model's sizes each costs more in dispatch
than in work, which made InfiLoop's rollouts ~8% slower than carry-last's. The fused step reads each token's row
once, in one call. Contract:
- `fused_step(h_prev, log_d_prev, z, q, log_beta, clip, eps, in_place, addend)` returns what
  carry.infiloop_update_eager returns (in place: h and log D written over h_prev and log_d_prev) and, fifth, the
  next block's input `h + addend` rounded to z's dtype (None without an addend); or None where it does not apply:
  a gradient is being recorded (the kernel has no backward), a tensor is not on the CPU (on GPUs the eager kernels
  queue asynchronously, so their launch cost is hidden), or the tensors are not all float32 or all float64. One mix
  is taken: a bf16 candidate z or addend beside float32 states (a bf16 reading), widened as it is read. An addend
  of another shape than z's (broadcast) is left to the caller: the fifth value is then None.
- The next input is the one saving a bf16 reading needs: InfiLoop's float32 state plus the loop's float32 addend,
  summed and rounded to bf16 for the block as its own ops would (bit for bit), in the pass that writes the state,
  instead of a float32 sum and a cast of it, two more passes over the rows at every layer.
- The library is built once per source, torch version and CPU (it is tuned to the CPU it is built on) into
  `$LOOPSTUDY_KERNEL_CACHE` (default `$XDG_CACHE_HOME/loopstudy/kernels`, else `~/.cache/loopstudy/kernels`), in
  about 30 s. Processes starting together (Ray workers) wait on a lock file while one builds, and the library is
  renamed into place whole, so no reader sees half of one. It is a Python extension module: a direct call costs
  a few microseconds less than a registered torch op, at one call per layer.
- Where it cannot be built (no GCC 12+ or Clang as `$CXX`, else `c++`; no Python headers), one warning says so and
  carry.py stays eager.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import platform
import subprocess
import sysconfig
import tempfile
import warnings
from pathlib import Path

import torch
from torch.utils import cpp_extension

SOURCE = Path(__file__).with_name("infiloop_cpu.cpp")
_MODULE = "loopstudy_infiloop_cpu"  # the built module's name (its PyInit_ symbol)
FLOATS = (torch.float32, torch.float64)  # the dtypes the fused step takes (and InfiLoop accumulates in)
FP32, BF16 = torch.float32, torch.bfloat16


def cache_dir() -> Path:
    """Where built kernels are kept (see the module docstring)."""
    if os.environ.get("LOOPSTUDY_KERNEL_CACHE"):
        return Path(os.environ["LOOPSTUDY_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "loopstudy" / "kernels"


def _cpu_flags() -> str:
    """The CPU's feature flags (built with -march=native: a cache shared by different machines keeps one each)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _library_path() -> Path:
    tag = f"{torch.__version__}|{platform.python_version()}|{platform.machine()}|{_cpu_flags()}"
    key = hashlib.sha256(SOURCE.read_bytes() + tag.encode()).hexdigest()
    return cache_dir() / f"infiloop_cpu_{key[:16]}.so"


def _compile(target: Path) -> None:
    """One compiler call: a Python extension module linked against the running torch (no ninja)."""
    lib_dirs = cpp_extension.library_paths()
    cmd = [os.environ.get("CXX", "c++"), str(SOURCE), "-o", None, "-shared", "-fPIC", "-O3", "-std=c++20",
           "-fopenmp",  # at::parallel_for over rows, on torch's own libgomp (already loaded, same soname); omp simd
           # This machine's vector width (the cache key holds its CPU's flags); branches may become selects, which
           # compute both sides: nothing here reads floating-point exception flags or errno.
           "-march=native", "-fno-trapping-math", "-fno-math-errno",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}", f"-DTORCH_EXTENSION_NAME={_MODULE}",
           *(f"-I{p}" for p in (*cpp_extension.include_paths(), sysconfig.get_paths()["include"])),
           *(f"-L{p}" for p in lib_dirs), *(f"-Wl,-rpath,{p}" for p in lib_dirs),
           "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd[3] = tmp
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def kernel():
    """The fused step (`infiloop_step` of the built module), or None where it cannot be built (warned once)."""
    target = _library_path()
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target.with_suffix(".lock"), "w") as lock:  # one builder per machine; the rest wait for it
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not target.exists():
                    _compile(target)
        spec = importlib.util.spec_from_file_location(_MODULE, target)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, ImportError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        warnings.warn(f"InfiLoop's fused CPU step could not be built ({detail.strip()[-300:]}); using the eager "
                      "step (same results, ~8% slower rollouts). Set CXX to GCC 12+ or Clang to build it.",
                      RuntimeWarning, stacklevel=2)
        return None
    return module.infiloop_step


def fused_step(
    h_prev: torch.Tensor,
    log_d_prev: torch.Tensor,
    z: torch.Tensor,
    q: torch.Tensor | None,
    log_beta: torch.Tensor,
    clip: float,
    eps: float,
    in_place: bool = False,
    addend: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """The fused step, or None where it does not apply (see the module docstring)."""
    # Written out rather than looped: this runs at every layer of every rollout, and each check costs time there.
    if torch.is_grad_enabled() and (z.requires_grad or h_prev.requires_grad or log_d_prev.requires_grad
                                    or log_beta.requires_grad or (q is not None and q.requires_grad)
                                    or (addend is not None and addend.requires_grad)):
        return None
    dtype = h_prev.dtype
    if (not z.is_cpu or dtype not in FLOATS or (z.dtype != dtype and not (z.dtype == BF16 and dtype == FP32))
            or log_d_prev.dtype != dtype or log_beta.dtype != dtype or (q is not None and q.dtype != dtype)):
        return None
    if addend is not None and (addend.shape != z.shape or not addend.is_cpu or (
            addend.dtype != dtype and not (addend.dtype == BF16 and dtype == FP32))):
        addend = None  # the caller sums it
    op = kernel()
    return None if op is None else op(h_prev, log_d_prev, z, q, log_beta, clip, eps, in_place, addend)
