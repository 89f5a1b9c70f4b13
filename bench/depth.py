"""Benchmark: test-time depth to 24,960 layers with carry_last, InfiLoop (both axes) and full_attnres.

Random weights, nested reasoner H6 L12 n_layers 2 (26 layers per outer cycle), readings at ~1k, 5k and 25k layers.
- Memory: each rule rolls out alone in a fresh subprocess: the bytes held by the rollout state and memory in use
  (CUDA: allocated bytes; CPU: resident set size). full_attnres (O(T^2) time) gets its own shallower depths.
- Time: carry_last and InfiLoop roll out side by side in one process, taking turns every `--chunk` outer cycles,
  so both see the same machine; InfiLoop's time ratio is the median over turns (side_by_side says why), with the
  ratio of totals beside it; with --repeats N, the median of N such timings, each of freshly built models.
The last line printed is JSON.

  python bench/depth.py                      # CPU-small defaults
  python bench/depth.py --device cuda --hidden 512 --heads 8 --grid 9 --batch 256 --dtype bf16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEPTHS = (1040, 5200, 24960)  # 40, 200 and 960 outer cycles of 26 layers
PAIR = ("carry_last", "infiloop")  # timed side by side


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def state_bytes(state) -> int:
    tensors = [state.outer.h, *state.outer.aux.values()]
    if state.inner is not None:
        tensors += [state.inner.h, *state.inner.aux.values()]
    return sum(t.numel() * t.element_size() for t in tensors)


def build(args, rule: str):
    """The random-weight reasoner for one rule (seeded: every rule gets the same weights and tokens)."""
    import torch

    from study.models import CarryConfig, ModelConfig, build_reasoner
    from study.models.precision import reading_model
    from study.tasks import TaskSpec
    from study.trial.heap import keep_freed_memory

    keep_freed_memory()  # as in a trial's process
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = ModelConfig(hidden=args.hidden, heads=args.heads, n_layers=2, H=6, L=12,
                      carry=CarryConfig(rule=rule, placement="both"))
    grid = (args.grid, args.grid)
    model = build_reasoner(cfg, TaskSpec("sudoku", args.grid + 2, args.grid**2, grid)).to(device).eval()
    tokens = torch.randint(0, args.grid + 2, (args.batch, args.grid**2), device=device)
    model = reading_model(model, args.device, args.dtype)  # bf16: as a reading runs it (study.models.precision)
    return cfg, model, tokens


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def run_one(args) -> dict:
    """Roll out one rule to the deepest depth (alone in this process): memory and state readings."""
    import torch

    cfg, model, tokens = build(args, args.one)
    device = tokens.device
    depths = args.attnres_depths if args.one == "full_attnres" else args.depths
    targets = {cfg.steps_for_depth(d): d for d in depths}
    readings = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    t0 = time.perf_counter()

    def on_step(state):
        if state.steps in targets:
            sync(device)
            elapsed = time.perf_counter() - t0
            mem = torch.cuda.memory_allocated() if device.type == "cuda" else rss_bytes()
            layers = state.steps * cfg.layers_per_step
            readings.append({"depth_layers": layers, "seconds": elapsed, "layers_per_s": layers / elapsed,
                             "state_bytes": state_bytes(state), "memory_bytes": mem,
                             "finite": bool(torch.isfinite(state.outer.h).all())})

    model.rollout(tokens, max(targets), on_step=on_step)
    out = {"rule": args.one, "readings": readings}
    if device.type == "cuda":
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        out["gpu"] = torch.cuda.get_device_name()
    return out


def side_by_side(args) -> tuple[dict, float]:
    """Time carry_last and InfiLoop in one process, alternating chunks of `--chunk` steps (and which goes first).

    A shared machine drifts over a minute-long rollout; run back to back, one rule would get the quiet minute and
    the other the busy one. Interleaved, both see the same conditions. Returns the cumulative readings and the
    median over rounds of InfiLoop's chunk time over carry_last's: a burst of load from a neighbour lands in one
    rule's chunk of one round and moves a total, but not that median, which is the carry's cost.
    """
    import torch

    runs = {rule: build(args, rule) for rule in PAIR}
    cfg = runs[PAIR[0]][0]
    targets = sorted(cfg.steps_for_depth(d) for d in args.depths)
    device = runs[PAIR[0]][2].device
    seconds = dict.fromkeys(PAIR, 0.0)
    readings: dict[str, list] = {rule: [] for rule in PAIR}
    round_ratios = []
    with torch.no_grad():
        states, inputs = {}, {}
        for rule, (_, model, tokens) in runs.items():
            inputs[rule] = model.embed(tokens)
            states[rule] = model.init_state(inputs[rule])
            model.step(model.step(states[rule], inputs[rule]), inputs[rule])  # warm-up, not timed or kept
        done, chunk_i = 0, 0
        while done < targets[-1]:
            n = min(args.chunk, next(t for t in targets if t > done) - done)
            order = PAIR if chunk_i % 2 == 0 else PAIR[::-1]
            took = {}
            for rule in order:
                _, model, _ = runs[rule]
                sync(device)
                t0 = time.perf_counter()
                for _ in range(n):
                    states[rule] = model.step(states[rule], inputs[rule])
                sync(device)
                took[rule] = time.perf_counter() - t0
                seconds[rule] += took[rule]
            round_ratios.append(took["infiloop"] / took["carry_last"])
            done += n
            chunk_i += 1
            if done in targets:
                layers = done * cfg.layers_per_step
                for rule in PAIR:
                    readings[rule].append({"depth_layers": layers, "seconds": seconds[rule],
                                           "layers_per_s": layers / seconds[rule]})
                print(f"side by side, depth {layers:6d}: " + ", ".join(
                    f"{r} {seconds[r]:7.1f} s" for r in PAIR), file=sys.stderr)
    return readings, statistics.median(round_ratios)


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
    p.add_argument("--chunk", type=int, default=2, help="outer cycles per turn in the side-by-side timing")
    p.add_argument("--repeats", type=int, default=1,
                   help="side-by-side timings, each of fresh models; the ratio is the median of their medians (a "
                        "process's memory layout can favour one rule for a whole timing)")
    p.add_argument("--time-only", action="store_true",
                   help="only the side-by-side timing (skips the memory runs: a third of the time)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return

    # Memory: each rule alone in a fresh process (resident memory is per process).
    passthrough = [a for a in sys.argv[1:] if a != "--time-only"]
    alone: dict[str, dict] = {}
    for rule in () if args.time_only else (*PAIR, "full_attnres"):
        proc = subprocess.run([sys.executable, __file__, *passthrough, "--one", rule],
                              capture_output=True, text=True, check=True)
        alone[rule] = json.loads(proc.stdout.strip().splitlines()[-1])
        last = alone[rule]["readings"][-1]
        print(f"alone {rule:13s} depth {last['depth_layers']:6d}: {last['layers_per_s']:9.0f} layers/s, "
              f"state {last['state_bytes'] / 2**20:8.2f} MiB, memory {last['memory_bytes'] / 2**20:8.1f} MiB",
              file=sys.stderr)
    # Time: the pair side by side in this process.
    repeats = [side_by_side(args) for _ in range(max(1, args.repeats))]
    timed = repeats[-1][0]
    median_ratio = statistics.median(r for _, r in repeats)

    def at(readings, depth, key):
        return next(r[key] for r in readings if r["depth_layers"] == depth)

    deep, shallow = (max(args.depths), min(args.depths))
    summary = {
        "bench": "depth",
        "config": {k: getattr(args, k) for k in ("device", "dtype", "hidden", "heads", "grid", "batch", "threads",
                                                 "chunk", "repeats")},
        "side_by_side": timed,
        "alone": alone,
        "infiloop_time_ratio_vs_carry_last": median_ratio,
        "infiloop_time_ratio_per_repeat": [r for _, r in repeats],
        "infiloop_time_ratio_of_totals": at(timed["infiloop"], deep, "seconds")
        / at(timed["carry_last"], deep, "seconds"),
    }
    if args.time_only:
        print(json.dumps(summary))
        return
    mem = {rule: alone[rule]["readings"] for rule in PAIR}
    summary |= {
        "infiloop_memory_ratio_vs_carry_last": at(mem["infiloop"], deep, "memory_bytes")
        / at(mem["carry_last"], deep, "memory_bytes"),
        "infiloop_memory_deep_over_shallow": at(mem["infiloop"], deep, "memory_bytes")
        / at(mem["infiloop"], shallow, "memory_bytes"),
        "infiloop_state_bytes_deep_over_shallow": at(mem["infiloop"], deep, "state_bytes")
        / at(mem["infiloop"], shallow, "state_bytes"),
        "infiloop_finite_at_deepest": at(mem["infiloop"], deep, "finite"),
    }
    att = alone["full_attnres"]["readings"]
    summary["full_attnres_state_bytes_growth"] = att[-1]["state_bytes"] / att[0]["state_bytes"]
    summary["full_attnres_depths"] = [r["depth_layers"] for r in att]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
