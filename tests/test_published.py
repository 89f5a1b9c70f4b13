"""The published reference models (TRM-Att, TRM-MLP, HRM): their arithmetic pinned piece by piece against values
worked by hand, and a checkpoint in TRM's format (built here, every tensor random) read into loopstudy's reasoner,
whose logits equal a reference forward written in this file from shared/spec/reference_models.md."""

import math

import pytest
import scipy.stats
import torch
import torch.nn.functional as F
import yaml

from study.config import ModelConfig
from study.models.block import rope_tables, rotate, swiglu_width
from study.models.init import trunc_normal_, truncated_std
from study.models.reasoner import build_reasoner
from study.models.trm_checkpoint import (
    CheckpointError,
    loopstudy_name,
    published_keys,
    read_arch,
    read_tensors,
    shape_facts,
    to_state_dict,
)
from study.tasks.base import TaskSpec

ARCH_NAMES = {"trm": "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1",
              "hrm": "recursive_reasoning.hrm@HierarchicalReasoningModel_ACTV1"}


def test_rope_rotates_each_half_pair_by_its_position_times_its_frequency():
    d, pos = 8, 5
    x = torch.arange(1.0, d + 1)
    cos, sin = rope_tables(pos + 1, d, torch.device("cpu"))
    got = rotate(x.view(1, 1, d).expand(1, pos + 1, d), cos, sin)[0, pos]
    want = x.clone()
    for i in range(d // 2):  # "rotate half": dims i and i + d/2 form a pair, turned by pos * 10000^(-2i/d)
        angle = pos * 10000.0 ** (-2 * i / d)
        a, b = x[i].item(), x[i + d // 2].item()
        want[i] = a * math.cos(angle) - b * math.sin(angle)
        want[i + d // 2] = b * math.cos(angle) + a * math.sin(angle)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.equal(rotate(x.view(1, 1, d), cos[:1], sin[:1])[0, 0], x)  # position 0 is not turned


def test_the_truncated_normal_has_the_std_asked_for_and_stays_within_two_of_the_underlying():
    assert truncated_std() == pytest.approx(scipy.stats.truncnorm(-2, 2).std(), rel=1e-12)
    torch.manual_seed(0)
    x = trunc_normal_(torch.empty(1_000_000), std=0.25)
    assert x.std().item() == pytest.approx(0.25, rel=5e-3) and abs(x.mean().item()) < 1e-3
    assert x.abs().max().item() <= 2 * 0.25 / truncated_std() + 1e-6
    assert torch.equal(trunc_normal_(torch.ones(4), std=0), torch.zeros(4))


def test_the_swiglu_width_rounds_to_the_multiple_trm_uses():
    assert swiglu_width(512, 4, 256) == 1536 and swiglu_width(64, 4, 256) == 256  # TRM: 256 at every size
    assert swiglu_width(64, 4) == 176  # loopstudy's default below hidden 256: a multiple of 16
    assert swiglu_width(97, 4, 256) == 512  # TRM-MLP's token mixer on Sudoku: 81 cells + 16 prefix, 97 * 8/3 = 259


def published(kind="trm", mlp_t=False, hidden=16, prefix=4, vocab=11, seq=9, **over) -> tuple[ModelConfig, TaskSpec]:
    keys = dict(hidden=hidden, heads=2, n_layers=2, H=2, L=3, norm="post", conv=False,
                pos="none" if mlp_t else "rope", mixer="mlp" if mlp_t else "attention", swiglu_multiple=256,
                init="trunc_lecun", init_states="fixed", head_norm=False, puzzle_prefix=prefix, q_head=True,
                h_layers=3 if kind == "hrm" else None)
    cfg = ModelConfig(**{**keys, **over})
    return cfg, TaskSpec("sudoku", vocab, seq, (3, 3))


def test_the_puzzle_prefix_stands_before_the_tokens_and_the_logits_drop_it():
    cfg, task = published()
    model = build_reasoner(cfg, task).eval()
    with torch.no_grad():
        model.puzzle.weight.normal_()
    tokens = torch.randint(0, task.vocab, (3, task.seq_len))
    e = model.embed(tokens)
    scale = math.sqrt(cfg.hidden)
    assert e.shape == (3, cfg.puzzle_prefix + task.seq_len, cfg.hidden)
    assert torch.allclose(e[:, 0], scale * model.puzzle.weight[0].expand(3, -1))  # id 0: Sudoku's one puzzle
    assert torch.equal(e[:, 1:cfg.puzzle_prefix], torch.zeros_like(e[:, 1:cfg.puzzle_prefix]))
    assert torch.allclose(e[:, cfg.puzzle_prefix:], scale * model.tok(tokens))
    state = model.rollout(tokens, 1)
    assert model.logits(state).shape == (3, task.seq_len, task.vocab)
    halt, cont = model.q_logits(state)
    assert torch.equal(halt, torch.full((3,), -5.0)) and torch.equal(cont, torch.full((3,), -5.0))  # TRM's init


def test_fixed_initial_states_are_saved_buffers_not_trained():
    cfg, task = published()
    model = build_reasoner(cfg, task)
    names = {n for n, _ in model.named_parameters()}
    assert "y_init" not in names and "z_init" not in names
    assert {"y_init", "z_init"} <= set(model.state_dict())


def test_each_inner_update_reads_z_l_plus_the_sum_of_z_h_and_x_in_trms_order():
    """reference_models.md: z_L = module(z_L, z_H + x), the module adding its injection once. In float32 the order
    shows: (z_L + z_H) + x rounds differently from z_L + (z_H + x) in some elements of these random states."""
    cfg, task = published(L=3)
    model = build_reasoner(cfg, task).eval()
    tokens = torch.randint(0, task.vocab, (3, task.seq_len), generator=torch.Generator().manual_seed(0))
    x = model.embed(tokens)
    state = model.init_state(x)
    g = torch.Generator().manual_seed(1)
    state.outer.h.copy_(torch.randn(state.outer.h.shape, generator=g) * 3)
    state.inner.h.copy_(torch.randn(state.inner.h.shape, generator=g) / 3)
    seen = []
    hook = model.block.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
    with torch.no_grad():
        model.step(state, x)
    hook.remove()
    assert torch.equal(seen[0], state.inner.h + (state.outer.h + x))
    assert not torch.equal(seen[0], state.inner.h + state.outer.h + x)  # the order is visible at these values


# -- TRM-MLP's block: every norm axis and transpose -------------------------------------------------------------------
def trm_mlp_block(positions=7, hidden=5):
    """One TRM-MLP layer (token SwiGLU, then channel SwiGLU, post-norm) in float64, with TRM's init, and an input."""
    from study.models.block import Block

    cfg, _ = published(mlp_t=True, hidden=hidden, n_layers=1, heads=1)
    torch.manual_seed(0)
    block = Block(cfg, (positions,), positions).double()
    for w in block.parameters():  # weights at a scale that leaves every sum far from its norm's fixed point
        torch.nn.init.normal_(w, std=0.6)
    h = torch.randn(2, positions, hidden, dtype=torch.float64) * 3
    return block, h


def channel_swiglu_input(block, h):
    """What the channel SwiGLU receives: the token sublayer's normalised output."""
    seen = []
    handle = block.sublayers[1].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    out = block(h)
    handle.remove()
    return seen[0], out


def rms_over(x, dim):
    return x.square().mean(dim).sqrt()


def test_trm_mlps_token_sublayer_is_normalised_per_channel_over_the_positions():
    block, h = trm_mlp_block()
    mid, _ = channel_swiglu_input(block, h)
    assert torch.allclose(rms_over(mid, 1), torch.ones(2, 5, dtype=torch.float64), atol=1e-5)  # (B, D): all 1
    assert (rms_over(mid, 2) - 1).abs().max() > 0.05  # not per position over the channels


def test_trm_mlps_channel_sublayer_is_normalised_per_position_over_the_channels():
    block, h = trm_mlp_block()
    _, out = channel_swiglu_input(block, h)
    assert torch.allclose(rms_over(out, 2), torch.ones(2, 7, dtype=torch.float64), atol=1e-5)  # (B, L): all 1
    assert (rms_over(out, 1) - 1).abs().max() > 0.05


def test_trm_mlps_token_swiglu_mixes_positions_channel_by_channel():
    block, h = trm_mlp_block()
    token = block.sublayers[0]
    assert token.token_mlp.mlp.gate_up.in_features == 7  # the transpose in: its features are the positions
    perm = torch.tensor([3, 0, 4, 1, 2])
    # channels never meet: permuting them permutes the output alike (and the norm over positions keeps that)
    assert torch.allclose(token(h[:, :, perm]), token(h)[:, :, perm], atol=1e-12)
    mid, _ = channel_swiglu_input(block, h)
    mid_perm, _ = channel_swiglu_input(block, h[:, :, perm])
    assert torch.allclose(mid_perm, mid[:, :, perm], atol=1e-12)


def test_trm_mlps_token_swiglu_result_is_transposed_back_to_positions_by_channels():
    block, h = trm_mlp_block()
    out = block.sublayers[0](h)
    assert out.shape == h.shape  # (B, L, D) again
    one = torch.zeros_like(h)
    one[:, 2, :] = h[:, 2, :]  # only position 2 non-zero: a position feeds every position of its own channel
    col = block.sublayers[0].token_mlp.mlp(one[:, :, 1])  # channel 1 as a vector over the positions
    assert torch.allclose(block.sublayers[0](one)[:, :, 1], col, atol=1e-12)


def test_trm_mlps_layer_as_the_specs_text_words_it():
    """shared/spec/reference_models.md, worked here with plain loops (no transpose, no norm helper): "the attention
    sublayer is replaced by a SwiGLU over the token axis (its "hidden" is seq_len + puzzle_emb_len: transpose,
    h = norm(h + mlp_t(h)), transpose back) ... it normalises each channel over the L positions, not each position
    over the D channels"; then "the channel SwiGLU follows as usual": h = norm(h + mlp(h)) per position. RMSNorm
    without weight, eps 1e-5; SwiGLU: one projection to 2 * width, gate first, silu(gate) * up, down."""
    block, h = trm_mlp_block()
    tw = block.sublayers[0].token_mlp.mlp
    cw = block.sublayers[1]

    def swiglu(v, gate_up, down):
        g = gate_up.weight @ v
        w = g.shape[0] // 2
        return down.weight @ (g[:w] * torch.sigmoid(g[:w]) * g[w:])

    def norm(u):
        return u / math.sqrt(float((u * u).mean()) + 1e-5)

    B, L, D = h.shape
    want = torch.empty_like(h)
    with torch.no_grad():
        got = block(h)
    for b in range(B):
        mid = torch.empty(L, D, dtype=torch.float64)
        for c in range(D):  # the token sublayer, channel by channel, over the L positions
            v = h[b, :, c]
            mid[:, c] = norm(v + swiglu(v, tw.gate_up, tw.down)).detach()
        for pos in range(L):  # the channel sublayer, position by position, over the D channels
            v = mid[pos]
            want[b, pos] = norm(v + swiglu(v, cw.gate_up, cw.down)).detach()
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


# -- a checkpoint in TRM's format --------------------------------------------------------------------------------------
def trm_tensors(kind: str, mlp_t: bool, hidden: int, prefix: int, vocab: int, seq: int, layers: dict[str, int],
                expansion: float = 4.0, puzzles: int = 1) -> dict[str, torch.Tensor]:
    """Every tensor a TRM / HRM checkpoint of these sizes holds, random (shared/spec/reference_models.md)."""
    g = torch.Generator().manual_seed(1)

    def r(*shape, std=0.07):  # (layers this small keep the loop contracting: float32 rounding does not grow)
        return torch.randn(*shape, generator=g) * std

    def width(d):
        return swiglu_width(d, expansion, 256)

    t = {"H_init": r(hidden, std=1.0), "L_init": r(hidden, std=1.0), "lm_head.weight": r(vocab, hidden, std=0.3),
         "embed_tokens.embedding_weight": r(vocab, hidden, std=0.3), "q_head.weight": r(2, hidden, std=0.3),
         "q_head.bias": r(2), "puzzle_emb.weights": r(puzzles, hidden, std=0.3)}
    for level, n in layers.items():
        for i in range(n):
            p = f"{level}_level.layers.{i}."
            if mlp_t:
                t[p + "mlp_t.gate_up_proj.weight"] = r(2 * width(seq + prefix), seq + prefix)
                t[p + "mlp_t.down_proj.weight"] = r(seq + prefix, width(seq + prefix))
            else:
                t[p + "self_attn.qkv_proj.weight"] = r(3 * hidden, hidden)
                t[p + "self_attn.o_proj.weight"] = r(hidden, hidden)
            t[p + "mlp.gate_up_proj.weight"] = r(2 * width(hidden), hidden)
            t[p + "mlp.down_proj.weight"] = r(hidden, width(hidden))
    return t


def reference_logits(t, kind, mlp_t, heads, prefix, H, L, tokens, n_sup, with_q=False, dtype=torch.float32):
    """TRM's and HRM's forward as shared/spec/reference_models.md states it, on the raw tensors: the logits after
    each supervision step (with_q: (logits, the Q head's (halt, continue) logits) per step). dtype float64 reads
    the meaning with rounding gone (RoPE's tables still hold float32 angles, as TRM's buffers do)."""
    t = {k: v.to(dtype) for k, v in t.items()}
    B, S = tokens.shape
    d = t["embed_tokens.embedding_weight"].shape[1]

    def rms(h):  # over the last axis of the layout h is in
        return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-5)

    def swiglu(h, p):
        gate, up = (h @ t[p + "gate_up_proj.weight"].T).chunk(2, -1)
        return (F.silu(gate) * up) @ t[p + "down_proj.weight"].T

    hd = d // heads
    inv = 1.0 / 10000.0 ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.outer(torch.arange(S + prefix).float(), inv)
    cos, sin = torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype)

    def rot(x):  # x (B, S, heads, hd)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos[:, None] + torch.cat((-x2, x1), -1) * sin[:, None]

    def attention(h, p):
        qkv = (h @ t[p + "qkv_proj.weight"].T).view(B, S + prefix, 3 * heads, hd)
        q, k, v = rot(qkv[:, :, :heads]), rot(qkv[:, :, heads:2 * heads]), qkv[:, :, 2 * heads:]
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return y.transpose(1, 2).reshape(B, S + prefix, d) @ t[p + "o_proj.weight"].T

    def level(name, h, injection):
        h = h + injection
        i = 0
        while f"{name}_level.layers.{i}.mlp.down_proj.weight" in t:
            p = f"{name}_level.layers.{i}."
            if mlp_t:  # transpose to (B, D, L); the token SwiGLU and the norm there; transpose back
                ht = h.transpose(1, 2)
                h = rms(ht + swiglu(ht, p + "mlp_t.")).transpose(1, 2)
            else:
                h = rms(h + attention(h, p + "self_attn."))
            h = rms(h + swiglu(h, p + "mlp."))
            i += 1
        return h

    puzzle = torch.cat([t["puzzle_emb.weights"][torch.zeros(B, dtype=torch.long)],
                        torch.zeros(B, (prefix - 1) * d, dtype=dtype)], -1).view(B, prefix, d)
    x = math.sqrt(d) * torch.cat([puzzle, t["embed_tokens.embedding_weight"][tokens]], 1)
    zH = t["H_init"].expand(B, S + prefix, d)
    zL = t["L_init"].expand(B, S + prefix, d)
    out = []
    for _ in range(n_sup):
        for _ in range(H):
            for _ in range(L):
                zL = level("L", zL, zH + x)
            zH = level("H" if kind == "hrm" else "L", zH, zL)
        logits = (zH @ t["lm_head.weight"].T)[:, prefix:]
        out.append((logits, zH[:, 0] @ t["q_head.weight"].T + t["q_head.bias"]) if with_q else logits)
    return out


def write_checkpoint(folder, tensors, arch, compiled=True):
    folder.mkdir(parents=True, exist_ok=True)
    prefix = "_orig_mod.model.inner." if compiled else "model.inner."
    torch.save({prefix + k: v for k, v in tensors.items()}, folder / "step_1000")
    (folder / "all_config.yaml").write_text(yaml.safe_dump({"arch": arch, "lr": 1e-4}))
    return folder / "step_1000"


# float32 to 1e-4; float64, where rounding is gone and a difference of meaning shows at 1e-6 and above, to 1e-9
PRECISIONS = {"fp32": (torch.float32, 1e-4), "fp64": (torch.float64, 1e-9)}


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("kind,mlp_t", [("trm", False), ("trm", True), ("hrm", False)],
                         ids=["trm_att", "trm_mlp", "hrm"])
def test_a_trm_format_checkpoint_reads_into_the_reasoner_with_the_reference_logits(tmp_path, kind, mlp_t,
                                                                                   precision):
    hidden, heads, vocab, seq, H, L = 16, 2, 11, 9, 2, 3
    prefix = 4 if kind == "trm" else 1
    layers = {"L": 2, "H": 3} if kind == "hrm" else {"L": 2}
    tensors = trm_tensors(kind, mlp_t, hidden, prefix, vocab, seq, layers)
    arch = {"name": ARCH_NAMES[kind], "hidden_size": hidden, "num_heads": heads, "expansion": 4,
            "H_cycles": H, "L_cycles": L, "L_layers": 2, "H_layers": 3 if kind == "hrm" else 0,
            "pos_encodings": "none" if mlp_t else "rope", "puzzle_emb_ndim": hidden, "mlp_t": mlp_t,
            "halt_max_steps": 16, "halt_exploration_prob": 0.1}
    if kind == "trm":
        arch["puzzle_emb_len"] = prefix
    path = write_checkpoint(tmp_path, tensors, arch, compiled=kind != "hrm")
    read = read_tensors(path)
    assert set(read) == set(tensors)  # the compile and loss-head prefixes are dropped
    got_kind, got_arch = read_arch(path)
    keys = published_keys(got_kind, got_arch, read, str(path))
    assert keys["puzzle_prefix"] == prefix and keys["mixer"] == ("mlp" if mlp_t else "attention")
    facts = shape_facts(read)
    assert facts["vocab"] == vocab and facts["puzzles"] == 1
    model = build_reasoner(ModelConfig(**keys), TaskSpec("sudoku", facts["vocab"], seq, (3, 3))).eval()
    state = to_state_dict(read, got_kind, model, str(path))
    model.load_state_dict(state)
    # every tensor landed where its name says: all of them, and spot checks of the names worked by hand
    mine = model.state_dict()
    for name, value in tensors.items():
        assert torch.equal(mine[loopstudy_name(name, got_kind)], value), name
    assert torch.equal(model.tok.weight, tensors["embed_tokens.embedding_weight"])
    assert torch.equal(model.y_init, tensors["H_init"]) and torch.equal(model.z_init, tensors["L_init"])
    assert torch.equal(model.block.sublayers[3].down.weight, tensors["L_level.layers.1.mlp.down_proj.weight"])
    if kind == "hrm":
        assert torch.equal(model.h_block.sublayers[4].attn.qkv.weight,
                           tensors["H_level.layers.2.self_attn.qkv_proj.weight"])
    tokens = torch.randint(0, vocab, (3, seq), generator=torch.Generator().manual_seed(2))
    dtype, tol = PRECISIONS[precision]
    model = model.to(dtype)
    want = reference_logits(tensors, kind, mlp_t, heads, prefix, H, L, tokens, 40, with_q=True, dtype=dtype)
    for n_sup in (1, 2, 4, 16, 40):  # supervision steps: H outer cycles each, the state carried on
        state = model.rollout(tokens, n_sup * H)
        logits, q = want[n_sup - 1]
        got = model.logits(state)
        assert got.dtype == dtype and torch.allclose(got, logits, atol=tol, rtol=0), (n_sup, (got - logits).abs().max())
        halt, cont = model.q_logits(state)
        assert torch.allclose(torch.stack([halt, cont], -1), q, atol=tol, rtol=0), n_sup


@pytest.mark.parametrize("kind", ["trm", "hrm"])
def test_the_q_head_halts_each_sample_at_the_update_the_reference_q_logits_say(tmp_path, kind):
    """model.halting.rule q_head at test time halts as ACT does (reference_models.md): after each whole update, TRM
    when q_halt > 0, HRM when q_halt > q_continue; every sample at max_updates. A halted sample keeps that state."""
    from study.config import HaltingConfig

    hidden, heads, vocab, seq, H, L, B, most = 16, 2, 11, 9, 2, 3, 32, 8
    prefix = 4 if kind == "trm" else 1
    layers = {"L": 2, "H": 3} if kind == "hrm" else {"L": 2}
    tensors = {k: v.double() for k, v in trm_tensors(kind, False, hidden, prefix, vocab, seq, layers).items()}
    tokens = torch.randint(0, vocab, (B, seq), generator=torch.Generator().manual_seed(4))
    compare = "zero" if kind == "trm" else "continue"
    tensors["q_head.weight"][1] *= 0.2  # q_continue varies less than q_halt: their difference rises for some samples

    def reference():
        out = reference_logits(tensors, kind, False, heads, prefix, H, L, tokens, most + 2, with_q=True,
                               dtype=torch.float64)
        return [o[0] for o in out], torch.stack([o[1] for o in out])  # q: (updates, B, 2)

    def halting_updates(q):  # per sample, the update after which ACT halts it
        says = q[..., 0] > 0 if compare == "zero" else q[..., 0] > q[..., 1]
        says[most - 1:] = True
        return says.float().argmax(0) + 1

    _, q = reference()
    # the halt logit's bias moved to where the samples' halting updates spread most (the q head's bias adds to
    # q_halt alone, so each candidate's halting updates follow from the reference's logits)
    edge = q[..., 0] if compare == "zero" else q[..., 0] - q[..., 1]  # what is compared with 0
    shift = max(edge[:most].flatten().tolist(), key=lambda c: len(set(halting_updates(
        torch.stack([q[..., 0] - c, q[..., 1]], -1)).tolist())))
    tensors["q_head.bias"][0] -= shift - 1e-6  # (just below a sample's value: no tie at 0)
    logits, q = reference()
    first = halting_updates(q)
    assert len(set(first.tolist())) >= 3, first  # the pin sees several halting updates

    keys = published_keys(kind, {"name": ARCH_NAMES[kind], "num_heads": heads, "H_cycles": H, "L_cycles": L,
                                 "L_layers": 2, "H_layers": 3, "puzzle_emb_ndim": hidden, "puzzle_emb_len": prefix},
                          tensors, "ckpt")
    cfg = ModelConfig(**keys, halting=HaltingConfig(enabled=True, rule="q_head", q_compare=compare, max_updates=most))
    model = build_reasoner(cfg, TaskSpec("sudoku", vocab, seq, (3, 3))).double().eval()
    model.load_state_dict(to_state_dict(tensors, kind, model, "ckpt"))
    state = model.rollout(tokens, (most + 2) * H)
    assert bool(state.halt.halted.all())
    assert torch.equal(state.halt.eff_layers, first * cfg.layers_per_update)
    got = model.logits(state)
    for i in range(B):
        assert torch.allclose(got[i], logits[int(first[i]) - 1][i], atol=1e-9, rtol=0), i


def test_the_newer_training_state_format_reads_the_emas_weights_over_the_models(tmp_path):
    tensors = trm_tensors("trm", False, 16, 4, 11, 9, {"L": 2})
    prefix = "_orig_mod.model.inner."
    model = {prefix + k: v for k, v in tensors.items()}
    ema = {prefix + k: v + 1 for k, v in tensors.items() if k not in ("H_init", "L_init", "puzzle_emb.weights")}
    param = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([param])
    param.grad = torch.ones(3)
    opt.step()
    torch.save({"model": model, "optimizers": [opt.state_dict()], "step": 1000, "ema_helper": ema},
               tmp_path / "step_1000")
    read = read_tensors(tmp_path / "step_1000")
    assert set(read) == set(tensors)
    assert torch.equal(read["lm_head.weight"], tensors["lm_head.weight"] + 1)  # the EMA's parameter
    assert torch.equal(read["H_init"], tensors["H_init"])  # a buffer: the model's


@pytest.fixture
def good_checkpoint(tmp_path):
    tensors = trm_tensors("trm", False, 16, 4, 11, 9, {"L": 2})
    arch = {"name": ARCH_NAMES["trm"], "num_heads": 2, "expansion": 4, "H_cycles": 2, "L_cycles": 3,
            "L_layers": 2, "H_layers": 0, "pos_encodings": "rope", "puzzle_emb_ndim": 16, "puzzle_emb_len": 4}
    return tmp_path, tensors, arch


def test_bad_checkpoints_are_refused_in_one_line_naming_the_file(good_checkpoint):
    folder, tensors, arch = good_checkpoint
    with pytest.raises(CheckpointError, match="no such file"):
        read_tensors(folder / "nope")
    (folder / "text").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="is not a torch state dict"):
        read_tensors(folder / "text")
    torch.save([1, 2, 3], folder / "list")
    with pytest.raises(CheckpointError, match="is not a state dict"):
        read_tensors(folder / "list")

    class RunsCode:
        def __reduce__(self):
            return (print, ("this ran",))

    torch.save({"x": RunsCode()}, folder / "evil")
    with pytest.raises(CheckpointError, match="loading it would run code"):
        read_tensors(folder / "evil")
    path = write_checkpoint(folder / "run", tensors, {**arch, "name": "models.other@Transformer"})
    with pytest.raises(CheckpointError, match="arch.name 'models.other@Transformer' is not one loopstudy reads"):
        read_arch(path)
    (folder / "run" / "all_config.yaml").unlink()
    with pytest.raises(CheckpointError, match="no all_config.yaml beside it"):
        read_arch(path)


