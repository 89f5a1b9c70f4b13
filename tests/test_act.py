"""TRM's training: ACT through the Q head (train.act), its loss head, Adam-atan2 and HRM's one-step gradient."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from study.config import CarryConfig, ModelConfig, TaskConfig, TrainConfig, TrialConfig
from study.models.reasoner import build_reasoner
from study.models.trm_checkpoint import to_state_dict
from study.tasks import IGNORE
from study.tasks.loader import load_task
from study.trial import act
from study.trial.adam_atan2 import AdamAtan2
from study.trial.loss import act_loss
from study.trial.train import Trainer, seed_everything
from tests.test_published import published, reference_logits, trm_tensors


def test_adam_atan2_takes_trms_step_with_the_bias_correction_outside_the_atan2():
    g = torch.Generator().manual_seed(0)
    p0 = torch.randn(5, 3, generator=g)
    grads = [torch.randn(5, 3, generator=g) for _ in range(3)]
    p = torch.nn.Parameter(p0.clone())
    opt = AdamAtan2([p], lr=0.01, betas=(0.9, 0.95), weight_decay=0.5)
    want, m, v = p0.clone().double(), torch.zeros(5, 3).double(), torch.zeros(5, 3).double()
    for t, grad in enumerate(grads, start=1):
        p.grad = grad.clone()
        opt.step()
        gd = grad.double()
        want = want * (1 - 0.01 * 0.5)
        m, v = 0.9 * m + 0.1 * gd, 0.95 * v + 0.05 * gd**2
        want = want - 0.01 / (1 - 0.9**t) * torch.atan2(m, v.sqrt() / math.sqrt(1 - 0.95**t))
        assert torch.allclose(p.detach().double(), want, atol=1e-6, rtol=0), t
    # the correction inside the atan2 (another package's rule) takes another step: the test tells them apart
    inside = p0.double() * (1 - 0.005) - 0.01 * torch.atan2(0.1 * grads[0].double() / 0.1,
                                                             (0.05 * grads[0].double() ** 2 / 0.05).sqrt())
    first = p0.double() * (1 - 0.005) - 0.01 / 0.1 * torch.atan2(0.1 * grads[0].double(),
                                                                  (0.05 * grads[0].double() ** 2).sqrt() / 0.05**0.5)
    assert not torch.allclose(inside, first)
    assert set(opt.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}


def reference_loss_head(logits, labels, q_halt, q_continue=None, target=None):
    """TRM's ACTLossHead as shared/spec/reference_models.md states it (stablemax, float64), summed over samples."""
    mask = labels != IGNORE
    counts = mask.sum(-1)
    s = torch.where(logits >= 0, logits + 1, 1 / (1 - logits)).double()
    logp = torch.log(s / s.sum(-1, keepdim=True))
    token = -logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    lm = (token / counts.clamp_min(1).unsqueeze(-1)).sum()
    solved = ((logits.argmax(-1) == labels) & mask).sum(-1) == counts
    q = F.binary_cross_entropy_with_logits(q_halt, solved.float(), reduction="sum")
    if target is not None:
        q = q + F.binary_cross_entropy_with_logits(q_continue, target, reduction="sum")
    return lm + 0.5 * q


def test_the_act_loss_is_trms_loss_head_over_the_global_batch():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 10, 7, generator=g) * 3
    labels = torch.randint(0, 7, (6, 10), generator=g)
    labels[0, :4] = IGNORE
    labels[1] = logits[1].argmax(-1)  # one sample exactly right
    labels[1, 7:] = IGNORE
    q_halt, q_continue, target = torch.randn(6, generator=g), torch.randn(6, generator=g), torch.rand(6, generator=g)
    loss, solved = act_loss(logits, labels, q_halt, q_continue, None, "stablemax", 24)
    assert torch.allclose(loss.double(), reference_loss_head(logits, labels, q_halt) / 24, rtol=1e-6)
    assert solved.tolist() == [False, True, False, False, False, False]
    loss, _ = act_loss(logits, labels, q_halt, q_continue, target, "stablemax", 6)
    assert torch.allclose(loss.double(), reference_loss_head(logits, labels, q_halt, q_continue, target) / 6,
                          rtol=1e-6)


