"""Benchmark: one trial's training on 2 data-parallel workers x 1 thread vs 1 worker x 1 thread, same global batch.

Both sides run loopstudy's own step (`Trainer.train_batch`; with two workers, each on its half of the global batch,
then the gradient exchange of study.trial.data_parallel over a gloo process group on 127.0.0.1, the group Ray Train
sets up for a multi-worker trial). Ray itself is left out: it only places the workers and hands reports on, so the
step's rate is what this measures. Rounds alternate between the sides and each side's best round counts. Reported:
samples per second of each, their ratio (target on 2 cores: >= 1.7x) and the share of a 2-worker step spent in the
exchange: the time a step waits on it after backward (the dense gradients' all-reduces start during backward and
overlap it) and on the all-reduces of the logged numbers. The last line printed is JSON.

    python bench/data_parallel.py            # hidden 256, 4x4 sudoku, global batch 64, 1 thread per worker
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from study.config import ModelConfig, TaskConfig, TrainConfig
from study.models.reasoner import build_reasoner
from study.tasks.loader import load_task
from study.trial.data_parallel import DataParallel, GradientExchange
from study.trial.train import Trainer

SECONDS = [0.0]  # the step's waits on the workers' collectives (rank 0)


class TimedExchange(GradientExchange):
    """GradientExchange that adds up the seconds the step waits for it after backward."""

    def finish(self):
        t = time.perf_counter()
        super().finish()
        SECONDS[0] += time.perf_counter() - t


class TimedParallel(DataParallel):
    """DataParallel whose collectives add up the seconds the step waits on them."""

    def total(self, values, device):
        sums = super().total(values, device)

        def timed():
            t = time.perf_counter()
            out = sums()
            SECONDS[0] += time.perf_counter() - t
            return out

        return timed

    def exchange(self, params):
        return TimedExchange(self, params)


def worker(rank: int, world: int, port: int, args, out) -> None:
    torch.set_num_threads(1)
    parallel = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        parallel = TimedParallel(rank, world)
    task = load_task(TaskConfig(name="sudoku", size=4, n_train=2000, n_test=16, cache_dir=args.cache))
    torch.manual_seed(0)
    model = build_reasoner(ModelConfig(kind="nested", hidden=args.hidden, heads=4, n_layers=2, H=2, L=2), task.spec)
    cfg = TrainConfig(steps=10**6, batch_size=args.batch, n_sup=1, warmup=1, threads=1)
    trainer = Trainer(model, task, cfg, seed=0, parallel=parallel)
    for _ in range(args.warmup):
        trainer.train_batch()
    if parallel is not None:
        dist.barrier()
    SECONDS[0] = 0.0
    t = time.perf_counter()
    for _ in range(args.batches):
        trainer.train_batch()
    wall = time.perf_counter() - t
    if rank == 0:
        out.put({"wall_s": wall, "exchange_s": SECONDS[0]})
    if parallel is not None:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_side(world: int, args) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    result = out.get(timeout=1800)
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a worker of the {world}-worker side exited with {p.exitcode}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=64, help="the global batch (split over the workers)")
    p.add_argument("--batches", type=int, default=40, help="timed batches per round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        args.cache = cache
        one, two = [], []
        for _ in range(args.rounds):
            one.append(run_side(1, args))
            two.append(run_side(2, args))
    best1, best2 = min(one, key=lambda r: r["wall_s"]), min(two, key=lambda r: r["wall_s"])
    samples = args.batch * args.batches
    result = {"hidden": args.hidden, "global_batch": args.batch, "batches": args.batches, "cpus": os.cpu_count(),
              "one_worker_samples_per_s": samples / best1["wall_s"],
              "two_workers_samples_per_s": samples / best2["wall_s"],
              "speedup": best1["wall_s"] / best2["wall_s"],
              "exchange_share": best2["exchange_s"] / best2["wall_s"], "rounds": {"one": one, "two": two}}
    print(f"1 worker: {result['one_worker_samples_per_s']:.0f} samples/s; 2 workers: "
          f"{result['two_workers_samples_per_s']:.0f} samples/s ({result['speedup']:.2f}x); exchange "
          f"{100 * result['exchange_share']:.1f}% of a 2-worker step")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
