"""Benchmark: readings and training steps in bf16 against fp32, as fractions of this CPU's own matmul rates.

Side by side in one run:
  1. this CPU's matmul rate, fp32 and bf16: (6208 x 512) @ (512 x 2048), 6208 rows = 64 puzzles x 97 positions;
  2. a reading of the published TRM-Att size (hidden 512, 8 heads, 2 layers, H3 L6, 16-position prefix, 9x9 Sudoku)
     from a TRM-format checkpoint (`model.init_from: trm:PATH`, random weights at TRM's init scale), through
     `loopstudy trial` to the requested layers, with eval.dtype fp32 and bf16: the rate is the stored depth row's
     own FLOPs over its rollout_s (both per sample);
  3. a training step of that model (one supervision step, `Trainer.train_batch`), fp32 and bf16 (train.dtype):
     its FLOPs (torch.utils.flop_counter, forward and backward) over its best time.
  4. the CPU showcase's size (search_spaces/cpu/trm_factors.yaml: TRM-Att at hidden 64, 4 heads, H2 L2, 4x4
     Sudoku, batch 64, one thread as its trials run), where elementwise work and casts, not matmuls, fill a layer: a
     reading to 1,200 layers of 64 puzzles and 40 training steps, fp32 and bf16, twice each in the order fp32,
     bf16, bf16, fp32, each side's best time, and bf16's time over fp32's (above 1: bf16 is slower there).
Each rate is printed beside its precision's matmul rate; targets: a bf16 reading >= 60% of the bf16 matmul rate, a
bf16 training step >= 45%. The last line printed is JSON.

    python bench/precision.py                          # 1,008 layers, 64 puzzles, batch 64, training batch 32
    python bench/precision.py --layers 112 --puzzles 16   # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
ARCH = {"name": "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1", "hidden_size": 512, "num_heads": 8,
        "expansion": 4, "H_cycles": 3, "L_cycles": 6, "L_layers": 2, "H_layers": 0, "pos_encodings": "rope",
        "puzzle_emb_ndim": 512, "puzzle_emb_len": 16, "halt_max_steps": 16, "halt_exploration_prob": 0.1}


def matmul_rate(dtype: torch.dtype, rows: int = 6208, repeats: int = 20) -> float:
    """GFLOP/s of (rows x 512) @ (512 x 2048) in `dtype`, the best of three rounds."""
    a, b = torch.randn(rows, 512).to(dtype), torch.randn(512, 2048).to(dtype)
    a @ b  # warm-up
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * rows * 512 * 2048 * repeats / best / 1e9


def checkpoint(folder: Path) -> Path:
    """A TRM-Att checkpoint of the published size in TRM's format, every tensor at TRM's init scale."""
    g = torch.Generator().manual_seed(0)
    d, vocab = 512, 11
    width = 256 * math.ceil(round(4 * d * 2 / 3) / 256)

    def lecun(out: int, fan_in: int) -> torch.Tensor:
        return (torch.randn(out, fan_in, generator=g) / math.sqrt(fan_in)).clamp(-2 / math.sqrt(fan_in),
                                                                                  2 / math.sqrt(fan_in))

    t = {"H_init": torch.randn(d, generator=g), "L_init": torch.randn(d, generator=g),
         "embed_tokens.embedding_weight": lecun(vocab, d), "lm_head.weight": lecun(vocab, d),
         "q_head.weight": torch.zeros(2, d), "q_head.bias": torch.full((2,), -5.0),
         "puzzle_emb.weights": torch.zeros(1, d)}
    for i in range(2):
        p = f"L_level.layers.{i}."
        t |= {p + "self_attn.qkv_proj.weight": lecun(3 * d, d), p + "self_attn.o_proj.weight": lecun(d, d),
              p + "mlp.gate_up_proj.weight": lecun(2 * width, d), p + "mlp.down_proj.weight": lecun(d, width)}
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"_orig_mod.model.inner." + k: v for k, v in t.items()}, folder / "step_0")
    (folder / "all_config.yaml").write_text(yaml.safe_dump({"arch": ARCH}))
    return folder / "step_0"


def trial_store(path: Path, config: dict):
    """`loopstudy trial` of `config` (written to PATH.yaml), its rows in the store at PATH."""
    from study.store import Store

    path.with_suffix(".yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "study.cli", "trial", str(path.with_suffix(".yaml")), "--store",
                           str(path)], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return Store(path)


def reading_rate(ckpt: Path, folder: Path, dtype: str, layers: int, puzzles: int, batch: int) -> dict:
    """One reading through `loopstudy trial`: the stored row's FLOPs per sample over its rollout_s per sample."""
    import polars as pl

    store = trial_store(folder / f"read_{dtype}", {
        "task": {"name": "sudoku", "size": 9, "n_train": 1, "n_test": puzzles},
        "model": {"init_from": f"trm:{ckpt}"}, "train": {"steps": 0},
        "eval": {"depths": [layers], "batch_size": batch, "dtype": dtype}})
    row = pl.from_arrow(store.read("depth_eval", "adhoc")).filter(
        pl.col("difficulty").is_null() & (pl.col("depth_layers") == layers)).row(0, named=True)
    return {"exact_acc": row["exact_acc"], "cell_acc": row["cell_acc"], "flops_per_sample": row["flops"],
            "rollout_s_per_sample": row["rollout_s"], "gflops": row["flops"] / row["rollout_s"] / 1e9}


