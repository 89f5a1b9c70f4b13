"""RoPE's fused CPU pass (rope_kernel.py): bit for bit block.py's `rotate` on queries and keys, in its layout, in
every dtype a model runs in; used only where no gradient is recorded."""

import math

import pytest
import torch

import study.models.block as block
from study.models.block import rope_tables, rotate
from study.models.rope_kernel import fused_rope_qk


def projection(B, S, heads, hd, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, S, 3 * heads * hd, generator=g, dtype=torch.float64) * 4).to(dtype)


def eager_qk(qkv, heads, cos, sin):
    B, S, width = qkv.shape
    q, k, _ = qkv.view(B, S, 3, heads, width // (3 * heads)).permute(2, 0, 3, 1, 4)
    return rotate(q, cos, sin), rotate(k, cos, sin)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("B,S,heads,hd", [(3, 97, 8, 64), (2, 17, 3, 10), (1, 7, 2, 6)])  # 10, 6: half not a vector
def test_the_fused_pass_is_rotate_bit_for_bit_in_its_layout(dtype, B, S, heads, hd):
    qkv = projection(B, S, heads, hd, dtype)
    cos, sin = rope_tables(S, hd, torch.device("cpu"))
    got = fused_rope_qk(qkv, cos, sin, heads)
    assert got is not None, "the fused kernels did not build here"
    for a, b in zip(got, eager_qk(qkv, heads, cos, sin), strict=True):
        assert a.dtype == dtype and a.shape == (B, heads, S, hd)
        assert a.stride() == b.stride()  # attention reads the same strides either way
        assert torch.equal(a, b)


def test_non_finite_projections_round_as_torch_rounds_them():
    qkv = projection(2, 9, 2, 8, torch.bfloat16, seed=1)
    qkv[0, 0, :3] = torch.tensor([math.nan, math.inf, -math.inf])
    qkv[1, 4, 8:10] = torch.tensor([3.0e38, -3.0e38])  # products overflow float32's range in the sum
    cos, sin = rope_tables(9, 8, torch.device("cpu"))
    for a, b in zip(fused_rope_qk(qkv, cos, sin, 2), eager_qk(qkv, 2, cos, sin), strict=True):
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def test_the_fused_pass_is_not_used_where_a_gradient_is_recorded():
    qkv = projection(1, 5, 2, 4, torch.float32).requires_grad_()
    cos, sin = rope_tables(5, 4, torch.device("cpu"))
    assert fused_rope_qk(qkv, cos, sin, 2) is None
    with torch.no_grad():
        assert fused_rope_qk(qkv, cos, sin, 2) is not None
    assert fused_rope_qk(qkv.detach().half(), cos, sin, 2) is None  # a dtype the pass does not take: eager


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_reading_through_the_fused_pass_is_bitwise_the_eager_one(dtype, monkeypatch):
    """A RoPE model (TRM-Att's layout) read without gradient: every outer state the same bits either way."""
    from study.config import ModelConfig
    from study.models import build_reasoner
    from study.models.precision import reading_model
    from study.tasks import TaskSpec

    torch.manual_seed(0)
    cfg = ModelConfig(hidden=32, heads=4, n_layers=2, H=2, L=2, norm="post", conv=False, pos="rope",
                      init="trunc_lecun", init_states="fixed", head_norm=False, puzzle_prefix=4, q_head=True)
    model = reading_model(build_reasoner(cfg, TaskSpec("sudoku", 6, 16, (4, 4))).eval(), "cpu", dtype)
    tokens = torch.randint(0, 6, (5, 16))
    runs = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(block, "fused_rope_qk", lambda *args: None)  # the eager rotate
        seen = []
        with torch.no_grad():
            model.rollout(tokens, 4, on_step=lambda st, seen=seen: seen.append((st.inner.h.clone(),
                                                                               st.outer.h.clone())))
        runs.append(seen)
    for (fi, fo), (ei, eo) in zip(*runs, strict=True):
        assert torch.equal(fi, ei) and torch.equal(fo, eo)


def test_a_compiled_reading_step_is_one_graph_the_fused_kernels_step_aside():
    """eval.compile: under torch.compile the fused kernels (RoPE's, and InfiLoop's step) leave the eager ops to the
    compiler, so an InfiLoop TRM-Att step compiles as one graph (a call out of it would break the graph)."""
    from study.config import CarryConfig, ModelConfig
    from study.models import build_reasoner
    from study.models.precision import reading_model
    from study.tasks import TaskSpec

    torch.manual_seed(0)
    cfg = ModelConfig(hidden=32, heads=4, n_layers=1, H=2, L=2, norm="post", conv=False, pos="rope",
                      init="trunc_lecun", init_states="fixed", head_norm=False, puzzle_prefix=4, q_head=True,
                      carry=CarryConfig(rule="infiloop", placement="both"))
    model = reading_model(build_reasoner(cfg, TaskSpec("sudoku", 6, 16, (4, 4))).eval(), "cpu", "fp32")
    tokens = torch.randint(0, 6, (3, 16))
    with torch.no_grad():
        x = model.embed(tokens)
        want = model.step(model.init_state(x), x)
        got = torch.compile(model.step, fullgraph=True)(model.init_state(x), x)
    torch.testing.assert_close(got.outer.h, want.outer.h, atol=1e-4, rtol=1e-4)
