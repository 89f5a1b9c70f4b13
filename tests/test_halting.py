"""FPRM: residual scaling keeps iterates bounded; damping keeps fixed points; halting and effective layers."""

import pytest
import torch

from study.config import CarryConfig, HaltingConfig, ModelConfig
from study.models.block import Block
from study.models.carry import CarryState, Damped
from study.models.halting import advance_halting, relative_residual, start_halting


class BoundedSublayer(torch.nn.Module):
    """A sublayer whose output is bounded by C (|C tanh(.)| <= C) and pushes outward: the worst case of Thm 1."""

    def __init__(self, d, c=5.0):
        super().__init__()
        self.c = c
        self.w = torch.nn.Parameter(torch.randn(d, d))

    def forward(self, h):
        return self.c * torch.tanh(10 * h @ self.w)


def test_tied_residual_scaling_keeps_iterates_bounded_over_10000_iterations():
    torch.manual_seed(0)
    block = Block(ModelConfig(hidden=16, heads=2, n_layers=2, norm="pre", residual_scaling=True), grid=(2, 2))
    # a1, a2 are per channel: four channels each for (0.75, 0.25), (0.25, 0.75), (0, 0) and (0.99, 0.99)
    pairs = torch.tensor([(0.75, 0.25), (0.25, 0.75), (1e-6, 1e-6), (0.99, 0.99)]).repeat_interleave(4, 0)
    with torch.no_grad():
        block.scaling.a1_logit.copy_(torch.logit(pairs[:, 0]))
        block.scaling.a2_logit.copy_(torch.logit(pairs[:, 1]))
    # the real block's tied update a1 * h + b1 * sub(norm(h)) over bounded sublayers (|output| <= C = 5)
    block.sublayers = torch.nn.ModuleList(BoundedSublayer(16) for _ in block.sublayers)
    _, _, a2t, b2t = block.scaling.coefficients()
    x = torch.randn(1, 4, 16)
    z = 100 * torch.randn(1, 4, 16)  # start far out: scaling must pull it back, not just keep it
    # Thm 1: z' = a2 a1^(2L) z + a2 b2 U + b2 x with |U| <= C, and b2 = 1 - a2 a1^(2L): |z| -> a2 C + |x|
    bound = a2t * 5.0 + x.abs().amax()
    with torch.no_grad():
        for i in range(10_000):
            z = a2t * block(z) + b2t * x
            if i > 2_000:
                assert bool((z.abs().amax((0, 1)) <= bound + 1e-3).all()), i


def test_tied_residual_scaling_on_the_real_block_stays_bounded():
    torch.manual_seed(0)
    block = Block(ModelConfig(hidden=16, heads=2, n_layers=2, norm="pre", residual_scaling=True), grid=(2, 2))
    _, _, a2t, b2t = block.scaling.coefficients()
    x, z = torch.randn(1, 4, 16), torch.randn(1, 4, 16)
    with torch.no_grad():
        for _ in range(1_000):
            z = a2t * block(z) + b2t * x
    assert float(z.abs().max()) < 1e2


def test_unscaled_pre_norm_grows_without_bound_where_scaling_does_not():
    torch.manual_seed(0)
    plain = Block(ModelConfig(hidden=16, heads=2, n_layers=2, norm="pre"), grid=(2, 2))
    z = torch.randn(1, 4, 16)
    with torch.no_grad():
        for _ in range(200):
            z = plain(z)
    assert float(z.abs().max()) > 50


def test_damping_leaves_a_fixed_point_unchanged():
    rule = Damped(8, CarryConfig())
    h = torch.randn(3, 4, 8)
    state = CarryState(h)
    for eta in (1.0, 0.5, 0.01):
        out = rule.step(state, h.clone(), torch.full((3,), eta))  # z = f(h) = h: a fixed point
        torch.testing.assert_close(out.h, h)


def contraction_rollout(rate, cfg, layers_per_step=2, steps=400):
    """z <- rate * z: the fixed point is 0; relative residual = (1 - rate) / rate... on the scaled iterate."""
    z = torch.ones(2, 4)
    target = torch.full((2, 4), 3.0)
    st = start_halting(cfg, 2, "cpu")
    for _ in range(steps):
        new = target + rate * (z - target)  # contraction towards 3.0
        st = advance_halting(cfg, st, relative_residual(z, new), layers_per_step)
        z = torch.where(st.halted.view(-1, 1), z, new)
        if bool(st.halted.all()):
            break
    return st, z


def test_halting_stops_once_residual_below_tau_and_slower_contraction_runs_more_layers():
    cfg = HaltingConfig(enabled=True, tau=1e-3)
    fast, zf = contraction_rollout(0.5, cfg)
    slow, zs = contraction_rollout(0.9, cfg)
    assert bool(fast.halted.all()) and bool(slow.halted.all())
    assert bool((fast.residual < cfg.tau).all())
    assert int(slow.eff_layers[0]) > int(fast.eff_layers[0]) > 0
    assert float((zf - 3).abs().max()) < 1e-2


def test_fpopt_decays_eta_after_patience_without_improvement():
    cfg = HaltingConfig(enabled=False, tau=0.1, gamma=0.5, patience=3)
    st = start_halting(cfg, 1, "cpu")
    for _ in range(7):  # residual stuck at 1.0 >= tau: improves once, then stalls
        st = advance_halting(cfg, st, torch.ones(1), 2)
    assert float(st.eta) == pytest.approx(0.25)
    assert not bool(st.halted.any()) and int(st.eff_layers) == 14


@pytest.mark.parametrize("field,value", [("tau", 0.0), ("tau", -0.1), ("gamma", 1.5), ("patience", 0)])
def test_bad_halting_config_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        HaltingConfig(**{field: value})


@pytest.mark.parametrize("field,value", [("a1_init", 1.0), ("a2_init", -0.1), ("a1_init", 1.5)])
def test_residual_scalars_outside_unit_interval_are_refused(field, value):
    with pytest.raises(ValueError, match=rf"{field}.*\[0, 1\)"):
        ModelConfig(**{field: value})