def training_rate(dtype: str, batch: int, rounds: int = 3) -> dict:
    """One supervision step of the TRM-Att size (Trainer.train_batch), its FLOPs over its best time."""
    from study.config import ModelConfig, TaskConfig, TrainConfig
    from study.models.reasoner import build_reasoner
    from study.tasks.loader import load_task
    from study.trial.train import Trainer

    keys = dict(hidden=512, heads=8, n_layers=2, H=3, L=6, norm="post", conv=False, pos="rope",
                swiglu_multiple=256, init="trunc_lecun", init_states="fixed", head_norm=False, puzzle_prefix=16,
                q_head=True)
    task_cfg = TaskConfig(name="sudoku", size=9, n_train=batch, n_test=1)
    task = load_task(task_cfg)
    torch.manual_seed(0)
    model = build_reasoner(ModelConfig(**keys), task.spec)
    cfg = TrainConfig(steps=rounds + 10, batch_size=batch, n_sup=1, dtype=dtype, warmup=1, ema=0.0)
    trainer = Trainer(model, task, cfg, seed=0)
    trainer.train_batch()  # warm-up
    with FlopCounterMode(display=False) as counter:
        trainer.train_batch()
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        trainer.train_batch()
        best = min(best, time.perf_counter() - t0)
    return {"step_s": best, "gflops": counter.get_total_flops() / best / 1e9}


SHOWCASE = {"task": {"name": "sudoku", "size": 4, "blanks": [8, 12], "n_train": 3000, "n_test": 64},
            "model": {"kind": "nested", "hidden": 64, "heads": 4, "n_layers": 2, "H": 2, "L": 2, "norm": "post",
                      "conv": False, "pos": "rope", "swiglu_multiple": 256, "init": "trunc_lecun",
                      "init_states": "fixed", "head_norm": False, "puzzle_prefix": 16, "q_head": True},
            "train": {"batch_size": 64, "optimizer": "adam_atan2", "lr": 0.003, "warmup": 30, "n_sup": 4,
                      "act": "no_continue", "loss": "stablemax", "ema": 0.98, "log_every": 10,
                      "threads": 1}}  # as the showcase's trials run: one thread each, two trials at a time


