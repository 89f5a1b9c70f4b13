"""Weight initialisation of the published reference models (TRM, HRM: shared/spec/reference_models.md).

`model.init: trunc_lecun` gives every linear layer a truncated LeCun normal (std 1 / sqrt(fan_in)) and the token
embedding a truncated normal of std 1 / sqrt(hidden); fixed initial states (`model.init_states: fixed`) are drawn
from the truncated normal of std 1. The truncated normal is JAX's: a standard normal cut to [-2, 2], rescaled so
that what is drawn has the std asked for (the cut alone leaves 0.88 of it).
"""

from __future__ import annotations

import math

import torch
from torch import nn

TRUNCATE_AT = 2.0  # in standard deviations of the underlying normal, either side


def truncated_std(bound: float = TRUNCATE_AT) -> float:
    """The std of a standard normal truncated to [-bound, bound]: sqrt(1 - 2 b phi(b) / Z), Z = erf(b / sqrt 2)."""
    z = math.erf(bound / math.sqrt(2))
    pdf = math.exp(-0.5 * bound * bound) / math.sqrt(2 * math.pi)
    return math.sqrt(1 - 2 * bound * pdf / z)


@torch.no_grad()
def trunc_normal_(tensor: torch.Tensor, std: float, bound: float = TRUNCATE_AT) -> torch.Tensor:
    """Fill `tensor` in place with a normal truncated at +-bound underlying stds whose own std is `std` (0: zeros).
    Drawn by inverting the normal's CDF over the uniform span between the bounds' CDF values."""
    if std == 0:
        return tensor.zero_()
    lo = math.erf(-bound / math.sqrt(2))
    scale = std / truncated_std(bound)
    tensor.uniform_(lo, -lo).erfinv_().mul_(math.sqrt(2) * scale)
    return tensor.clamp_(-bound * scale, bound * scale)


def trunc_lecun_(model: nn.Module) -> None:
    """Every nn.Linear of `model`: truncated LeCun normal weights, zero biases (TRM's CastedLinear)."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, 1 / math.sqrt(m.in_features))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
