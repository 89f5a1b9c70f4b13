"""Adam-atan2 (Everett et al. 2024), as TRM trains with it (train.optimizer adam_atan2).

Per parameter p with gradient g, at step t (m, v start at zero):

    p <- p (1 - lr * wd)                                    decoupled weight decay, first
    m <- m + (1 - beta1) (g - m);  v <- v + (1 - beta2) (g^2 - v)
    p <- p - (lr / (1 - beta1^t)) * atan2(m, sqrt(v) / sqrt(1 - beta2^t))

atan2 replaces Adam's m / (sqrt(v) + eps): bounded by pi/2, no epsilon to tune, and equal to Adam's step where
|m| << sqrt(v). The first bias correction multiplies the step outside the atan2, as the fused kernel of the
`adam-atan2` package TRM imports does. That package builds a CUDA extension only, and `adam-atan2-pytorch` puts the
correction inside the atan2 (another update early in training), so loopstudy states the rule here: it runs on any
device and its state dict has Adam's keys (step, exp_avg, exp_avg_sq).
"""

from __future__ import annotations

import math

import torch


class AdamAtan2(torch.optim.Optimizer):
    """Adam-atan2 with decoupled weight decay (see the module docstring); param groups as AdamW's."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.1):
        if lr < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"AdamAtan2 needs lr >= 0, weight_decay >= 0 and betas in [0, 1); got lr={lr}, "
                             f"weight_decay={weight_decay}, betas={betas}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamAtan2 takes dense gradients (ARC's puzzle table has its own optimizer)")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = float(state["step"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1 - lr * wd)
                m.lerp_(p.grad, 1 - beta1)
                v.lerp_(p.grad.square(), 1 - beta2)
                denom = v.sqrt() / math.sqrt(1 - beta2**t)
                p.add_(torch.atan2(m, denom), alpha=-lr / (1 - beta1**t))
        return loss
