"""Benchmark: test-time depth to 24,960 layers with carry_last, InfiLoop (both axes) and full_attnres.

Random weights, nested reasoner H6 L12 n_layers 2 (26 layers per outer cycle). For each rule a fresh subprocess
rolls out once to the deepest depth and takes readings at ~1k, 5k and 25k layers: layers/s so far, the bytes held
by the rollout state, and memory in use (CUDA: allocated bytes; CPU: resident set size). Rules alternate over
`--repeats` rounds in one run; each rule's best round counts. The last line printed is JSON.

  python bench/depth.py                      # CPU-small defaults
  python bench/depth.py --device cuda --hidden 512 --heads 8 --grid 9 --batch 256 --dtype bf16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

DEPTHS = (1040, 5200, 24960)  # 40, 200 and 960 outer cycles of 26 layers


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def state_bytes(state) -> int:
    tensors = [state.outer.h, *state.outer.aux.values()]
    if state.inner is not None:
        tensors += [state.inner.h, *state.inner.aux.values()]
    return sum(t.numel() * t.element_size() for t in tensors)


def run_one(args) -> dict:
    """Roll out one rule to the deepest depth (in this process) and return its readings."""
    import torch

    from study.models import CarryConfig, ModelConfig, build_reasoner

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = ModelConfig(hidden=args.hidden, heads=args.heads, n_layers=2, H=6, L=12,
                      carry=CarryConfig(rule=args.one, placement="both"))
    grid = (args.grid, args.grid)
    model = build_reasoner(cfg, vocab=args.grid + 2, seq_len=args.grid**2, grid=grid).to(device).eval()
    tokens = torch.randint(0, args.grid + 2, (args.batch, args.grid**2), device=device)
    depths = args.attnres_depths if args.one == "full_attnres" else args.depths
    targets = {cfg.steps_for_depth(d): d for d in depths}
    readings = []
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()

    def on_step(state):
        if state.steps in targets:
            sync()
            elapsed = time.perf_counter() - t0
            mem = torch.cuda.memory_allocated() if device.type == "cuda" else rss_bytes()
            layers = state.steps * cfg.layers_per_step
            readings.append({"depth_layers": layers, "seconds": elapsed, "layers_per_s": layers / elapsed,
                             "state_bytes": state_bytes(state), "memory_bytes": mem,
                             "finite": bool(torch.isfinite(state.outer.h).all())})

    with amp:
        model.rollout(tokens, max(targets), on_step=on_step)
    out = {"rule": args.one, "readings": readings}
    if device.type == "cuda":
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        out["gpu"] = torch.cuda.get_device_name()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--grid", type=int, default=4, help="grid side: 4 -> 4x4 board (16 tokens)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    p.add_argument("--attnres-depths", type=int, nargs="+", default=[260, 520, 1040, 2080],
                   help="full_attnres is O(T^2) in time: its own, shallower readings (memory growth shows early)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return

    passthrough = list(sys.argv[1:])
    best: dict[str, dict] = {}
    rounds = [("carry_last", "infiloop")] * args.repeats + [("full_attnres",)]
    for i, rules in enumerate(rounds):
        for rule in rules:
            proc = subprocess.run([sys.executable, __file__, *passthrough, "--one", rule],
                                  capture_output=True, text=True, check=True)
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            last = res["readings"][-1]
            print(f"round {i} {rule:13s} depth {last['depth_layers']:6d}: {last['layers_per_s']:9.0f} layers/s, "
                  f"state {last['state_bytes'] / 2**20:8.2f} MiB, memory {last['memory_bytes'] / 2**20:8.1f} MiB",
                  file=sys.stderr)
            if rule not in best or last["seconds"] < best[rule]["readings"][-1]["seconds"]:
                best[rule] = res

    def at(rule, depth, key):
        return next(r[key] for r in best[rule]["readings"] if r["depth_layers"] == depth)

    deep, shallow = max(args.depths), min(args.depths)
    summary = {
        "bench": "depth",
        "config": {k: getattr(args, k) for k in ("device", "dtype", "hidden", "heads", "grid", "batch", "threads")},
        "rules": best,
        "infiloop_time_ratio_vs_carry_last": at("infiloop", deep, "seconds") / at("carry_last", deep, "seconds"),
        "infiloop_memory_ratio_vs_carry_last": at("infiloop", deep, "memory_bytes")
        / at("carry_last", deep, "memory_bytes"),
        "infiloop_memory_deep_over_shallow": at("infiloop", deep, "memory_bytes")
        / at("infiloop", shallow, "memory_bytes"),
        "infiloop_state_bytes_deep_over_shallow": at("infiloop", deep, "state_bytes")
        / at("infiloop", shallow, "state_bytes"),
        "infiloop_finite_at_deepest": at("infiloop", deep, "finite"),
    }
    att = best["full_attnres"]["readings"]
    summary["full_attnres_state_bytes_growth"] = att[-1]["state_bytes"] / att[0]["state_bytes"]
    summary["full_attnres_depths"] = [r["depth_layers"] for r in att]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
