"""GPU path check: one script, <= 8 minutes on one H100/H200. Prints a final JSON line.

1. Paper-size depth rollout (hidden 512, 8 heads, 9x9, batch 256, bf16): carry_last and InfiLoop side by side
   (bench/depth.py's interleaved timing) to 24,960 layers: layers/s, achieved TFLOP/s against the card's bf16 peak
   (FLOPs of one step counted by torch.utils.flop_counter), InfiLoop's time ratio. Targets: ratio <= 1.05,
   rollout >= 30% of peak.
2. Paper-size training throughput: ~100 bf16 optimizer steps with deep supervision (steps/s, TFLOP/s).
3. A two-trial `loopstudy run` of a tiny GPU spec with `resources.gpu: 0.5`: both trials share one GPU, both
   complete, their rows land (and their run times overlap).
4. The evaluation rollout with and without `eval.compile` (torch.compile; CUDA graphs on a GPU), timed.
5. With 2 or more GPUs: a tiny spec trained by 2 data-parallel workers of one GPU each (`resources.workers: 2`,
   Ray Train over NCCL) and by 1: both complete, the 2-worker trial's row says so, and the loss curves agree.

    python bench/gpu_check.py                 # on the GPU machine
    python bench/gpu_check.py --cpu-smoke     # tiny sizes on CPU, in CI, so the script cannot rot
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

# dense bf16 peak (tensor cores, no sparsity) by device name, TFLOP/s: vendor datasheets
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0}

PAPER = {"hidden": 512, "heads": 8, "grid": 9, "batch": 256, "dtype": "bf16", "depths": [1040, 5200, 24960]}
SMOKE = {"hidden": 32, "heads": 2, "grid": 4, "batch": 4, "dtype": "fp32", "depths": [52, 104]}


def peak_tflops(device: str) -> float | None:
    import torch

    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def step_flops(model, state, x) -> int:
    """FLOPs of one rollout step, counted by torch's flop counter (matmuls and attention)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.step(state, x)
    return counter.get_total_flops()


def rollout_check(size: dict, device: str, threads: int) -> dict:
    """Part 1: the side-by-side rollout of bench/depth.py at `size`, with FLOPs per step."""
    import depth  # bench/depth.py

    args = SimpleNamespace(device=device, dtype=size["dtype"], hidden=size["hidden"], heads=size["heads"],
                           grid=size["grid"], batch=size["batch"], threads=threads, depths=size["depths"], chunk=10)
    timed, median_ratio = depth.side_by_side(args)
    cfg, model, tokens = depth.build(args, "carry_last")  # (in its reading's precision: study.models.precision)
    x = model.embed(tokens)
    flops = step_flops(model, model.init_state(x), x)
    deep = max(size["depths"])
    out = {"flops_per_step": flops, "layers_per_step": cfg.layers_per_step}
    for rule, readings in timed.items():
        r = next(r for r in readings if r["depth_layers"] == deep)
        steps = deep // cfg.layers_per_step
        out[rule] = {"depth_layers": deep, "seconds": r["seconds"], "layers_per_s": r["layers_per_s"],
                     "tflops": flops * steps / r["seconds"] / 1e12}
    out["infiloop_time_ratio"] = median_ratio  # over paired turns (bench/depth.py)
    out["infiloop_time_ratio_of_totals"] = out["infiloop"]["seconds"] / out["carry_last"]["seconds"]
    return out


def training_check(size: dict, device: str, steps: int) -> dict:
    """Part 2: optimizer steps per second of the trainer at `size` (random boards: throughput only)."""
    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from study.config import ModelConfig, TaskConfig, TrainConfig
    from study.models.reasoner import build_reasoner
    from study.tasks import TASKS, Split
    from study.tasks.loader import Task
    from study.trial.train import Trainer

    g = size["grid"]
    tcfg = TaskConfig(size=g, blanks=(2, 4), n_train=max(1024, size["batch"]), n_test=16, augment=False)
    spec = TASKS["sudoku"].spec(tcfg)
    rng = np.random.default_rng(0)
    boards = rng.integers(2, g + 2, size=(tcfg.n_train, g * g))
    task = Task(spec, Split(boards, boards, np.zeros(len(boards), np.int64)), Split(boards[:16], boards[:16],
                                                                                     np.zeros(16, np.int64)), tcfg)
    mcfg = ModelConfig(hidden=size["hidden"], heads=size["heads"], n_layers=2, H=3, L=6)
    model = build_reasoner(mcfg, spec)
    train = TrainConfig(steps=10**6, batch_size=size["batch"], n_sup=4, device=device, dtype=size["dtype"],
                        warmup=1)
    trainer = Trainer(model, task, train, seed=0)
    trainer.train_batch()  # warm-up: allocator, kernels
    with FlopCounterMode(display=False) as counter:
        trainer.train_batch()
    flops_per_step = counter.get_total_flops() / train.n_sup
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    start = trainer.step
    while trainer.step - start < steps:
        trainer.train_batch()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    done = trainer.step - start
    return {"steps": done, "seconds": seconds, "steps_per_s": done / seconds, "flops_per_step": flops_per_step,
            "tflops": flops_per_step * done / seconds / 1e12, "params": sum(p.numel() for p in model.parameters())}


