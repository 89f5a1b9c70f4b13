"""Benchmark: one rollout with readings at five depths vs a rollout to the deepest depth alone (same run).

Both go through study.evaluate.evaluate on the same random-weight model and test set. After an untimed warm-up
of each, each of --repeats rounds times the two back to back, in alternating order (so a slow stretch of a shared
machine falls on both sides), and the ratio is the median of the rounds' ratios; each side's best time and the
ratio of those are printed beside it.
Target: ratio <= 1.05. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch

from study.config import CarryConfig, EvalConfig, ModelConfig, TaskConfig
from study.evaluate import evaluate
from study.models.reasoner import build_reasoner
from study.tasks.loader import load_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--n-test", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the readings' precision (eval.dtype)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as cache:
        task = load_task(TaskConfig(name="sudoku", size=4, blanks=(8, 10), n_train=1, n_test=args.n_test,
                                    cache_dir=cache))
    cfg = ModelConfig(hidden=64, heads=4, n_layers=2, H=2, L=2, carry=CarryConfig(rule="infiloop"))
    model = build_reasoner(cfg, task.spec).eval()
    per = cfg.layers_per_step
    depths = [per * k for k in (10, 20, 40, 80, 160)]
    times = {"five_readings": [], "deepest_only": []}
    sides = [("five_readings", depths), ("deepest_only", depths[-1:])]
    for _, ds in sides:  # untimed: the first call of a process pays one-off costs (kernel loading, first touches)
        evaluate(model, task, EvalConfig(depths=ds[:1], batch_size=args.n_test), dtype=args.dtype)
    for i in range(args.repeats):
        for name, ds in sides if i % 2 == 0 else sides[::-1]:
            t0 = time.perf_counter()
            evaluate(model, task, EvalConfig(depths=ds, batch_size=args.n_test), dtype=args.dtype)
            times[name].append(time.perf_counter() - t0)
            print(f"round {i} {name:14s} {times[name][-1]:.2f}s", file=sys.stderr)
    rounds = [a / b for a, b in zip(times["five_readings"], times["deepest_only"], strict=True)]
    best = {k: min(v) for k, v in times.items()}
    print(json.dumps({"bench": "eval_readings", "dtype": args.dtype, "depths": depths, "seconds": best,
                      "ratio": statistics.median(rounds), "ratio_per_round": rounds,
                      "ratio_of_best": best["five_readings"] / best["deepest_only"]}))


if __name__ == "__main__":
    main()