def test_a_row_halts_at_n_sup_or_by_its_q_head_but_not_before_its_exploration_minimum():
    cfg = TrainConfig(n_sup=4, act="no_continue")
    updates = torch.tensor([1, 1, 2, 4, 3])
    q_halt = torch.tensor([1.0, -1.0, 2.0, -5.0, 0.5])
    q_continue = torch.tensor([2.0, -2.0, 0.0, 0.0, 0.0])
    minimum = torch.tensor([0, 0, 3, 4, 0])
    assert act.halts(updates, q_halt, q_continue, minimum, cfg).tolist() == [True, False, False, True, True]
    cfg = TrainConfig(n_sup=4, act="continue")  # HRM: halt when q_halt > q_continue
    assert act.halts(updates, q_halt, q_continue, minimum, cfg).tolist() == [False, True, False, True, True]
    draws = act.exploration(np.random.default_rng(0), TrainConfig(n_sup=16, halt_exploration=0.1), 20_000)
    explored = draws[draws > 0]
    assert 0.08 < len(explored) / 20_000 < 0.12 and explored.min() == 2 and explored.max() == 16


def sudoku(tmp_path, n_train=64):
    return load_task(TaskConfig(name="sudoku", size=4, blanks=(6, 8), n_train=n_train, n_test=8,
                                cache_dir=str(tmp_path)))


@pytest.mark.parametrize("mode", ["no_continue", "continue"])
def test_one_act_step_of_a_trm_checkpoint_has_the_loss_of_trms_forward_and_loss_head(tmp_path, mode):
    task = sudoku(tmp_path)
    seq, vocab, prefix, H, L = task.spec.seq_len, task.spec.vocab, 4, 2, 3
    tensors = trm_tensors("trm", False, 16, prefix, vocab, seq, {"L": 2})
    cfg, _ = published(prefix=prefix, vocab=vocab, seq=seq)
    seed_everything(0)
    model = build_reasoner(cfg, task.spec)
    model.load_state_dict(to_state_dict(tensors, "trm", model, "test"))
    train = TrainConfig(steps=1, batch_size=5, act=mode, n_sup=3, loss="stablemax", optimizer="adam_atan2",
                        weight_decay_on="all", grad_clip=0)
    trainer = Trainer(model, task, train, seed=0)
    log = trainer.train_batch()
    tokens, labels = trainer.carry.tokens, trainer.carry.labels
    (logits, q), (nxt_logits, nxt_q) = reference_logits(tensors, "trm", False, 2, prefix, H, L, tokens, 2,
                                                        with_q=True)
    target = torch.sigmoid(torch.maximum(nxt_q[:, 0], nxt_q[:, 1])) if mode == "continue" else None
    want = reference_loss_head(logits, labels, q[:, 0], q[:, 1], target) / 5
    assert math.isclose(log.loss, float(want), rel_tol=1e-5), (log.loss, float(want))
    assert trainer.carry.updates.tolist() == [1] * 5 and trainer.step == 1


def act_trainer(tmp_path, steps=30, **train):
    task = sudoku(tmp_path, n_train=200)
    model_cfg = ModelConfig(hidden=16, heads=2, n_layers=1, H=2, L=2, q_head=True,
                            carry=CarryConfig(rule="infiloop"))
    cfg = TrainConfig(steps=steps, batch_size=8, n_sup=4, warmup=3, ema=0.9, act="no_continue", halt_exploration=0.5,
                      optimizer="adam_atan2", lr=3e-3, **train)
    seed_everything(0)
    return Trainer(build_reasoner(model_cfg, task.spec), task, cfg, seed=0)


def test_act_carries_rows_across_steps_and_refills_the_halted_ones_with_fresh_samples(tmp_path):
    trainer = act_trainer(tmp_path)
    seen = []
    for _ in range(12):
        before = trainer.carry
        trainer.train_batch()
        after = trainer.carry
        assert int(after.updates.max()) <= 4
        if before is not None:  # a row that did not halt keeps its sample and counts one more update
            kept = ~before.halted
            assert torch.equal(after.tokens[kept], before.tokens[kept])
            assert torch.equal(after.updates[kept], before.updates[kept] + 1)
            assert bool((after.updates[before.halted] == 1).all())
        seen.append(after.updates.clone())
    counts = torch.stack(seen)
    assert bool((counts == 4).any()) and bool((counts < 4).any())  # rows sit at different updates at once
    assert trainer.batches == 12 and trainer.step == 12


