"""Reasoners: exact layer accounting, truncated gradient, per-axis InfiLoop parameters, every combination runs."""

import itertools

import pytest
import torch

from study.models import CarryConfig, HaltingConfig, ModelConfig, build_reasoner
from study.models.carry import infiloop_scan
from study.tasks import TaskSpec

SMALL = dict(hidden=16, heads=2, n_layers=2, H=2, L=2)


def small(kind="nested", rule="infiloop", placement="both", **kw):
    cfg = ModelConfig(kind=kind, carry=CarryConfig(rule=rule, placement=placement), **{**SMALL, **kw})
    torch.manual_seed(0)
    return build_reasoner(cfg, TaskSpec("test", 6, 16, (4, 4)))


def count_block_calls(model):
    calls = []
    model.block.register_forward_hook(lambda m, i, o: calls.append(torch.is_grad_enabled()))
    return calls


def test_nested_layers_per_outer_cycle_is_l_plus_one_times_n_layers():
    for L, n in [(1, 1), (6, 2), (12, 2), (3, 4)]:
        cfg = ModelConfig(L=L, n_layers=n, hidden=16, heads=2)
        assert cfg.layers_per_step == (L + 1) * n
    model = small(L=3)
    calls = count_block_calls(model)
    state = model.rollout(torch.zeros(2, 16, dtype=torch.long), n_steps=5)
    assert len(calls) == 5 * (3 + 1)
    assert int(state.halt.eff_layers[0]) == 5 * model.layers_per_step == 5 * (3 + 1) * 2


def test_24960_layers_is_a_whole_number_of_outer_cycles_for_h6_l12():
    cfg = ModelConfig(H=6, L=12, n_layers=2)
    assert cfg.layers_per_step == 26
    assert [cfg.steps_for_depth(d) for d in (468, 936, 1872, 3744, 24960)] == [18, 36, 72, 144, 960]


def test_depth_not_a_whole_number_of_cycles_names_nearest_valid_depths():
    cfg = ModelConfig(H=6, L=12, n_layers=2)
    with pytest.raises(ValueError, match=r"eval.depths=470.*nearest valid depths: \[468, 494\]"):
        cfg.steps_for_depth(470, "eval.depths")
    with pytest.raises(ValueError, match=r"\[26\]"):
        cfg.steps_for_depth(10)


def test_training_runs_all_but_the_last_outer_cycle_without_gradient():
    model = small(H=4, L=3)
    calls = count_block_calls(model)
    x = model.embed(torch.zeros(2, 16, dtype=torch.long))
    state = model.update(x, model.init_state(x))
    per_cycle = 3 + 1
    assert calls == [False] * (3 * per_cycle) + [True] * per_cycle
    model.logits(state).sum().backward()
    assert model.block.sublayers[0].attn.qkv.weight.grad is not None


@pytest.mark.parametrize("placement", ["none", "inner", "outer", "both"])
def test_q_and_beta_get_gradient_exactly_on_the_infiloop_axes(placement):
    model = small(placement=placement)
    tokens = torch.randint(0, 6, (2, 16), generator=torch.Generator().manual_seed(1))
    x = model.embed(tokens)
    state = model.update(x, model.init_state(x))
    model.logits(state).square().mean().backward()
    for axis in ("inner", "outer"):
        rule = getattr(model, f"carry_{axis}")
        expect = placement in (axis, "both")
        assert (rule.name == "infiloop") == expect
        if expect:
            assert rule.q.grad is not None and float(rule.q.grad.abs().sum()) > 0
            assert rule.log_beta.grad is not None and float(rule.log_beta.grad.abs()) > 0
        else:
            assert not list(rule.parameters())


