"""RoPE on queries and keys as one CPU pass (rope_cpu.cpp, built by cpu_kernels.py).

block.py's `rotate` takes seven elementwise passes over each of q and k (a cast up to float32, a negation, a
concatenation, two products, a sum and a cast down); in a bf16 reading of the published TRM-Att size they cost
about half as much time as the projection's matmul. Contract:
- `fused_rope_qk(qkv, cos, sin, heads)` takes the projection's output (B, S, 3 * D: queries, keys, values, head
  by head) and RoPE's float32 tables (S, head_dim), and returns `(rotate(q, cos, sin), rotate(k, cos, sin))` bit
  for bit, in `rotate`'s layout: (B, heads, S, head_dim) over memory ordered (B, S, heads, head_dim).
- Or None where it does not apply: a gradient is being recorded (the kernel has no backward), the step is being
  compiled (`eval.compile`: the compiler fuses the eager ops itself, and a call out of its graph would break it),
  qkv is not on the CPU (on GPUs the eager kernels queue asynchronously), or its dtype is not bf16, float32 or
  float64.
Where the kernels cannot be built, cpu_kernels.py warns once and block.py stays eager.
"""

from __future__ import annotations

import torch

from study.models.cpu_kernels import module

DTYPES = (torch.bfloat16, torch.float32, torch.float64)


def fused_rope_qk(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  heads: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rotated (queries, keys), or None where the fused pass does not apply (see the module docstring)."""
    if (torch.compiler.is_compiling() or (torch.is_grad_enabled() and qkv.requires_grad) or not qkv.is_cpu
            or qkv.dtype not in DTYPES):
        return None
    built = module()
    return None if built is None else built.rope_qk(qkv, cos, sin, heads)
