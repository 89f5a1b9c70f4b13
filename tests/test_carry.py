"""Carry rules: InfiLoop's streaming recursion is exact, bounded, finite and O(d); full_attnres grows."""

import math
import os
import subprocess
import sys

import pytest
import torch

from study.config import CarryConfig
from study.models.block import RMS_EPS, rms_norm
from study.models.carry import FullAttnRes, InfiLoop, infiloop_scan, infiloop_update_eager
from study.models.infiloop_kernel import fused_step


def explicit_weighted_sum(z, q, beta, clip=8.0):
    """h_t = sum_i softmax_i(s_i - lambda (t - i)) z_i, computed directly over all past candidates."""
    s = (rms_norm(z) * q).sum(-1).clamp(max=clip)  # (T, ...)
    lam = -math.log(beta)
    out = []
    for t in range(z.shape[0]):
        i = torch.arange(t + 1, dtype=z.dtype)
        logits = s[: t + 1] - lam * (t - i).view(-1, *([1] * (s.dim() - 1)))
        w = logits.softmax(0).unsqueeze(-1)
        out.append((w * z[: t + 1]).sum(0))
    return torch.stack(out)


@pytest.mark.parametrize("beta", [0.1, 0.55, 1.0, 1.82])
def test_infiloop_scan_equals_explicit_decayed_softmax_sum(beta):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(40, 3, 5, 16, generator=g, dtype=torch.float64)
    q = torch.randn(16, generator=g, dtype=torch.float64)
    h, gamma = infiloop_scan(z, q, beta)
    torch.testing.assert_close(h, explicit_weighted_sum(z, q, beta), atol=1e-5, rtol=0)
    assert bool((gamma > 0).all()) and bool((gamma <= 1).all())
    # convex hull: the state's norm never exceeds the largest candidate norm seen so far
    run_max = z.norm(dim=-1).cummax(0).values
    assert bool((h.norm(dim=-1) <= run_max + 1e-9).all())


def test_infiloop_stays_finite_over_24960_steps_with_reverse_decay_at_the_clip():
    d = 8
    z = torch.randn(24960, 2, d)
    q = torch.full((d,), 100.0)  # scores far above the cap: every s_t is clipped to 8.0
    h, gamma = infiloop_scan(z, q, 1.82)
    assert torch.isfinite(h).all() and torch.isfinite(gamma).all()
    assert bool((gamma <= 1).all()) and bool((gamma >= 0).all())


def test_infiloop_module_matches_reference_scan():
    torch.manual_seed(0)
    cfg = CarryConfig(rule="infiloop", beta_init=0.55)
    rule = InfiLoop(16, cfg)
    with torch.no_grad():
        rule.q.normal_()
    z = torch.randn(30, 2, 4, 16)
    state = rule.start(torch.zeros(2, 4, 16))
    hs = []
    for t in range(30):
        state = rule.step(state, z[t])
        hs.append(state.h)
    ref, _ = infiloop_scan(z, rule.q.detach(), 0.55)
    torch.testing.assert_close(torch.stack(hs).detach(), ref, atol=1e-5, rtol=1e-5)


def state_numel(state):
    return state.h.numel() + sum(v.numel() for v in state.aux.values())


def run_rule(rule, steps, d=8):
    state = rule.start(torch.zeros(1, 2, d))
    with torch.no_grad():
        for _ in range(steps):
            state = rule.step(state, torch.randn(1, 2, d))
    return state


def test_infiloop_state_size_is_constant_in_depth_and_full_attnres_grows():
    cfg = CarryConfig(rule="infiloop")
    inf = InfiLoop(8, cfg)
    assert state_numel(run_rule(inf, 10)) == state_numel(run_rule(inf, 10_000))
    full = FullAttnRes(8, CarryConfig(rule="full_attnres"))
    small, big = state_numel(run_rule(full, 10)), state_numel(run_rule(full, 1000))
    assert big > 50 * small


def test_infiloop_gradients_are_finite_from_the_first_step():
    rule = InfiLoop(8, CarryConfig(rule="infiloop"))
    state = rule.start(torch.zeros(2, 3, 8))
    for _ in range(5):
        state = rule.step(state, torch.randn(2, 3, 8))
    state.h.sum().backward()
    assert torch.isfinite(rule.q.grad).all() and torch.isfinite(rule.log_beta.grad)
    assert rule.log_beta.grad != 0


