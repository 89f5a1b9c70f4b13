"""Benchmark: reading a published TRM-size model at depth on a CPU (docs/published.md).

Builds the model of search_spaces/paper/trm_att.yaml and trm_mlp.yaml (hidden 512, 2 layers, H3 L6: 14 layers per
outer cycle, ~7M parameters, as a released checkpoint of them is) on 9x9 Sudoku, random weights (the time does
not depend on their values), and times rollouts without gradient: seconds per 1,000 executed layers at each batch
size, after one warm-up rollout. The last line printed is JSON.

  python bench/published.py                  # one puzzle at a time, 1,008 layers per model
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from study.models.reasoner import build_reasoner
from study.spec import load_study
from study.tasks import TASKS
from study.trial.heap import keep_freed_memory

SPECS = {"trm_att": "search_spaces/paper/trm_att.yaml", "trm_mlp": "search_spaces/paper/trm_mlp.yaml"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1])
    ap.add_argument("--cycles", type=int, default=72, help="outer cycles per timed rollout (72 x 14 = 1,008 layers)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as a trial's process does (study/trial/heap.py)
    out = {"threads": args.threads, "models": {}}
    for name, path in SPECS.items():
        cfg = load_study(path).trials[0]
        model = build_reasoner(cfg.model, TASKS[cfg.task.name].spec(cfg.task)).eval()
        layers = args.cycles * cfg.model.layers_per_step
        row = {"params": sum(p.numel() for p in model.parameters()), "layers": layers}
        for batch in args.batches:
            tokens = torch.randint(1, 11, (batch, 81))
            model.rollout(tokens, 2)  # warm-up
            t0 = time.perf_counter()
            model.logits(model.rollout(tokens, args.cycles))
            row[f"s_per_1000_layers_batch_{batch}"] = (time.perf_counter() - t0) * 1000 / layers
        out["models"][name] = row
        print(f"{name}: {row['params']:,} parameters; " + ", ".join(
            f"batch {b}: {row[f's_per_1000_layers_batch_{b}']:.2f} s per 1,000 layers" for b in args.batches),
            flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
