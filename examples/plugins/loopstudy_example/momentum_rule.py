"""The momentum carry rule: a heavy-ball step towards each new candidate.

    v_t = mu v_{t-1} + (z_t - h_{t-1});   h_t = h_{t-1} + v_t        (v_0 = 0; mu = 0: h_t = z_t, carry-last)

Under FPRM's damping (eta, when halting runs FPOpt) the step is scaled: h_t = h_{t-1} + eta v_t.
"""

import torch

from study.models.carry import CarryRule, CarryState


class Momentum(CarryRule):
    def __init__(self, d: int, cfg):
        super().__init__(d, cfg)
        self.mu = cfg.settings_of("momentum").mu

    def start(self, h0: torch.Tensor) -> CarryState:
        return CarryState(h0, {"v": torch.zeros_like(h0)})

    def step(self, state: CarryState, z: torch.Tensor, eta: torch.Tensor | None = None, *,
             in_place: bool = False) -> CarryState:
        v = self.mu * state.aux["v"] + (z - state.h)
        if eta is not None:
            v = eta.to(z.dtype).view(-1, *([1] * (z.dim() - 1))) * v
        return CarryState(state.h + v, {"v": v})
