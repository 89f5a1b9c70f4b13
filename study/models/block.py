"""The shared block f_theta (methods.md section 1).

One block = `n_layers` transformer layers. Each layer has two sublayers:
  1. token mixing: multi-head self-attention plus a depthwise conv over the token grid (summed),
  2. a SwiGLU MLP.
Norm placement is `post` (TRM/HRM: h = norm(h + sub(h))) or `pre` (FPRM: h = h + sub(norm(h))). With FPRM's tied
residual scaling (methods.md section 2) every sublayer update is h = a1 * h + b1 * sub(norm(h)), a1 and b1 shared
by all 2 * n_layers sublayers, and the flat reasoner mixes iterations with (a2, b2).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from study.config import ModelConfig

RMS_EPS = 1e-5  # every RMSNorm of the model (the block's, the head's, the carry rules' scores)


def rms_norm(x: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    """Weightless RMSNorm (as TRM); half precision is upcast to float32 for stability under bf16."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return F.rms_norm(xf, (x.shape[-1],), eps=eps).to(x.dtype)


def swiglu_width(hidden: int, expansion: float) -> int:
    """TRM's SwiGLU width: 2/3 of expansion * hidden, rounded up to a multiple of 256 (of 16 below hidden 256)."""
    raw = round(expansion * hidden * 2 / 3)
    mult = 256 if hidden >= 256 else 16
    return mult * math.ceil(raw / mult)


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)  # non-causal: every cell sees the whole board
        return self.proj(y.transpose(1, 2).reshape(B, S, D))


class GridConv(nn.Module):
    """Depthwise conv over the token grid (3x3 in 2-D, 3 in 1-D). FPRM: needed for fixed-point stability."""

    def __init__(self, cfg: ModelConfig, grid: tuple[int, ...]):
        super().__init__()
        self.grid = grid
        conv = nn.Conv2d if len(grid) == 2 else nn.Conv1d
        self.conv = conv(cfg.hidden, cfg.hidden, 3, padding=1, groups=cfg.hidden)

    def grid_for(self, S: int) -> tuple[int, ...]:
        """The grid of a length-S input: a sequence of any length, a square board of any side (so a model without
        learned positions reads longer strings and larger mazes at test time), else the configured grid."""
        if len(self.grid) == 1:
            return (S,)
        side = math.isqrt(S)
        if self.grid[0] == self.grid[1] and side * side == S:
            return (side, side)
        return self.grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        grid = self.grid_for(S)
        n_grid = math.prod(grid)
        # Tokens beyond the grid (none for our tasks, but allowed) are left to attention alone.
        g = x[:, :n_grid].transpose(1, 2).reshape(B, D, *grid)
        out = self.conv(g).reshape(B, D, n_grid).transpose(1, 2)
        if n_grid < S:
            out = torch.cat([out, torch.zeros_like(x[:, n_grid:])], dim=1)
        return out


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        width = swiglu_width(cfg.hidden, cfg.expansion)
        self.gate_up = nn.Linear(cfg.hidden, 2 * width, bias=False)
        self.down = nn.Linear(width, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Mixer(nn.Module):
    """Token-mixing sublayer: attention plus the local depthwise conv."""

    def __init__(self, cfg: ModelConfig, grid: tuple[int, ...]):
        super().__init__()
        self.attn = Attention(cfg)
        self.conv = GridConv(cfg, grid) if cfg.conv else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.attn(x)
        return out + self.conv(x) if self.conv is not None else out


class ResidualScaling(nn.Module):
    """FPRM's tied residual scalars (methods.md section 2), per channel, as sigmoids of learned logits.

    b2 = 1 - a2 * a1^(2L);  b1 = b2 * (1 - a1) / (1 - a1^(2L)). With 0 <= a1, a2 < 1 and a bounded sublayer
    output the iterates stay bounded (FPRM Thm 1). No weight decay on them (FPRM).
    """

    no_weight_decay = True  # read by Reasoner.param_groups

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_sub = 2 * cfg.n_layers
        self.a1_logit = nn.Parameter(torch.full((cfg.hidden,), logit(cfg.a1_init)))
        self.a2_logit = nn.Parameter(torch.full((cfg.hidden,), logit(cfg.a2_init)))

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        a1 = torch.sigmoid(self.a1_logit)
        a2 = torch.sigmoid(self.a2_logit)
        a1_pow = a1.pow(self.n_sub)
        b2 = 1 - a2 * a1_pow
        b1 = b2 * (1 - a1) / (1 - a1_pow).clamp_min(1e-6)
        return a1, b1, a2, b2


class Block(nn.Module):
    """f_theta: n_layers x (mixer, SwiGLU), with the configured norm placement / residual scaling. grid: the task's
    token grid for the conv, (rows, cols) or (length,)."""

    def __init__(self, cfg: ModelConfig, grid: tuple[int, ...]):
        super().__init__()
        self.cfg = cfg
        self.sublayers = nn.ModuleList()
        for _ in range(cfg.n_layers):
            self.sublayers.append(Mixer(cfg, grid))
            self.sublayers.append(SwiGLU(cfg))
        self.scaling = ResidualScaling(cfg) if cfg.residual_scaling else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.scaling is not None:
            a1, b1, _, _ = self.scaling.coefficients()
            a1, b1 = a1.to(h.dtype), b1.to(h.dtype)
            for sub in self.sublayers:
                h = a1 * h + b1 * sub(rms_norm(h))
        elif self.cfg.norm == "pre":
            for sub in self.sublayers:
                h = h + sub(rms_norm(h))
        else:
            for sub in self.sublayers:
                h = rms_norm(h + sub(h))
        return h