def showcase_times(folder: Path, dtype: str, run: int = 0, layers: int = 1200, steps: int = 40) -> dict:
    """The showcase's size through `loopstudy trial`: the stored reading's rollout_s per sample, and the mean of the
    stored training curve's seconds (one ACT step each, logged every 10th)."""
    import polars as pl

    store = trial_store(folder / f"showcase_{dtype}_{run}", {
        **SHOWCASE, "train": {**SHOWCASE["train"], "steps": steps, "dtype": dtype},
        "eval": {"depths": [layers], "batch_size": 64, "dtype": dtype}})
    row = pl.from_arrow(store.read("depth_eval", "adhoc")).filter(pl.col("difficulty").is_null()).row(0, named=True)
    curve = pl.from_arrow(store.read("train_curve", "adhoc"))
    return {"reading_s_per_sample": row["rollout_s"], "training_s_per_step": float(curve["seconds"].mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1008, help="the reading's depth (a multiple of 14)")
    ap.add_argument("--puzzles", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64, help="eval.batch_size")
    ap.add_argument("--train-batch", type=int, default=32)
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--skip-showcase", action="store_true", help="leave out part 4, the showcase's size")
    args = ap.parse_args()
    from study.models.precision import cpu_has_bf16_units

    out = {"threads": torch.get_num_threads(), "bf16_units": cpu_has_bf16_units(),
           "matmul_gflops": {"fp32": matmul_rate(torch.float32), "bf16": matmul_rate(torch.bfloat16)},
           "reading": {}, "training": {}}
    print(f"matmul (6208 x 512) @ (512 x 2048): fp32 {out['matmul_gflops']['fp32']:.0f} GFLOP/s, bf16 "
          f"{out['matmul_gflops']['bf16']:.0f} GFLOP/s ({out['threads']} threads)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint(Path(tmp) / "ckpt")
        for dtype in ("fp32", "bf16"):
            r = reading_rate(ckpt, Path(tmp), dtype, args.layers, args.puzzles, args.batch)
            r["of_matmul"] = r["gflops"] / out["matmul_gflops"][dtype]
            out["reading"][dtype] = r
            print(f"reading {dtype}: {r['gflops']:.0f} GFLOP/s = {r['of_matmul']:.0%} of the {dtype} matmul rate; "
                  f"{r['rollout_s_per_sample']:.2f} s per puzzle to {args.layers} layers; cell_acc "
                  f"{r['cell_acc']:.4f}", flush=True)
    if not args.skip_training:
        for dtype in ("fp32", "bf16"):
            r = training_rate(dtype, args.train_batch)
            r["of_matmul"] = r["gflops"] / out["matmul_gflops"][dtype]
            out["training"][dtype] = r
            print(f"training step {dtype}: {r['step_s']:.2f} s, {r['gflops']:.0f} GFLOP/s = {r['of_matmul']:.0%} "
                  f"of the {dtype} matmul rate", flush=True)
    if not args.skip_showcase:
        with tempfile.TemporaryDirectory() as tmp:
            # fp32, bf16, bf16, fp32: a slow stretch of a shared machine falls on both; each side's best counts
            runs = [(dtype, showcase_times(Path(tmp), dtype, i))
                    for i, dtype in enumerate(("fp32", "bf16", "bf16", "fp32"))]
            got = {dtype: {k: min(r[k] for d, r in runs if d == dtype) for k in runs[0][1]}
                   for dtype in ("fp32", "bf16")}
        out["showcase"] = {**got, "bf16_over_fp32": {k: got["bf16"][k] / got["fp32"][k] for k in got["fp32"]}}
        ratio = out["showcase"]["bf16_over_fp32"]
        print(f"showcase size (hidden 64, 4x4): bf16 takes {ratio['reading_s_per_sample']:.2f}x fp32's time to "
              f"read, {ratio['training_s_per_step']:.2f}x to train", flush=True)
    bf16 = out["reading"]["bf16"]
    out["hours_1000_puzzles_24960_layers_bf16"] = bf16["rollout_s_per_sample"] * 1000 * 24960 / args.layers / 3600
    print(f"1,000 puzzles to 24,960 layers in bf16 here: {out['hours_1000_puzzles_24960_layers_bf16']:.1f} h")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