def test_an_act_run_resumed_from_its_checkpoint_equals_the_run_straight_through(tmp_path):
    straight = act_trainer(tmp_path, steps=14)
    straight.fit()
    first = act_trainer(tmp_path, steps=14)
    for _ in range(5):
        first.train_batch()
    first.save(tmp_path / "ckpt.pt")
    torch.manual_seed(1234)
    np.random.seed(99)
    resumed = act_trainer(tmp_path, steps=14)
    resumed.load(tmp_path / "ckpt.pt")
    resumed.fit()
    assert [h.loss for h in resumed.history] == [h.loss for h in straight.history]
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert torch.equal(resumed.carry.updates, straight.carry.updates)


def test_hrms_one_step_gradient_flows_through_the_last_inner_update_and_the_outer_update_only():
    cfg, spec = published(kind="hrm", prefix=1)
    cfg = ModelConfig(**{**cfg.__dict__, "H": 2, "L": 3, "inner_grad_steps": 1})
    torch.manual_seed(0)
    model = build_reasoner(cfg, spec)
    tokens = torch.randint(0, spec.vocab, (2, spec.seq_len))
    x = model.embed(tokens)
    model.update(x, model.init_state(x)).outer.h.square().sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    # by hand: every update but the last inner one and the outer one without gradient
    x = model.embed(tokens)
    with torch.no_grad():
        y, z = model.y_init.expand_as(x), model.z_init.expand_as(x)
        for h in range(2):
            for i in range(3):
                if (h, i) != (1, 2):
                    z = model.block(z + (y + x))  # HRM's order: z_L + (z_H + x)
            if h == 0:
                y = model.h_block(y + z)
    z = model.block(z + (y + x))
    model.h_block(y + z).square().sum().backward()
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    for n in want:
        assert torch.allclose(got[n], want[n], atol=1e-5, rtol=1e-4), n
    # TRM's rule (all L inner updates of the last cycle graded) gives other gradients
    model.zero_grad()
    full = build_reasoner(ModelConfig(**{**cfg.__dict__, "inner_grad_steps": None}), spec)
    full.load_state_dict(model.state_dict())
    x = full.embed(tokens)
    full.update(x, full.init_state(x)).outer.h.square().sum().backward()
    assert not torch.allclose(full.block.sublayers[0].attn.qkv.weight.grad, want["block.sublayers.0.attn.qkv.weight"])


@pytest.mark.parametrize("change,needle", [
    ({"model": {"q_head": False}}, "set model.q_head=true"),
    ({"model": {"q_head": True, "carry": {"rule": "full_attnres"}}}, "full_attnres"),
    ({"model": {"q_head": True}, "train": {"progressive": 0.5, "n_sup": 1}}, "train.progressive=0"),
    ({"model": {"q_head": True, "L": 2, "inner_grad_steps": 3}}, "model.inner_grad_steps=3"),
])
def test_act_settings_that_cannot_run_are_refused_naming_the_fix(change, needle):
    sections = {"task": {"name": "sudoku", "size": 4}, "train": {"act": "no_continue"}}
    for k, v in change.items():
        sections[k] = {**sections.get(k, {}), **v}
    with pytest.raises(ValueError, match=needle):
        TrialConfig(**sections)


def act_worker(rank: int, world: int, port: int, folder: str) -> None:
    """One of `world` data-parallel workers of an ACT run (a gloo process group on 127.0.0.1)."""
    import torch.distributed as dist

    from study.trial.data_parallel import DataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        trainer = act_trainer(Path(folder), steps=6)
        trainer = Trainer(trainer.model, trainer.task, trainer.cfg, seed=0, parallel=DataParallel(rank, world))
        trainer.fit()
        if rank == 0:
            torch.save({"model": trainer.model.state_dict(), "losses": [h.loss for h in trainer.history]},
                       Path(folder) / "two.pt")
    finally:
        dist.destroy_process_group()


def test_two_data_parallel_workers_train_an_act_run_as_one_worker_does(tmp_path):
    import socket

    import torch.multiprocessing as mp

    one = act_trainer(tmp_path, steps=6)
    one.fit()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(act_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    # each worker carries its own rows; the global loss and the summed gradients are one worker's (float sums aside)
    assert two["losses"] == pytest.approx([h.loss for h in one.history], rel=1e-5)
    for name, value in one.model.state_dict().items():
        assert torch.allclose(two["model"][name], value, atol=1e-5), name