@pytest.mark.parametrize(
    "field,value,allowed",
    [("rule", "carry_first", "carry_last"), ("placement", "middle", "both"), ("beta_init", 0.0, "> 0"),
     ("beta_init", -1.0, "> 0")],
)
def test_bad_carry_config_names_field_value_and_allowed(field, value, allowed):
    with pytest.raises(ValueError) as e:
        CarryConfig(**{field: value})
    msg = str(e.value)
    assert field in msg and str(value) in msg and allowed in msg


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("content_score", [True, False])
def test_fused_cpu_step_matches_the_eager_ops(dtype, content_score):
    """The fused kernel (rollouts without gradient) against the differentiable ops, over accumulators from the first
    step (-inf) to far above and below the score, and betas on both sides of 1."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 9, 48, generator=g, dtype=dtype) * 3
    h = torch.randn(6, 9, 48, generator=g, dtype=dtype)
    log_d = torch.empty(6, 9, 1, dtype=dtype).uniform_(-40, 40, generator=g)
    log_d[0] = -math.inf
    q = torch.randn(48, generator=g, dtype=dtype) if content_score else None
    for beta in (0.3, 1.0, 1.82):
        log_beta = torch.tensor(math.log(beta), dtype=dtype)
        fused = fused_step(h, log_d, z, q, log_beta, 2.0, RMS_EPS)
        assert fused is not None, "the fused kernel did not build here"
        eager = infiloop_update_eager(h, log_d, z, q, log_beta, 2.0)
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        for got, want in zip(fused[:4], eager, strict=True):
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("d", [48, 37])  # 37: the rows' tail past the last whole vector of 8
def test_a_bf16_candidate_beside_float32_states_is_widened_exactly_as_it_is_read(d):
    """A bf16 reading hands the fused step a bf16 z and float32 states: the result is the float32 step's on the
    widened z (bf16 -> float32 is exact), the states stay float32, and in place works the same."""
    g = torch.Generator().manual_seed(2)
    z = (torch.randn(6, 9, d, generator=g) * 3).bfloat16()
    h = torch.randn(6, 9, d, generator=g)
    log_d = torch.empty(6, 9, 1).uniform_(-40, 40, generator=g)
    log_d[0] = -math.inf
    q, log_beta = torch.randn(d, generator=g), torch.tensor(math.log(0.7))
    got = fused_step(h, log_d, z, q, log_beta, 2.0, RMS_EPS)
    assert got is not None and got[0].dtype == torch.float32
    want = fused_step(h, log_d, z.float(), q, log_beta, 2.0, RMS_EPS)
    for a, b in zip(got[:4], want[:4], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    eager = infiloop_update_eager(h, log_d, z.float(), q, log_beta, 2.0)
    for a, b in zip(got[:4], eager, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    in_place = fused_step(h.clone(), log_d.clone(), z, q, log_beta, 2.0, RMS_EPS, True)
    torch.testing.assert_close(in_place[0], got[0], atol=0, rtol=0)
    assert fused_step(h.double(), log_d.double(), z, q.double(), log_beta.double(), 2.0, RMS_EPS) is None


def test_the_fused_step_in_place_writes_the_same_values_over_its_inputs():
    g = torch.Generator().manual_seed(1)
    z, h = torch.randn(4, 5, 32, generator=g), torch.randn(4, 5, 32, generator=g)
    log_d, q, log_beta = torch.randn(4, 5, 1, generator=g), torch.randn(32, generator=g), torch.tensor(-0.2)
    want = fused_step(h, log_d, z, q, log_beta, 8.0, RMS_EPS)
    got = fused_step(h, log_d, z, q, log_beta, 8.0, RMS_EPS, True)
    assert got[0] is h and got[1] is log_d  # written over the previous state
    for a, b in zip(got[:4], want[:4], strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_a_nested_rollout_with_in_place_inner_steps_matches_the_eager_one_and_leaves_earlier_states_alone():
    """Without gradient the inner loop's own states are overwritten by the fused step (in_place); the states a
    rollout hands out (one per outer step) must not change afterwards, and the numbers must be the eager ones."""
    from study.models import ModelConfig, build_reasoner
    from study.tasks import TaskSpec

    torch.manual_seed(0)
    cfg = ModelConfig(hidden=32, heads=2, n_layers=1, H=2, L=4, carry=CarryConfig(rule="infiloop", placement="both"))
    model = build_reasoner(cfg, TaskSpec("sudoku", 6, 16, (4, 4)))
    with torch.no_grad():
        torch.nn.init.normal_(model.carry_inner.q)  # a content score that is not zero
    tokens = torch.randint(0, 6, (3, 16))
    seen = []
    model.rollout(tokens, 3, on_step=lambda st: seen.append((st, st.inner.h.clone(), st.outer.h.clone())))
    for st, inner, outer in seen:  # each outer step's state, as it was handed out
        assert torch.equal(st.inner.h, inner) and torch.equal(st.outer.h, outer)
    x = model.embed(tokens)  # with gradient: the eager ops, out of place
    state = model.init_state(x)
    for _ in range(3):
        state = model.step(state, x)
    torch.testing.assert_close(seen[-1][0].inner.h, state.inner.h.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seen[-1][0].outer.h, state.outer.h.detach(), atol=1e-5, rtol=1e-5)


def test_the_fused_step_is_not_used_where_a_gradient_is_recorded():
    z = torch.randn(2, 3, 8, requires_grad=True)
    args = (torch.zeros(2, 3, 8), torch.zeros(2, 3, 1), z, None, torch.tensor(0.0), 8.0, RMS_EPS)
    assert fused_step(*args) is None
    with torch.no_grad():
        assert fused_step(*args) is not None


def test_without_a_compiler_the_step_warns_once_and_stays_eager(tmp_path):
    code = ("import warnings, torch\n"
            "from study.models.carry import infiloop_scan\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    h, _ = infiloop_scan(torch.randn(5, 2, 8), torch.randn(8), 0.5)\n"
            "print(len([x for x in w if 'could not be built' in str(x.message)]), bool(torch.isfinite(h).all()))\n")
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "LOOPSTUDY_KERNEL_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "True"]


@pytest.mark.parametrize("z_dtype,addend_dtype,state_dtype", [
    (torch.bfloat16, torch.float32, torch.float32),   # a bf16 reading, InfiLoop on both axes
    (torch.bfloat16, torch.bfloat16, torch.float32),  # ... carry-last on the outer axis (a bf16 y)
    (torch.float32, torch.float32, torch.float32),
    (torch.float64, torch.float64, torch.float64),
])
@pytest.mark.parametrize("d", [48, 37])
def test_the_fused_step_writes_the_next_input_as_torch_sums_and_rounds_it(z_dtype, addend_dtype, state_dtype, d):
    """The next block's input from the fused pass is, bit for bit, `(h + addend).to(z.dtype)` in PyTorch's own ops
    (round to nearest even into bf16; a NaN stays a NaN), in place or not; the states are the step's without it."""
    g = torch.Generator().manual_seed(3)
    z = (torch.randn(6, 9, d, generator=g, dtype=torch.float64) * 3).to(z_dtype)
    h = torch.randn(6, 9, d, generator=g, dtype=torch.float64).to(state_dtype)
    addend = (torch.randn(6, 9, d, generator=g, dtype=torch.float64) * 5).to(addend_dtype)
    addend[0, 0, :3] = torch.tensor([math.nan, math.inf, -math.inf], dtype=addend_dtype)
    log_d = torch.empty(6, 9, 1, dtype=state_dtype).uniform_(-40, 40, generator=g)
    q, log_beta = torch.randn(d, generator=g, dtype=state_dtype), torch.tensor(math.log(0.7), dtype=state_dtype)
    without = fused_step(h, log_d, z, q, log_beta, 2.0, RMS_EPS)
    assert without is not None and without[4] is None
    for in_place in (False, True):
        got = fused_step(h.clone(), log_d.clone(), z, q, log_beta, 2.0, RMS_EPS, in_place, addend)
        assert got[4].dtype == z_dtype
        want = (got[0] + addend).to(z_dtype)
        assert torch.equal(got[4].isnan(), want.isnan())
        assert torch.equal(got[4].nan_to_num(0.0), want.nan_to_num(0.0))  # NaN-free parts, bit for bit
        for a, b in zip(got[:4], without[:4], strict=True):
            assert torch.equal(a, b)


