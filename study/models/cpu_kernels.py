"""loopstudy's fused CPU kernels, one C++ extension module built with this machine's compiler on first use and cached.

At the model's sizes eager PyTorch spends more on dispatching small elementwise kernels, and on passes over memory
between them, than on their arithmetic. The kernels here each do one such chain in one pass, forward only (their
callers take them only where no gradient is recorded), with the eager chain's results bit for bit where the chain
rounds to a narrower dtype:
- `infiloop_step` (infiloop_cpu.cpp, called through infiloop_kernel.py): one InfiLoop step;
- `rope_qk` (rope_cpu.cpp, called through rope_kernel.py): RoPE on the queries and keys of one projection.

Contract of the build:
- One library per set of sources, torch version and CPU (it is tuned to the CPU it is built on), in
  `$LOOPSTUDY_KERNEL_CACHE` (default `$XDG_CACHE_HOME/loopstudy/kernels`, else `~/.cache/loopstudy/kernels`), in
  about 30 s (the sources compile side by side). Processes starting together (Ray workers) wait on a lock file
  while one builds, and the library is renamed into place whole, so no reader sees half of one.
- Each source has its own flags (`SOURCES`): rope_cpu.cpp is compiled without floating-point contraction, as its
  bit-for-bit contract needs; infiloop_cpu.cpp keeps the flags its stored readings were computed with.
- Where it cannot be built (no GCC 12+ or Clang as `$CXX`, else `c++`; no Python headers), one warning says so and
  every caller stays eager (same results, slower).
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

HERE = Path(__file__).parent
HEADER = HERE / "cpu_kernels.h"
# source -> its own compiler flags. Contraction (a * b + c as one fused multiply-add) is GCC's default for C++; a
# source that promises eager PyTorch's bits turns it off. InfiLoop's step was built with the default: changing its
# flags could move the last bits of the readings already stored.
SOURCES = {HERE / "cpu_kernels.cpp": (), HERE / "infiloop_cpu.cpp": (), HERE / "rope_cpu.cpp": ("-ffp-contract=off",)}
_MODULE = "loopstudy_cpu_kernels"  # the built module's name (its PyInit_ symbol)


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
    # the sources by name and content, not by path: every checkout of the same code shares one library
    flags = {source.name: flags for source, flags in SOURCES.items()}
    tag = f"{torch.__version__}|{platform.python_version()}|{platform.machine()}|{_cpu_flags()}|{flags}"
    digest = hashlib.sha256(tag.encode() + HEADER.read_bytes())
    for source in SOURCES:
        digest.update(source.read_bytes())
    return cache_dir() / f"cpu_kernels_{digest.hexdigest()[:16]}.so"


def _compile(target: Path) -> None:
    """One compiler call per source, side by side, then one link: a Python extension module against the running
    torch (no ninja)."""
    cxx = os.environ.get("CXX", "c++")
    lib_dirs = cpp_extension.library_paths()
    common = ["-O3", "-std=c++20", "-fPIC",
              "-fopenmp",  # at::parallel_for over rows, on torch's own libgomp (already loaded, same soname); omp simd
              # This machine's vector width (the cache key holds its CPU's flags); branches may become selects,
              # which compute both sides: nothing here reads floating-point exception flags or errno.
              "-march=native", "-fno-trapping-math", "-fno-math-errno",
              f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}", f"-DTORCH_EXTENSION_NAME={_MODULE}",
              *(f"-I{p}" for p in (*cpp_extension.include_paths(), sysconfig.get_paths()["include"]))]
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        objects = [Path(work) / f"{source.stem}.o" for source in SOURCES]
        builds = [subprocess.Popen([cxx, "-c", str(source), "-o", str(obj), *common, *flags], text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                  for (source, flags), obj in zip(SOURCES.items(), objects, strict=True)]
        for build in builds:
            out, err = build.communicate()
            if build.returncode != 0:
                raise subprocess.CalledProcessError(build.returncode, build.args, out, err)
        linked = Path(work) / target.name
        link = [cxx, *map(str, objects), "-o", str(linked), "-shared", "-fopenmp",
                *(f"-L{p}" for p in lib_dirs), *(f"-Wl,-rpath,{p}" for p in lib_dirs),
                "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
        subprocess.run(link, check=True, capture_output=True, text=True)
        os.replace(linked, target)


@functools.cache
def module():
    """The built module (its functions: `infiloop_step`, `rope_qk`), or None where it cannot be built (warned once)."""
    target = _library_path()
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target.with_suffix(".lock"), "w") as lock:  # one builder per machine; the rest wait for it
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not target.exists():
                    _compile(target)
        spec = importlib.util.spec_from_file_location(_MODULE, target)
        built = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(built)
    except (OSError, ImportError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        warnings.warn(f"loopstudy's fused CPU kernels could not be built ({detail.strip()[-300:]}); using eager ops "
                      "(same results; InfiLoop rollouts ~8% slower, bf16 readings with RoPE slower). Set CXX to GCC "
                      "12+ or Clang to build them.", RuntimeWarning, stacklevel=2)
        return None
    return built
