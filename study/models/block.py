"""The shared block f_theta (methods.md section 1).

One block = `n_layers` transformer layers. Each layer has two sublayers:
  1. token mixing (model.mixer): multi-head self-attention (with RoPE when model.pos is rope), plus a depthwise
     conv over the token grid (summed) when model.conv is on; or TRM-MLP's SwiGLU over the token axis,
  2. a SwiGLU MLP.
Norm placement is `post` (TRM/HRM: h = norm(h + sub(h))) or `pre` (FPRM: h = h + sub(norm(h))). With FPRM's tied
residual scaling (methods.md section 2) every sublayer update is h = a1 * h + b1 * sub(norm(h)), a1 and b1 shared
by all 2 * n_layers sublayers, and the flat reasoner mixes iterations with (a2, b2).

Each sublayer's norm runs over the axis of the features that sublayer acts on (its `norm_dim`): the channels for
attention and the channel SwiGLU; the positions for TRM-MLP's token SwiGLU, which TRM computes in the transposed
layout (B, D, L), norm included, so each channel is normalised over the positions (shared/spec/reference_models.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from study.config import ModelConfig
from study.models.rope_kernel import fused_rope_qk

RMS_EPS = 1e-5  # every RMSNorm of the model (the block's, the head's, the carry rules' scores)


def rms_norm(x: torch.Tensor, eps: float = RMS_EPS, dim: int = -1) -> torch.Tensor:
    """Weightless RMSNorm (as TRM) over axis `dim`; half precision is upcast to float32 for stability under bf16."""
    if dim % x.dim() != x.dim() - 1:
        return rms_norm(x.transpose(dim, -1), eps).transpose(dim, -1)
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return F.rms_norm(xf, (x.shape[-1],), eps=eps).to(x.dtype)


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """The dtype TRM's float32 parts (RoPE, the Q head) run in: float32, or float64 for a float64 model."""
    return torch.promote_types(dtype, torch.float32)


ROPE_THETA = 10_000.0  # TRM's and HRM's rope_theta


def swiglu_width(hidden: int, expansion: float, multiple: int | None = None) -> int:
    """TRM's SwiGLU width: 2/3 of expansion * hidden, rounded up to a multiple of `multiple` (TRM: 256 at every
    size; None: 256, or 16 below hidden 256, so small CPU models are not mostly padding)."""
    raw = round(expansion * hidden * 2 / 3)
    mult = multiple or (256 if hidden >= 256 else 16)
    return mult * math.ceil(raw / mult)