def test_a_reading_with_the_fused_next_input_is_bitwise_the_one_with_step_and_sum():
    """A bf16 reading of an InfiLoop model (both axes; HRM's own H block too) through `step_and_input`'s fused
    pass gives, at every outer step, bit for bit the states the rule's default (`step`, then the sum) gives."""
    from study.models import ModelConfig, build_reasoner
    from study.models.carry import CarryRule
    from study.models.precision import reading_model
    from study.tasks import TaskSpec

    class StepThenSum(InfiLoop):  # InfiLoop without its fused next input: the contract's default
        step_and_input = CarryRule.step_and_input

    for h_layers in (None, 1):
        torch.manual_seed(0)
        cfg = ModelConfig(hidden=32, heads=2, n_layers=1, H=2, L=3, h_layers=h_layers,
                          carry=CarryConfig(rule="infiloop", placement="both"))
        model = build_reasoner(cfg, TaskSpec("sudoku", 6, 16, (4, 4))).eval()
        with torch.no_grad():
            torch.nn.init.normal_(model.carry_inner.q)
            torch.nn.init.normal_(model.carry_outer.q)
        tokens = torch.randint(0, 6, (5, 16))
        states = []
        for fused in (True, False):
            reading = reading_model(model, "cpu", "bf16")
            if not fused:
                reading.carry_inner.__class__ = StepThenSum
            seen = []
            with torch.no_grad():
                reading.rollout(tokens, 6, on_step=lambda st, seen=seen: seen.append((st.inner.h.clone(),
                                                                                       st.outer.h.clone())))
            states.append(seen)
        for (fi, fo), (ui, uo) in zip(*states, strict=True):
            assert fi.dtype == torch.float32 and torch.equal(fi, ui) and torch.equal(fo, uo)
