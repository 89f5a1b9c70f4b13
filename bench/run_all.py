"""Run the CPU benchmarks once, at the sizes below, and write docs/benchmarks.md from that one run: the
commit, the machine, each benchmark's command, what it measured and its target. Each figure is a ratio of things
measured side by side in the same process (or a time against a stated target); nothing is carried over from an
earlier run. About 17 minutes on 2 cores.

    python bench/run_all.py                 # run them, rewrite the page
    python bench/run_all.py --only depth    # one of them (the page is rewritten with only it)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "benchmarks.md"
NOTES = """## Not in this run

- `python bench/depth.py` without `--time-only` adds memory: each rule alone in a fresh process at ~1k, 5k and 25k
  layers (InfiLoop's rollout state is O(d) per token at every depth; full attention residuals' grows with depth),
  and the 24,960-layer timing. Minutes on a CPU.
- `python bench/table_format.py` compares the store's one-file-per-trial layout with Delta Lake (needs
  `pip install deltalake`).
- `python bench/study_scale.py` at its defaults runs N = 1,000 and an Optuna search of 2,000 samples and fills a
  store of 10,000 trials (about an hour on 2 cores).

## The GPU path

GPU settings are configuration (`train.device: cuda`, `train.dtype: bf16`, `resources.gpu: 0.5` to share a GPU
between two trials, `eval.compile: true` for a compiled rollout, CUDA graphs on a GPU); a reading runs in
`eval.dtype` (default: `train.dtype`), bf16 as TRM's forward runs (a bf16 copy of the model). `python
bench/gpu_check.py` measures all of it on one GPU in one go (the paper-size rollout to 24,960 layers with achieved
TFLOP/s against the card's bf16 peak, bf16 training steps, a two-trial `loopstudy run` at half a GPU each, the
rollout with and without `eval.compile`) and ends with a JSON line; `--cpu-smoke` runs the same script at tiny size
on CPU, in the test suite. No GPU has run it yet.
"""


@dataclass(frozen=True)
class Bench:
    name: str
    args: list[str]
    what: str
    target: str
    measured: Callable[[dict], str]


def x(v: float) -> str:
    return f"**{v:.3f}x**"


BENCHES = [
    Bench("depth", ["bench/depth.py", "--time-only", "--repeats", "5", "--depths", "1040", "5200"],
          "InfiLoop (both axes) rollout time vs carry_last to 5,200 layers (H6 L12, hidden 64, 4x4, batch 8, 1 "
          "thread), side by side in one process: median over turns of 2 outer cycles, median of 5 such timings; the "
          "no-gradient CPU step is one fused kernel (study/models/infiloop_kernel.py)", "<= 1.03x",
          lambda r: x(r["infiloop_time_ratio_vs_carry_last"])),
    Bench("depth_b64", ["bench/depth.py", "--time-only", "--repeats", "5", "--depths", "1040", "5200", "--batch",
                        "64"],
          "the same at batch 64", "<= 1.02x", lambda r: x(r["infiloop_time_ratio_vs_carry_last"])),
    Bench("depth_bf16", ["bench/depth.py", "--time-only", "--repeats", "5", "--depths", "1040", "5200", "--dtype",
                         "bf16"],
          "the same at batch 8 in a bf16 reading (InfiLoop's sums in float32)", "<= 1.02x",
          lambda r: x(r["infiloop_time_ratio_vs_carry_last"])),
    Bench("depth_b64_bf16", ["bench/depth.py", "--time-only", "--repeats", "5", "--depths", "1040", "5200", "--batch",
                             "64", "--dtype", "bf16"],
          "the same at batch 64 in bf16", "<= 1.02x", lambda r: x(r["infiloop_time_ratio_vs_carry_last"])),
    Bench("heap", ["bench/heap.py"],
          "a carry_last rollout (batch 64, 1,560 layers) under glibc malloc's adaptive thresholds vs the fixed ones "
          "a trial's process sets (study/trial/heap.py): fresh processes taking turns, median over 5 pairs; page "
          "faults per layer", ">= 1.0x", lambda r: f"{x(r['adaptive_over_fixed'])}; faults per layer "
          f"{r['faults_per_layer']['adaptive']:.1f} vs {r['faults_per_layer']['fixed']:.2f}"),
    Bench("train_step", ["bench/train_step.py"],
          "loopstudy's training step (Trainer.train_batch) vs a bare PyTorch loop of the same model, batch and loss "
          "(hidden 256, batch 64, 1 thread); achieved FLOP/s against this CPU's matmul rate", "<= 1.05x",
          lambda r: f"{x(r['ratio'])}; {r['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s, "
                    f"{100 * r['share_of_matmul_rate']:.0f}% of the matmul rate"),
    Bench("train_step_bf16", ["bench/train_step.py", "--dtype", "bf16"],
          "the same in bf16 (autocast, against a bare loop under the same autocast)", "<= 1.05x",
          lambda r: f"{x(r['ratio'])}; {r['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s, "
                    f"{100 * r['share_of_matmul_rate']:.0f}% of the bf16 matmul rate"),
    Bench("data_parallel", ["bench/data_parallel.py"],
          "a trial's training on 2 data-parallel workers x 1 thread vs 1 worker x 1 thread, same global batch (64, "
          "hidden 256): samples per second, and the share of a 2-worker step waiting on the gradient exchange",
          ">= 1.7x", lambda r: f"{x(r['speedup'])}; exchange {100 * r['exchange_share']:.1f}% of a step"),
    Bench("eval_readings", ["bench/eval_readings.py"],
          "one rollout read at 5 depths vs a rollout to the deepest alone: the median over 7 rounds, each timing the "
          "two back to back in alternating order", "<= 1.05x", lambda r: x(r["ratio"])),
    Bench("eval_readings_bf16", ["bench/eval_readings.py", "--dtype", "bf16"],
          "the same in a bf16 reading", "<= 1.05x", lambda r: x(r["ratio"])),
    Bench("orchestration", ["bench/orchestration.py"],
          "Ray Tune: 40 trials x 2 s on embedded Ray with 2 CPUs, wall time over the 40 s minimum", "<= 1.25x",
          lambda r: f"{x(r['overhead_ratio'])} ({r['wall_s']:.1f} s)"),
    Bench("analysis", ["bench/analysis.py", "--rows", "1000000", "--files", "1000"],
          "depth table over 1M rows in 1,000 trial files vs plain read_parquet + join + group_by, same data; every "
          "figure of a 12-trial study from Parquet", "<= 1.5x; figures < 10 s",
          lambda r: f"{x(r['ratio'])} ({r['table_s']:.2f} s vs {r['baseline_s']:.2f} s); figures "
                    f"**{r['figures_s']:.1f} s** ({r['figures']} files)"),
    Bench("precision", ["bench/precision.py"],
          "bf16 against fp32 on this CPU: a reading of the published TRM-Att size from a `trm:` checkpoint (1,008 "
          "layers, 64 puzzles, eval.batch_size 64; the stored row's FLOPs over its rollout_s) and a training step "
          "(batch 32), each as a share of its precision's matmul rate measured in the same run; and both at the CPU "
          "showcase's size (hidden 64, 4x4)",
          "bf16 reading >= 60%; bf16 training >= 45%",
          lambda r: f"reading bf16 **{100 * r['reading']['bf16']['of_matmul']:.1f}%** of "
                    f"{r['matmul_gflops']['bf16']:.0f} GFLOP/s (fp32 {100 * r['reading']['fp32']['of_matmul']:.0f}% "
                    f"of {r['matmul_gflops']['fp32']:.0f}); training bf16 "
                    f"**{100 * r['training']['bf16']['of_matmul']:.1f}%** (fp32 "
                    f"{100 * r['training']['fp32']['of_matmul']:.0f}%); at the showcase's size bf16 takes "
                    f"{r['showcase']['bf16_over_fp32']['reading_s_per_sample']:.2f}x fp32's time to read, "
                    f"{r['showcase']['bf16_over_fp32']['training_s_per_step']:.2f}x to train"),
    Bench("sudoku_gen", ["bench/sudoku_gen.py"], "generate 1,000 9x9 sudokus with 54 blanks, unique, one process",
          "< 120 s", lambda r: f"**{r['seconds']:.1f} s**"),
    Bench("study_scale", ["bench/study_scale.py", "--sizes", "100", "300", "--store-trials", "2000", "--optuna", "0",
                          "--no-smoke"],
          "near-zero-work trials through `loopstudy run` vs a bare Tune function doing the same work (N = 100, "
          "300); finding the complete trials among 2,000; ls and table depth once compacted",
          "per-trial growth <= 1.2x; ours <= 1.3x bare; find < 0.5 s",
          lambda r: f"growth {x(r['per_trial_growth'])}, ours/bare {x(r['ours_over_bare_at_largest'])}, find "
                    f"**{r['find_complete_s']:.2f} s**, ls **{r['compacted_store']['cli_ls_s']:.2f} s**"),
]


def run(bench: Bench) -> tuple[dict, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *bench.args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise SystemExit(f"{bench.name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.perf_counter() - t0


def page(results: list[tuple[Bench, dict, float]]) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    lines = ["<!-- written by bench/run_all.py from one run: run it again, do not edit -->", "",
             "# Benchmarks", "",
             f"Commit `{commit}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs "
             f"({platform.machine()}, Python {platform.python_version()}), by `python bench/run_all.py`. Each "
             "benchmark ran once, here, at the size its command says; the last line each printed is kept below.", "",
             "| benchmark | command | measured | target | wall |", "|---|---|---|---|---|"]
    for b, r, wall in results:
        lines.append(f"| {b.what} | `python {' '.join(b.args)}` | {b.measured(r)} | {b.target} | {wall:.0f} s |")
    lines += ["", NOTES, "## Raw results", ""]
    for b, r, _ in results:
        lines += [f"`{b.name}`:", "", "```json", json.dumps(r, indent=1)[:4000], "```", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=[b.name for b in BENCHES], help="run these only")
    args = p.parse_args()
    results = []
    for b in BENCHES:
        if args.only and b.name not in args.only:
            continue
        print(f"[run_all] {b.name}: python {' '.join(b.args)}", file=sys.stderr, flush=True)
        r, wall = run(b)
        print(f"[run_all] {b.name}: {b.measured(r)} ({wall:.0f} s)", file=sys.stderr, flush=True)
        results.append((b, r, wall))
    PAGE.write_text(page(results))
    print(PAGE)


if __name__ == "__main__":
    main()
