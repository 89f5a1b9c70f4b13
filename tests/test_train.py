"""Trainer: a small config learns 4x4 sudoku; checkpoint + resume equals training straight through."""

import math

import numpy as np
import pytest
import torch

from study.config import CarryConfig, EvalConfig, ModelConfig, TaskConfig, TrainConfig
from study.evaluate import evaluate
from study.models.reasoner import build_reasoner
from study.tasks.loader import load_task
from study.trial.loss import stablemax_log_probs
from study.trial.train import Trainer, seed_everything


def make_trainer(task, train_cfg, model_cfg, seed=0):
    seed_everything(seed)
    spec = task.spec
    model = build_reasoner(model_cfg, spec)
    return Trainer(model, task, train_cfg, seed)


def test_small_config_learns_4x4_sudoku_to_95_percent_on_held_out_puzzles(tmp_path):
    task = load_task(TaskConfig(name="sudoku", size=4, blanks=(8, 10), n_train=2000, n_test=256,
                                cache_dir=str(tmp_path)))
    model_cfg = ModelConfig(hidden=64, heads=4, n_layers=2, H=2, L=2, carry=CarryConfig(rule="carry_last"))
    train_cfg = TrainConfig(steps=400, batch_size=64, lr=6e-3, warmup=30, n_sup=4, ema=0.98, threads=1)
    trainer = make_trainer(task, train_cfg, model_cfg)
    trainer.fit()
    result = evaluate(trainer.eval_model(), task, EvalConfig(depths=[48]))
    overall = next(r for r in result.depth if r.difficulty is None)
    assert overall.n == 256
    assert overall.exact_acc >= 0.95, overall
    assert min(task.test.difficulty) >= 8


def test_resume_from_checkpoint_equals_training_straight_through(tmp_path):
    task = load_task(TaskConfig(name="sudoku", size=4, blanks=(6, 8), n_train=200, n_test=16,
                                cache_dir=str(tmp_path)))
    model_cfg = ModelConfig(hidden=16, heads=2, n_layers=1, H=2, L=1, carry=CarryConfig(rule="infiloop"))
    train_cfg = TrainConfig(steps=12, batch_size=8, n_sup=2, warmup=3, ema=0.9)

    straight = make_trainer(task, train_cfg, model_cfg)
    straight.fit()

    first = make_trainer(task, train_cfg, model_cfg)
    for _ in range(3):
        first.train_batch()
    first.save(tmp_path / "ckpt.pt")
    torch.manual_seed(1234)  # whatever happens in between must not matter
    np.random.seed(99)
    resumed = make_trainer(task, train_cfg, model_cfg, seed=0)
    resumed.load(tmp_path / "ckpt.pt")
    resumed.fit()

    assert [h.loss for h in resumed.history] == [h.loss for h in straight.history]
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name
    for k in straight.ema.shadow:
        assert torch.equal(straight.ema.shadow[k], resumed.ema.shadow[k]), k


def test_stablemax_is_a_normalised_distribution():
    logits = torch.randn(5, 7, dtype=torch.float64) * 10
    p = stablemax_log_probs(logits).exp()
    torch.testing.assert_close(p.sum(-1), torch.ones(5, dtype=torch.float64))
    assert bool((p.argmax(-1) == logits.argmax(-1)).all())


def test_stablemax_has_a_finite_gradient_at_a_logit_of_exactly_one():
    """bf16 logits land on 1.0 often: there the unused branch 1 / (1 - x) is infinite, and its gradient must not
    turn the where's zero into NaN. Values and gradients against s(x) written per element (x + 1 or 1 / (1 - x))."""
    logits = torch.tensor([[1.0, 0.5, -2.0, 3.0, 0.0]], dtype=torch.float64, requires_grad=True)
    out = stablemax_log_probs(logits)[0, 0]
    out.backward()
    assert torch.isfinite(logits.grad).all()
    x = logits.detach()[0].tolist()
    s = [v + 1 if v >= 0 else 1 / (1 - v) for v in x]
    assert out.item() == pytest.approx(math.log(s[0] / sum(s)), abs=1e-12)
    # d/dx_j log(s_0 / S) = [j == 0] s'_0 / s_0 - s'_j / S, with s'(x) = 1 for x >= 0, 1 / (1 - x)^2 otherwise
    ds = [1.0 if v >= 0 else 1 / (1 - v) ** 2 for v in x]
    want = [(ds[0] / s[0] if j == 0 else 0.0) - ds[j] / sum(s) for j in range(len(x))]
    assert logits.grad[0].tolist() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("metric", ["final_exact_acc", "best_exact_acc", "final_cell_acc", "final_train_loss"])
def test_a_resampled_complete_trial_reports_its_stored_value_of_every_metric(tmp_path, metric):
    """What the trainable hands Tune/Optuna for a trial already complete in storage (study.run.trainable)."""
    from study.metrics import METRICS
    from study.run.trainable import stored_metrics
    from study.store import Store

    from .test_store import SAMPLES, write_trial

    store = Store(tmp_path)
    write_trial(store, "s", "t1")
    stored = {"final_exact_acc": 0.5, "best_exact_acc": 0.75, "final_cell_acc": 0.875, "final_train_loss": 0.125,
              "final_flops": 4096.0}
    store.write("trials", "s", "t1", [{**SAMPLES["trials"][0], **stored}])
    assert {k for k, m in METRICS.items() if m.every_task} == set(stored)  # (final_pass_at_2: ARC's only)
    assert stored_metrics(store, "s", "t1")[metric] == stored[metric]
    # a trial stored before the metric had a column: computed from its stored depth rows, as the trial would have
    store.write("trials", "s", "t1", [{**SAMPLES["trials"][0], **stored, metric: None}])
    expect = {"final_exact_acc": 0.5, "best_exact_acc": 0.5, "final_cell_acc": 0.9}
    if metric in expect:
        assert stored_metrics(store, "s", "t1")[metric] == expect[metric]


def test_bf16_training_attends_its_bf16_inputs_in_float32_on_the_cpu(monkeypatch):
    """PyTorch's bf16 attention backward on the CPU takes several times float32's, so a bf16 training step attends
    the bf16-rounded queries, keys and values in float32 (as flash attention accumulates them): the output matches a
    float64 attention of those rounded inputs far inside bf16's rounding. A bf16 reading (no gradient) keeps bf16
    attention, whose forward is the faster."""
    from study.models.block import Attention

    torch.manual_seed(0)
    attn = Attention(ModelConfig(hidden=32, heads=2, pos="rope"))
    x = torch.randn(3, 10, 32, requires_grad=True)
    seen = {}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen["in"] = (q, k, v)
        seen["out"] = out = sdpa(q, k, v, **kw)
        return out

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)  # the real one, watched
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attn(x).float().sum().backward()
    q, k, v = seen["in"]
    assert q.dtype == k.dtype == v.dtype == torch.float32
    assert all(torch.equal(t, t.to(torch.bfloat16).float()) for t in (q, k, v))  # bf16 values, float32 arithmetic
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    want = torch.softmax(q64 @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v64
    assert (seen["out"].detach().double() - want).abs().max() < 1e-5
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with torch.no_grad():  # a bf16 reading: the model's own copy in bf16, no autocast
        out = attn.to(torch.bfloat16)(x.detach().to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and all(t.dtype == torch.bfloat16 for t in seen["in"])
