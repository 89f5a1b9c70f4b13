"""Benchmark: a rollout under glibc malloc's adaptive thresholds vs the fixed ones a trial's process sets
(study/trial/heap.py).

The thresholds are per process, so the two cannot share one: each rollout runs in a fresh process, the two kinds
taking turns (which goes first alternates), and the ratio is the median over pairs of the adaptive rollout's time
over the fixed one's. Page faults per layer are printed beside it: the adaptive thresholds' cost is memory handed
back to the kernel and faulted in again. bench/depth.py's model (H6 L12, hidden 64, 4x4), carry_last, 1 thread.
The last line printed is JSON.

  python bench/heap.py                 # batch 64, 5 pairs of 60 outer cycles (1,560 layers)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

KINDS = ("adaptive", "fixed")


def run_one(kind: str, batch: int, cycles: int) -> dict:
    """One rollout in this process: seconds and page faults per layer, after a warm-up rollout."""
    import torch

    from study.models import CarryConfig, ModelConfig, build_reasoner
    from study.tasks import TaskSpec
    from study.trial.heap import keep_freed_memory

    if kind == "fixed":
        keep_freed_memory()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = ModelConfig(hidden=64, heads=4, n_layers=2, H=6, L=12, carry=CarryConfig(rule="carry_last"))
    model = build_reasoner(cfg, TaskSpec("sudoku", 6, 16, (4, 4))).eval()
    tokens = torch.randint(0, 6, (batch, 16))
    with torch.no_grad():
        model.rollout(tokens, 4)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        model.rollout(tokens, cycles)
        seconds = time.perf_counter() - t0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    layers = cycles * cfg.layers_per_step
    return {"kind": kind, "seconds": seconds, "faults_per_layer": faults / layers}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--cycles", type=int, default=60, help="outer cycles per rollout (26 layers each)")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.batch, args.cycles)))
        return
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for i in range(args.pairs):
        for kind in KINDS if i % 2 == 0 else KINDS[::-1]:
            proc = subprocess.run([sys.executable, __file__, "--one", kind, "--batch", str(args.batch),
                                   "--cycles", str(args.cycles)], capture_output=True, text=True, check=True)
            runs[kind].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"pair {i + 1}/{args.pairs}: " + ", ".join(
            f"{k} {runs[k][-1]['seconds']:.2f} s ({runs[k][-1]['faults_per_layer']:.1f} faults/layer)"
            for k in KINDS), file=sys.stderr)
    ratios = [a["seconds"] / f["seconds"] for a, f in zip(runs["adaptive"], runs["fixed"], strict=True)]
    print(json.dumps({
        "bench": "heap",
        "config": {"batch": args.batch, "cycles": args.cycles, "pairs": args.pairs},
        "runs": runs,
        "adaptive_over_fixed": statistics.median(ratios),
        "faults_per_layer": {k: statistics.median(r["faults_per_layer"] for r in runs[k]) for k in KINDS},
    }))


if __name__ == "__main__":
    main()