@pytest.mark.parametrize("change,needle", [
    (lambda t: t.pop("lm_head.weight"), "tensors missing for head.weight"),
    (lambda t: t.update({"L_level.layers.7.mlp.down_proj.weight": torch.zeros(16, 256)}), "has no place"),
    (lambda t: t.update({"lm_head.weight": torch.zeros(12, 16)}), "has shape (12, 16), the model wants (11, 16)"),
    (lambda t: t.update({"H_level.layers.0.mlp.down_proj.weight": torch.zeros(16, 256)}), "has no place"),
], ids=["missing", "extra", "shape", "hrm_level_in_trm"])
def test_tensors_missing_extra_or_of_another_shape_are_refused_naming_the_tensor(good_checkpoint, change, needle):
    _, tensors, arch = good_checkpoint
    keys = published_keys("trm", arch, tensors, "ckpt")
    model = build_reasoner(ModelConfig(**keys), TaskSpec("sudoku", 11, 9, (3, 3)))
    change(tensors)
    with pytest.raises(CheckpointError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        to_state_dict(tensors, "trm", model, "ckpt")


# -- reading a checkpoint through the command line ---------------------------------------------------------------------
def cli(*args, cwd=None):
    import subprocess
    import sys

    from .conftest import REPO

    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=300)


