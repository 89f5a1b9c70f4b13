"""Test-time compute of a reading: FLOPs per sample, counted once per model and input width.

`torch.utils.flop_counter.FlopCounterMode` counts the matrix multiplies, convolutions and attention of one sample's
embedding, readout and first three steps. A step's cost is affine in the step number for every carry rule (constant
for carry_last, infiloop and damped; full attention residuals score all t earlier candidates, so step t costs
a + b t), so three counted steps give the exact cost of any number of steps:

    flops(n steps) = readout + f_1 + (n - 1) f_2 + (f_3 - f_2) (n - 1)(n - 2) / 2

A sample's steps are the ones it actually ran (its executed layers / layers per step), so halting shows. Elementwise
work (norms, the carry rules' O(d) updates, halting bookkeeping) is not counted: at hidden d it is O(1/d) of a step.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from study.models.reasoner import Reasoner


def _counted(fn) -> tuple[int, object]:
    with FlopCounterMode(display=False) as counter:
        out = fn()
    return counter.get_total_flops(), out


class RolloutFlops:
    """FLOPs per sample of a rollout of `model`, counted on first use of each input width and kept."""

    def __init__(self, model: Reasoner):
        self.model = model
        self._counts: dict[int, tuple[int, int, int, int]] = {}

    @torch.no_grad()
    def counts(self, tokens: torch.Tensor) -> tuple[int, int, int, int]:
        """(readout, step 1, step 2, step 3) FLOPs of one sample shaped like a row of `tokens` (B, S)."""
        width = tokens.shape[1]
        if width not in self._counts:
            m = self.model
            one = tokens[:1]
            fixed, x = _counted(lambda: m.embed(one))
            state = m.init_state(x)
            steps = []
            for _ in range(3):
                f, state = _counted(lambda s=state: m.step(s, x))
                steps.append(f)
            readout, _ = _counted(lambda: m.logits(state))
            self._counts[width] = (fixed + readout, *steps)
        return self._counts[width]

    def per_sample(self, tokens: torch.Tensor, steps: np.ndarray) -> np.ndarray:
        """FLOPs of each sample of the batch `tokens` after running `steps` (B,) steps and reading out once."""
        readout, f1, f2, f3 = self.counts(tokens)
        n = np.asarray(steps, dtype=np.float64)
        ran = np.maximum(n - 1, 0)
        return np.where(n > 0, readout + f1 + ran * f2 + (f3 - f2) * ran * np.maximum(n - 2, 0) / 2, readout)