def shared_gpu_check(device: str, work: Path, address: str | None) -> dict:
    """Part 3: two trials of a tiny spec through `loopstudy run` (embedded Ray, or the cluster at `address`), half
    a GPU each."""
    import polars as pl

    from study.store import Store

    gpu = device.startswith("cuda")
    spec = {"name": "gpu_share", "task": {"name": "sudoku", "size": 4, "blanks": [6, 8], "n_train": 256,
                                          "n_test": 32},
            "model": {"hidden": 32, "heads": 2, "n_layers": 1, "H": 2, "L": 2},
            "train": {"steps": 60 if gpu else 8, "batch_size": 32, "warmup": 2, "n_sup": 2, "log_every": 10,
                      "device": "cuda" if gpu else "cpu"},
            "eval": {"depths": [6, 12]},
            "sweep": {"grid": {"model.carry.rule": ["carry_last", "infiloop"]}},
            "resources": {"cpu": 1, "gpu": 0.5 if gpu else 0}}
    path = work / "gpu_share.yaml"
    path.write_text(yaml.safe_dump(spec))
    root = work / "store"
    t0 = time.perf_counter()
    where = ["--address", address] if address else []
    proc = subprocess.run([sys.executable, "-m", "study.cli", "run", str(path), "--store", str(root), "--no-plot",
                           *where], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"ok": False, "stderr": proc.stderr[-2000:]}
    trials = Store(root).scan("trials", "gpu_share").select("trial_id", "started", "ended", "device").collect()
    spans = trials.sort("started").rows(named=True)
    overlap = len(spans) == 2 and spans[1]["started"] < spans[0]["ended"]
    return {"ok": trials.height == 2 and Store(root).completed_trials("gpu_share") == set(trials["trial_id"]),
            "trials": trials.height, "devices": sorted(set(trials["device"])), "ran_concurrently": overlap,
            "resources_gpu": spec["resources"]["gpu"], "wall_s": wall,
            "depth_rows": Store(root).scan("depth_eval", "gpu_share").select(pl.len()).collect().item()}


def multi_worker_check(work: Path) -> dict:
    """Part 5: one spec trained by 2 workers of one GPU each and by 1 (two stores, the same trial id)."""
    import numpy as np
    import torch

    from study.store import Store

    if torch.cuda.device_count() < 2:
        return {"skipped": f"{torch.cuda.device_count()} GPU(s): the multi-worker path needs 2"}
    spec = {"name": "gpu_workers", "task": {"name": "sudoku", "size": 4, "blanks": [6, 8], "n_train": 256,
                                            "n_test": 32},
            "model": {"hidden": 64, "heads": 2, "n_layers": 1, "H": 2, "L": 2},
            "train": {"steps": 40, "batch_size": 32, "warmup": 2, "n_sup": 2, "log_every": 10, "device": "cuda"},
            "eval": {"depths": [6, 12]}, "sweep": {"variants": [{"name": "trm"}]}}
    out = {}
    for workers in (2, 1):
        path, root = work / f"w{workers}.yaml", work / f"store{workers}"
        path.write_text(yaml.safe_dump({**spec, "resources": {"cpu": 1, "gpu": 1, "workers": workers}}))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "study.cli", "run", str(path), "--store", str(root),
                               "--no-plot"], cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            return {"ok": False, "workers": workers, "stderr": proc.stderr[-2000:]}
        trials = Store(str(root)).scan("trials", "gpu_workers").collect()
        curve = Store(str(root)).scan("train_curve", "gpu_workers").collect().sort("step")
        out[workers] = {"wall_s": time.perf_counter() - t0, "workers_column": trials["workers"].to_list(),
                        "status": trials["status"].to_list(), "loss": curve["loss"].to_list()}
    gap = float(np.max(np.abs(np.array(out[2]["loss"]) - np.array(out[1]["loss"]))))
    return {"ok": out[2]["workers_column"] == [2] and out[2]["status"] == ["complete"] and gap < 1e-3,
            "max_loss_gap": gap, "two_workers": out[2], "one_worker": out[1]}


