"""Benchmark: loopstudy's training step against a bare PyTorch loop of the same model, batch and loss, side by side.

The bare loop is written here: embed, one deep-supervision update (H steps, gradient through the last grad_steps),
logits, cross-entropy, AdamW with the same groups, gradient clipping and the EMA of the weights, on the same
batches. loopstudy's is `Trainer.train_batch` (n_sup 1: one optimizer step per batch, as the bare loop). Rounds
alternate between the two and each side's best time counts. Target: loopstudy <= 1.05x the bare loop.
Also: the step's FLOPs (torch.utils.flop_counter, forward and backward) over its time, against this CPU's own rate
on a matmul of the step's shape (hidden x hidden at batch x tokens rows). The last line printed is JSON.

    python bench/train_step.py                  # hidden 256, 4x4 sudoku, batch 64, 1 thread
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from study.config import ModelConfig, TaskConfig, TrainConfig
from study.models.reasoner import build_reasoner
from study.tasks import IGNORE
from study.tasks.loader import load_task
from study.trial.train import Trainer


def bare_loop(model, cfg: TrainConfig):
    """One step of a plain PyTorch training loop of `model`: returns step(tokens, labels)."""
    opt = torch.optim.AdamW(model.param_groups(cfg.weight_decay), lr=cfg.lr, betas=cfg.betas)
    params = list(model.parameters())
    shadow = [p.detach().clone() for p in params]

    def step(tokens: torch.Tensor, labels: torch.Tensor) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.dtype == "bf16"):
            x = model.embed(tokens)
            state = model.update(x, model.init_state(x))
            logits = model.logits(state)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(shadow, [p.detach() for p in params], 1 - cfg.ema)
        return float(loss.detach())

    return step


def matmul_rate(hidden: int, rows: int, dtype: torch.dtype = torch.float32, repeats: int = 20) -> float:
    """FLOP/s of this CPU on a (rows x hidden) @ (hidden x hidden) matmul in `dtype`, best of `repeats`."""
    a, b = torch.randn(rows, hidden).to(dtype), torch.randn(hidden, hidden).to(dtype)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * rows * hidden * hidden / best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=10, help="steps per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="train.dtype (bf16: autocast, both sides)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as cache:
        task = load_task(TaskConfig(name="sudoku", size=4, blanks=(8, 10), n_train=512, n_test=1, cache_dir=cache))
    mcfg = ModelConfig(hidden=args.hidden, heads=args.heads, n_layers=2, H=2, L=2)
    tcfg = TrainConfig(steps=10**6, batch_size=args.batch, n_sup=1, warmup=1, log_every=10**6, dtype=args.dtype)
    torch.manual_seed(0)
    ours = Trainer(build_reasoner(mcfg, task.spec), task, tcfg, seed=0)
    torch.manual_seed(0)
    bare_model = build_reasoner(mcfg, task.spec)
    bare = bare_loop(bare_model, tcfg)
    batches = [ours.next_batch() for _ in range(args.steps)]
    feed = [(torch.as_tensor(b.inputs), torch.as_tensor(b.labels)) for b in batches]
    ours.next_batch = iter(batches * (args.rounds + 1)).__next__  # the same batches, without the data pipeline

    with FlopCounterMode(display=False) as counter:
        bare(*feed[0])
    step_flops = counter.get_total_flops()
    ours.train_batch()  # warm both up
    best = {"loopstudy": float("inf"), "bare": float("inf")}
    for _ in range(args.rounds):
        t = time.perf_counter()
        for _ in range(args.steps):
            ours.train_batch()
        best["loopstudy"] = min(best["loopstudy"], (time.perf_counter() - t) / args.steps)
        t = time.perf_counter()
        for tokens, labels in feed:
            bare(tokens, labels)
        best["bare"] = min(best["bare"], (time.perf_counter() - t) / args.steps)
    rate = matmul_rate(args.hidden, args.batch * task.spec.seq_len,
                       torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    achieved = step_flops / best["loopstudy"]
    print(json.dumps({"bench": "train_step", "config": {**vars(args), "model": dataclasses.asdict(mcfg)["kind"]},
                      "step_s": best, "ratio": best["loopstudy"] / best["bare"], "target_ratio": 1.05,
                      "step_flops": step_flops, "achieved_flops_per_s": achieved, "matmul_flops_per_s": rate,
                      "share_of_matmul_rate": achieved / rate}))


if __name__ == "__main__":
    main()