def rope_tables(n: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's (cos, sin) for positions 0..n-1, float32, (n, head_dim): inverse frequencies theta^(-2i/d), the
    angles repeated for both halves (shared/spec/reference_models.md)."""
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(n, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (.., seq, head_dim) rotated by position, "rotate half": halves (x1, x2) -> x cos + (-x2, x1) sin, in
    float32 (float64 for a float64 model; the tables hold float32 angles either way, as TRM's)."""
    xf = x.to(at_least_float32(x.dtype))
    cos, sin = cos.to(xf.dtype), sin.to(xf.dtype)
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


class Attention(nn.Module):
    """Non-causal multi-head attention; one projection to (queries, keys, values) in that order, head by head (the
    layout of TRM's qkv_proj with as many key-value heads as heads); RoPE on queries and keys when model.pos is rope."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.heads
        self.rope = cfg.pos == "rope"
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None  # RoPE's, for the last length and device

    def rope_tables(self, S: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tables is None or self._tables[0].shape[0] != S or self._tables[0].device != device:
            self._tables = rope_tables(S, head_dim, device)
        return self._tables

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        qkv = self.qkv(x)
        q, k, v = qkv.view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        if self.rope:
            cos, sin = self.rope_tables(S, D // self.heads, x.device)
            fused = fused_rope_qk(qkv, cos, sin, self.heads)  # a reading on the CPU: one pass, rotate's bits
            q, k = fused if fused is not None else (rotate(q, cos, sin), rotate(k, cos, sin))
        if torch.is_grad_enabled() and x.device.type == "cpu" and (  # a reading's no-grad step leaves at the first test
                v.dtype == torch.bfloat16 or torch.is_autocast_enabled("cpu")):
            # PyTorch's bf16 attention backward on the CPU takes several times float32's (at the showcase's size:
            # bench/precision.py, part 4; its forward alone is faster in bf16, so readings keep it): the bf16-rounded
            # inputs attended in float32, as flash attention accumulates them, and the output rounded to bf16
            with torch.autocast("cpu", enabled=False):
                y = F.scaled_dot_product_attention(*(t.to(torch.bfloat16).float() for t in (q, k, v)))
            y = y.to(torch.bfloat16)
        else:
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
    """silu(gate) * up, then down; one projection to (gate, up) in that order. width: the features it acts on."""

    def __init__(self, cfg: ModelConfig, width: int | None = None):
        super().__init__()
        d = width or cfg.hidden
        inner = swiglu_width(d, cfg.expansion, cfg.swiglu_multiple)
        self.gate_up = nn.Linear(d, 2 * inner, bias=False)
        self.down = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class TokenMLP(nn.Module):
    """TRM-MLP's token mixing: a SwiGLU over the token axis (its width: the sequence length, prefix included),
    computed in the transposed layout (B, D, L) and transposed back to (B, L, D)."""

    def __init__(self, cfg: ModelConfig, seq_len: int):
        super().__init__()
        self.seq_len = seq_len
        self.mlp = SwiGLU(cfg, width=seq_len)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.seq_len:
            raise ValueError(f"{x.shape[1]} positions, but model.mixer=mlp mixes exactly {self.seq_len}")
        return self.mlp(x.transpose(1, 2)).transpose(1, 2)


class Mixer(nn.Module):
    """Token-mixing sublayer: attention (plus the local depthwise conv with model.conv), or the token-axis MLP."""

    def __init__(self, cfg: ModelConfig, grid: tuple[int, ...], seq_len: int):
        super().__init__()
        # the axis of its norm: TRM-MLP normalises each channel over the positions (reference_models.md)
        self.norm_dim = 1 if cfg.mixer == "mlp" else -1
        self.attn = Attention(cfg) if cfg.mixer == "attention" else None
        self.token_mlp = TokenMLP(cfg, seq_len) if cfg.mixer == "mlp" else None
        self.conv = GridConv(cfg, grid) if cfg.conv else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.attn(x) if self.attn is not None else self.token_mlp(x)
        return out + self.conv(x) if self.conv is not None else out


def norm_dim(sub: nn.Module) -> int:
    """The axis of a sublayer's norm: the one it declares, else the channels."""
    return getattr(sub, "norm_dim", -1)


class ResidualScaling(nn.Module):
    """FPRM's tied residual scalars (methods.md section 2), per channel, as sigmoids of learned logits.

    b2 = 1 - a2 * a1^(2L);  b1 = b2 * (1 - a1) / (1 - a1^(2L)). With 0 <= a1, a2 < 1 and a bounded sublayer
    output the iterates stay bounded (FPRM Thm 1). No weight decay on them (FPRM).
    """

    no_weight_decay = True  # read by Reasoner.param_groups
    keeps_float32 = True  # a bf16 reading keeps them in float32 (study.models.precision)

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
    token grid for the conv, (rows, cols) or (length,); seq_len: the positions a token-axis MLP mixes."""

    def __init__(self, cfg: ModelConfig, grid: tuple[int, ...], seq_len: int = 0, n_layers: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.sublayers = nn.ModuleList()
        for _ in range(n_layers or cfg.n_layers):
            self.sublayers.append(Mixer(cfg, grid, seq_len))
            self.sublayers.append(SwiGLU(cfg))
        self.scaling = ResidualScaling(cfg) if cfg.residual_scaling else None
        # a weight whose dtype is the block's (held in a list, not registered twice; .to() converts it in place)
        self._dtype_of = [next(self.sublayers.parameters())]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # in the weights' dtype: a bf16 reading's carry rules hand back float32 accumulators (a no-op otherwise)
        h = h.to(self._dtype_of[0].dtype)
        if self.scaling is not None:
            a1, b1, _, _ = self.scaling.coefficients()
            a1, b1 = a1.to(h.dtype), b1.to(h.dtype)
            for sub in self.sublayers:
                h = a1 * h + b1 * sub(rms_norm(h, dim=norm_dim(sub)))
        elif self.cfg.norm == "pre":
            for sub in self.sublayers:
                h = h + sub(rms_norm(h, dim=norm_dim(sub)))
        else:
            for sub in self.sublayers:
                h = rms_norm(h + sub(h), dim=norm_dim(sub))
        return h