def compile_check(size: dict, device: str) -> dict:
    """Part 4: evaluate() with and without eval.compile on the same weights; compile time reported apart."""
    import dataclasses

    import numpy as np
    import torch

    from study.config import EvalConfig, ModelConfig, TaskConfig
    from study.evaluate import evaluate
    from study.models.reasoner import build_reasoner
    from study.tasks import TASKS, Split
    from study.tasks.loader import Task

    g = size["grid"]
    tcfg = TaskConfig(size=g, blanks=(2, 4), n_train=16, n_test=size["batch"], augment=False)
    spec = TASKS["sudoku"].spec(tcfg)
    boards = np.random.default_rng(1).integers(2, g + 2, size=(size["batch"], g * g))
    task = Task(spec, Split(boards, boards, np.zeros(len(boards), np.int64)),
                Split(boards, boards, np.full(len(boards), 3, np.int64)), tcfg)
    mcfg = ModelConfig(hidden=size["hidden"], heads=size["heads"], n_layers=2, H=6, L=12)
    torch.manual_seed(0)
    model = build_reasoner(mcfg, spec).to(device)
    depth = mcfg.layers_per_step * (40 if device.startswith("cuda") else 4)
    ev = EvalConfig(depths=[depth], batch_size=size["batch"])
    out = {}
    for name, cfg in (("eager", ev), ("compiled", dataclasses.replace(ev, compile=True))):
        t0 = time.perf_counter()
        first = evaluate(model, task, cfg, device, dtype=size["dtype"])  # compiled: includes compiling
        t1 = time.perf_counter()
        second = evaluate(model, task, cfg, device, dtype=size["dtype"])
        t2 = time.perf_counter()
        out[name] = {"first_s": t1 - t0, "seconds": t2 - t1,
                     "exact_acc": [r.exact_acc for r in second.depth if r.difficulty is None]}
        assert first.depth[0].n == second.depth[0].n
    out["depth_layers"] = depth
    out["speedup"] = out["eager"]["seconds"] / out["compiled"]["seconds"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (CI)")
    p.add_argument("--train-steps", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--address", default=None, help="the Ray cluster for part 3's run (default: an embedded Ray)")
    args = p.parse_args()
    import torch

    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA GPU here; run with --cpu-smoke for the CPU path")
    size = SMOKE if args.cpu_smoke else PAPER
    out: dict = {"bench": "gpu_check", "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                 "size": size, "torch": torch.__version__}
    peak = peak_tflops(device)
    t_all = time.perf_counter()
    out["rollout"] = rollout_check(size, device, args.threads)
    print(json.dumps({"rollout": out["rollout"]}), flush=True)
    out["training"] = training_check(size, device, 3 if args.cpu_smoke else args.train_steps)
    print(json.dumps({"training": out["training"]}), flush=True)
    with tempfile.TemporaryDirectory() as d:
        out["shared_gpu_run"] = shared_gpu_check(device, Path(d), args.address)
    print(json.dumps({"shared_gpu_run": out["shared_gpu_run"]}), flush=True)
    out["eval_compile"] = compile_check(size, device)
    print(json.dumps({"eval_compile": out["eval_compile"]}), flush=True)
    if device == "cuda":
        with tempfile.TemporaryDirectory() as d:
            out["multi_worker_run"] = multi_worker_check(Path(d))
        print(json.dumps({"multi_worker_run": out["multi_worker_run"]}), flush=True)
    out["peak_bf16_tflops"] = peak
    if peak:
        best = max(out["rollout"]["carry_last"]["tflops"], out["rollout"]["infiloop"]["tflops"])
        out["rollout_fraction_of_peak"] = best / peak
        out["training_fraction_of_peak"] = out["training"]["tflops"] / peak
    out["targets"] = {"infiloop_time_ratio": 1.05, "rollout_fraction_of_peak": 0.30, "total_minutes": 8}
    out["total_s"] = time.perf_counter() - t_all
    print(json.dumps(out))


if __name__ == "__main__":
    main()