# the config of the small TRM-Att checkpoints the command-line tests read (hidden 16, one layer, H2 L2, prefix 4)
SMALL_TRM_ARCH = {"name": ARCH_NAMES["trm"], "num_heads": 2, "expansion": 4, "H_cycles": 2, "L_cycles": 2,
                  "L_layers": 1, "H_layers": 0, "pos_encodings": "rope", "puzzle_emb_ndim": 16, "puzzle_emb_len": 4,
                  "halt_max_steps": 16}


@pytest.fixture
def sudoku_checkpoint(tmp_path):
    """A TRM-Att checkpoint for 4x4 Sudoku (vocab 6, 16 cells) and a trial file that reads it at depth."""
    tensors = trm_tensors("trm", False, 16, 4, 6, 16, {"L": 1})
    write_checkpoint(tmp_path / "ckpt", tensors, SMALL_TRM_ARCH)
    trial = tmp_path / "read.yaml"
    trial.write_text("task: {name: sudoku, size: 4, n_train: 32, n_test: 16}\n"
                     "model: {init_from: 'trm:ckpt/step_1000'}\ntrain: {steps: 0}\neval: {depths: [6, 60, 600]}\n")
    return tmp_path, tensors, trial


def test_a_checkpoint_is_read_at_depth_with_steps_0_and_its_model_loads_back(sudoku_checkpoint):
    from study.store import Store
    from study.trial import load_model

    folder, tensors, trial = sudoku_checkpoint
    proc = cli("trial", str(trial), "--store", str(folder / "r"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "0 steps" in proc.stderr and "600" in proc.stdout
    row = Store(folder / "r").read("trials", "adhoc").to_pylist()[0]
    import hashlib

    digest = hashlib.sha256((folder / "ckpt" / "step_1000").read_bytes()).hexdigest()
    assert row["model.init_from"] == f"trm:{folder / 'ckpt' / 'step_1000'}" and row["init_sha256"] == digest
    assert row["model.pos"] == "rope" and row["model.puzzle_prefix"] == 4 and row["model.hidden"] == 16
    model = load_model(str(folder / "r"), "adhoc")
    assert not model.training and torch.equal(model.head.weight, tensors["lm_head.weight"])
    want = reference_logits(tensors, "trm", False, 2, 4, 2, 2, torch.ones(1, 16, dtype=torch.long), 3)[-1]
    assert torch.allclose(model.logits(model.rollout(torch.ones(1, 16, dtype=torch.long), 6)), want, atol=1e-4)


def test_the_q_heads_halting_enters_the_depth_rows_and_the_halting_table(sudoku_checkpoint, capsys):
    import polars as pl

    from study.cli import main
    from study.store import Store

    folder, _, trial = sudoku_checkpoint
    store = str(folder / "r")
    for extra in ([], ["eval.halting=true", "eval.halting_rule=q_head"], ["eval.halting=true"]):
        assert main(["trial", str(trial), *extra, "--store", store, "--study", "q"]) == 0, capsys.readouterr().err
    depth = pl.from_arrow(Store(store).read("depth_eval", "q")).filter(pl.col("difficulty").is_null())
    trials = pl.from_arrow(Store(store).read("trials", "q"))
    assert trials["model.halting.max_updates"].to_list() == [16, 16, 16]  # the checkpoint's halt_max_steps
    q = depth.join(trials.filter(pl.col("eval.halting_rule") == "q_head").select("trial_id"), on="trial_id")
    deepest = q.filter(pl.col("depth_layers") == 600).row(0, named=True)
    # the Q head (bias -5 at most: it says continue) halts every sample by 16 updates of 6 layers at the latest
    assert deepest["halted_frac"] == 1.0 and 0 < deepest["eff_layers"] <= 16 * 6
    at_60 = q.filter(pl.col("depth_layers") == 60).row(0, named=True)
    assert at_60["halted_frac"] == 1.0  # halted by 60 layers: 540 layers later, not one more layer or FLOP paid
    assert (deepest["eff_layers"], deepest["flops"]) == (at_60["eff_layers"], at_60["flops"])
    capsys.readouterr()
    assert main(["table", "halting", "--store", store, "--study", "q"]) == 0
    out = capsys.readouterr().out
    assert "q_head" in out and "halted_frac" in out, out


def test_a_trial_fine_tunes_from_another_studys_stored_weights(tmp_path, capsys):
    from study.cli import main
    from study.store import Store

    base = tmp_path / "base.yaml"
    base.write_text("task: {name: sudoku, size: 4, n_train: 32, n_test: 8}\nmodel: {hidden: 16, heads: 2, "
                    "n_layers: 1, H: 1, L: 1}\ntrain: {steps: 4, batch_size: 8, warmup: 1, log_every: 2}\n"
                    "eval: {depths: [4]}\n")
    first = cli("trial", str(base), "--store", str(tmp_path / "r"), "--study", "pre")
    assert first.returncode == 0, first.stderr[-2000:]
    row = Store(tmp_path / "r").read("trials", "pre").to_pylist()[0]
    tune = cli("trial", str(base), f"model.init_from=pre/{row['trial_id']}", "train.steps=2", "--store",
               str(tmp_path / "r"), "--study", "tuned")
    assert tune.returncode == 0, tune.stderr[-2000:]
    tuned = Store(tmp_path / "r").read("trials", "tuned").to_pylist()[0]
    assert tuned["init_sha256"] == row["weights_sha256"] and tuned["model.init_from"] == f"pre/{row['trial_id']}"
    # the stored trial's model keys are taken as a checkpoint's are: a trial file that leaves them out reads them
    bare = tmp_path / "bare.yaml"
    bare.write_text("task: {name: sudoku, size: 4, n_train: 32, n_test: 8}\n"
                    f"model: {{init_from: pre/{row['trial_id']}}}\ntrain: {{steps: 0}}\neval: {{depths: [4]}}\n")
    assert main(["trial", str(bare), "--store", str(tmp_path / "r"), "--study", "bare"]) == 0, capsys.readouterr().err
    read = Store(tmp_path / "r").read("trials", "bare").to_pylist()[0]
    assert (read["model.hidden"], read["model.heads"], read["model.n_layers"], read["model.H"], read["model.L"]) == \
        (16, 2, 1, 1, 1) and read["init_sha256"] == row["weights_sha256"]
    capsys.readouterr()
    code = main(["trial", str(base), f"model.init_from=pre/{row['trial_id']}", "model.hidden=32", "--store",
                 str(tmp_path / "r"), "--study", "wrong"])
    err = capsys.readouterr().err
    assert code == 2 and f"model.hidden=32 contradicts the stored trial pre/{row['trial_id']}, whose model.hidden " \
        "is 16" in err and err.strip().count("\n") == 0, err[-2000:]
    assert "wrong" not in Store(tmp_path / "r").studies()  # nothing stored


def test_the_checkpoint_enters_the_trial_id_by_content_not_by_path(sudoku_checkpoint):
    import shutil

    from study.config import trial_id
    from study.spec.study import load_trial_file

    folder, _, trial = sudoku_checkpoint
    before = trial_id(load_trial_file(trial))
    shutil.copytree(folder / "ckpt", folder / "moved" / "ckpt")
    shutil.copy(trial, folder / "moved" / "read.yaml")
    assert trial_id(load_trial_file(folder / "moved" / "read.yaml")) == before
    blob = torch.load(folder / "moved" / "ckpt" / "step_1000", weights_only=True)
    blob = {k: v + 1 if k.endswith("lm_head.weight") else v for k, v in blob.items()}
    torch.save(blob, folder / "moved" / "ckpt" / "step_1000")
    assert trial_id(load_trial_file(folder / "moved" / "read.yaml")) != before


@pytest.mark.parametrize("override,needle", [
    ("model.hidden=32", "model.hidden=32 contradicts the checkpoint"),
    ("model.init_from=null", "train.steps=0 trains nothing"),
    ("model.init_from=trm:nope/step_1", "No such file or directory"),
    ("task.size=6", "has shape (6, 16), the model wants (8, 16)"),  # the task's vocabulary is not the checkpoint's
    ("model.carry.rule=infiloop", None),  # a carry rule on top of the checkpoint: accepted
])
def test_bad_checkpoint_reads_are_refused_in_one_line_before_any_trial(sudoku_checkpoint, override, needle, capsys):
    from study.cli import main  # (in this process: the command line's one error boundary, without a start-up)

    folder, _, trial = sudoku_checkpoint
    code = main(["trial", str(trial), override, "--store", str(folder / "r")])
    err = capsys.readouterr().err
    if needle is None:
        assert code == 0, err[-2000:]
        return
    assert code == 2 and needle in err and err.strip().count("\n") == 0, err
    assert not (folder / "r").exists()  # nothing stored


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_checkpoint_with_a_non_finite_value_is_refused_naming_the_tensor_before_any_trial(sudoku_checkpoint,
                                                                                           bad, capsys):
    from study.cli import main

    folder, tensors, trial = sudoku_checkpoint
    tensors = {**tensors, "L_level.layers.0.mlp.down_proj.weight": tensors["L_level.layers.0.mlp.down_proj.weight"]}
    tensors["L_level.layers.0.mlp.down_proj.weight"][3, 5] = bad
    write_checkpoint(folder / "ckpt", tensors, SMALL_TRM_ARCH)
    code = main(["trial", str(trial), "--store", str(folder / "r")])
    err = capsys.readouterr().err
    word = "NaN" if bad != bad else "infinite"
    assert code == 2 and "tensor _orig_mod.model.inner.L_level.layers.0.mlp.down_proj.weight holds " + word in err \
        and err.strip().count("\n") == 0, err
    assert not (folder / "r").exists()  # nothing stored


def test_an_arc_checkpoint_is_refused_in_one_line_for_its_builders_puzzle_numbering(tmp_path, capsys):
    from study.cli import main

    tensors = trm_tensors("trm", False, 16, 4, 12, 16, {"L": 1}, puzzles=40)
    write_checkpoint(tmp_path / "ckpt", tensors, SMALL_TRM_ARCH)
    trial = tmp_path / "read.yaml"
    trial.write_text("task: {name: arc, size: 4}\nmodel: {init_from: 'trm:ckpt/step_1000'}\ntrain: {steps: 0}\n")
    assert main(["trial", str(trial), "--store", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "40 puzzle-embedding rows" in err and "identifiers.json" in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "r").exists()


def test_maze_tokens_are_trms_maze_builder_encoding():
    from study.tasks import maze

    trm = {c: i + 1 for i, c in enumerate("# SGo")}  # build_maze_dataset.py: '# SGo' -> 1..5, 0 pad
    assert tuple(trm[c] for c in "# SGo") == (maze.WALL, maze.OPEN, maze.START, maze.GOAL, maze.PATH)
    assert maze.TASK.spec(maze_config(30)).vocab == 6 and maze.TASK.spec(maze_config(30)).seq_len == 900


def maze_config(size):
    from study.tasks import TaskConfig

    return TaskConfig(name="maze", size=size, min_path=10)


def test_an_arc_checkpoint_reads_each_version_with_the_row_its_builders_identifiers_name(tmp_path):
    import hashlib
    import json

    import numpy as np

    from study.config import TaskConfig
    from study.store import Store
    from study.tasks.arc import catalogue_of
    from study.tasks.arc_versions import trm_dihedral

    puzzles = catalogue_of(TaskConfig(name="arc", size=6, n_train=2, n_test=2, n_aug=1)).puzzles
    # the builder's names: the blank row, another dataset's puzzle, and each puzzle with two augmented versions
    names = ["<blank>", "ffffffff"]
    for i, p in enumerate(puzzles):
        names += [p.id, f"{p.id}|||t{i % 8}|||0987654321", f"{p.id}|||t{(i + 5) % 8}|||0123456798"]
    (tmp_path / "identifiers.json").write_text(json.dumps(names))
    tensors = trm_tensors("trm", False, 16, 4, 12, 37, {"L": 1}, puzzles=len(names))
    write_checkpoint(tmp_path / "ckpt", tensors, SMALL_TRM_ARCH)
    trial = tmp_path / "read.yaml"
    trial.write_text("task: {name: arc, size: 6, n_train: 2, n_test: 2, identifiers: identifiers.json}\n"
                     "model: {init_from: 'trm:ckpt/step_1000'}\ntrain: {steps: 0}\neval: {depths: [6]}\n")
    proc = cli("trial", str(trial), "--store", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = Store(tmp_path / "r").read("trials", "adhoc").to_pylist()[0]
    assert row["init_sha256"] == hashlib.sha256((tmp_path / "ckpt" / "step_1000").read_bytes()).hexdigest()
    # every test row of the evaluation puzzles carries the builder's row of its version, laid out as TRM lays it
    from study.tasks.loader import load_task

    cfg = TaskConfig(name="arc", size=6, n_train=2, n_test=2, identifiers=str(tmp_path / "identifiers.json"),
                     cache_dir=str(tmp_path / "cache"))
    cat, test = catalogue_of(cfg), load_task(cfg).test
    assert cat.n_ids == len(names) and set(test.inputs[:, -1].tolist()) <= set(range(2, len(names)))
    for r, x in zip(cat.test_rows, test.inputs):
        name = names[int(x[-1])]
        base, _, rest = name.partition("|||")
        assert base == cat.puzzles[r.puzzle].id
        t, mapping = (int(rest[1]), np.array([int(c) for c in rest[5:]])) if rest else (0, np.arange(10))
        want = trm_dihedral(mapping[r.input], t)  # TRM's own augmentation of the test input
        assert np.array_equal(x[:-1].reshape(6, 6)[:want.shape[0], :want.shape[1]] - 2, want)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(["<blank>", "ffffffff"]))
    proc = cli("trial", str(trial), "task.identifiers=" + str(bad), "--store", str(tmp_path / "r2"))
    assert proc.returncode == 2 and "names no version of ARC puzzle" in proc.stderr, proc.stderr
