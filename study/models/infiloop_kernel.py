"""InfiLoop's fused CPU step (infiloop_cpu.cpp, built by cpu_kernels.py).

Eager PyTorch spends about 13 small kernels on one InfiLoop step; at the model's sizes each costs more in dispatch
than in work, which made InfiLoop's rollouts ~8% slower than carry-last's. The fused step reads each token's row
once, in one call. Contract:
- `fused_step(h_prev, log_d_prev, z, q, log_beta, clip, eps, in_place, addend)` returns what
  carry.infiloop_update_eager returns (in place: h and log D written over h_prev and log_d_prev) and, fifth, the
  next block's input `h + addend` rounded to z's dtype (None without an addend); or None where it does not apply:
  a gradient is being recorded (the kernel has no backward), the step is being compiled (`eval.compile`: the
  compiler fuses the eager ops itself, and a call out of its graph would break it), a tensor is not on the CPU (on
  GPUs the eager kernels queue asynchronously, so their launch cost is hidden), or the tensors are not all float32
  or all float64. One mix is taken: a bf16 candidate z or addend beside float32 states (a bf16 reading), widened as
  it is read. An addend of another shape than z's (broadcast) is left to the caller: the fifth value is then None.
- The next input is the one saving a bf16 reading needs: InfiLoop's float32 state plus the loop's float32 addend,
  summed and rounded to bf16 for the block as its own ops would (bit for bit), in the pass that writes the state,
  instead of a float32 sum and a cast of it, two more passes over the rows at every layer.
Where the kernels cannot be built, cpu_kernels.py warns once and carry.py stays eager.
"""

from __future__ import annotations

import torch

from study.models.cpu_kernels import module

FLOATS = (torch.float32, torch.float64)  # the dtypes the fused step takes (and InfiLoop accumulates in)
FP32, BF16 = torch.float32, torch.bfloat16


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
    if torch.compiler.is_compiling():  # the compiler fuses the eager ops itself; a call out of its graph breaks it
        return None
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
    built = module()
    if built is None:
        return None
    return built.infiloop_step(h_prev, log_d_prev, z, q, log_beta, clip, eps, in_place, addend)