def test_reasoner_infiloop_axis_matches_reference_scan_over_its_candidates():
    model = small(kind="flat", rule="infiloop")
    with torch.no_grad():
        model.carry_outer.q.normal_()
    cands = []
    model.block.register_forward_hook(lambda m, i, o: cands.append(o.detach()))
    tokens = torch.randint(0, 6, (2, 16), generator=torch.Generator().manual_seed(2))
    hs = []
    model.rollout(tokens, 12, on_step=lambda s: hs.append(s.outer.h))
    z = torch.stack(cands)  # flat without scaling: each block output f(z + x) is the axis's candidate
    ref, _ = infiloop_scan(z, model.carry_outer.q.detach(), model.carry_outer.beta)
    torch.testing.assert_close(torch.stack(hs), ref, atol=1e-5, rtol=1e-5)


COMBOS = [
    (kind, rule, placement)
    for kind, rule, placement in itertools.product(
        ["nested", "flat"], ["carry_last", "infiloop", "full_attnres", "damped"], ["none", "inner", "outer", "both"]
    )
    if kind == "nested" or placement == "both"
]


@pytest.mark.parametrize("kind,rule,placement", COMBOS)
def test_every_rule_placement_and_reasoner_runs_forward_and_backward(kind, rule, placement):
    extra = {"norm": "pre", "residual_scaling": True} if kind == "flat" else {}
    cfg = ModelConfig(kind=kind, carry=CarryConfig(rule=rule, placement=placement),
                      halting=HaltingConfig(enabled=True), **{**SMALL, **extra})
    model = build_reasoner(cfg, TaskSpec("test", 6, 16, (4, 4)))
    tokens = torch.randint(0, 6, (3, 16))
    x = model.embed(tokens)
    state = model.update(x, model.init_state(x))
    state = model.update(x, state.detach())
    loss = torch.nn.functional.cross_entropy(model.logits(state).flatten(0, 1), tokens.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    # every weight of the block, the head and the embedding takes part in the last step: each gets a finite gradient
    for name, p in [*model.block.named_parameters(), *model.head.named_parameters(), ("tok", model.tok.weight)]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_paper_configuration_has_about_6_83m_parameters():
    cfg = ModelConfig(hidden=512, heads=8, n_layers=2, expansion=4.0, H=6, L=12,
                      carry=CarryConfig(rule="infiloop", placement="both"))
    with torch.device("meta"):
        model = build_reasoner(cfg, TaskSpec("test", 11, 81, (9, 9)))
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - 6.83e6) / 6.83e6 < 0.07, n
    # InfiLoop adds d + 1 parameters per axis
    assert sum(p.numel() for p in model.carry_inner.parameters()) == 512 + 1


def test_sequence_grid_uses_a_1d_conv():
    cfg = ModelConfig(hidden=16, heads=2, n_layers=1, H=1, L=1)
    model = build_reasoner(cfg, TaskSpec("test", 10, 12, (12,)))
    state = model.rollout(torch.randint(0, 10, (2, 12)), 2)
    assert model.logits(state).shape == (2, 12, 10)


@pytest.mark.parametrize(
    "kw,field",
    [({"kind": "deep"}, "kind"), ({"grad_steps": 5, "H": 2}, "grad_steps"), ({"a1_init": 1.0}, "a1_init"),
     ({"hidden": 10, "heads": 4}, "hidden"), ({"residual_scaling": True, "norm": "post"}, "residual_scaling")],
)
def test_bad_model_config_is_refused_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kw)


@pytest.mark.parametrize("kind", ["nested", "flat"])
def test_once_every_sample_halted_steps_run_no_block_and_change_nothing(kind):
    # tau far above any relative residual: every sample halts on its first step
    model = small(kind=kind, rule="damped" if kind == "flat" else "infiloop",
                  halting=HaltingConfig(enabled=True, tau=1e6)).eval()
    tokens = torch.randint(0, 6, (3, 16))
    calls = count_block_calls(model)
    after_one = model.rollout(tokens, 1)
    per_step = len(calls)
    after_many = model.rollout(tokens, 50)
    assert len(calls) == 2 * per_step  # the second rollout's 49 later steps ran no block
    assert after_many.steps == 50
    torch.testing.assert_close(after_many.outer.h, after_one.outer.h)
    assert after_many.halt.eff_layers.tolist() == [model.layers_per_step] * 3
