"""Benchmark: analysis at scale, from Parquet alone.

1. A synthetic depth_eval of --rows rows in --files trial files (plus their trials rows), in the store's layout.
   The depth-scaling table (study.analysis.tables, explicit union schema) vs a plain
   `pl.read_parquet(glob).join(trials).group_by(...)` baseline, same run, best of --repeats. Target <= 1.5x.
2. Regenerating every figure of a small study (the same synthetic data, 12 trials) from Parquet. Target < 10 s.
The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from study.analysis import figures, tables
from study.config import TrialConfig, to_dict
from study.store import SCHEMAS, Store, config_row, trials_schema
from study.store.layout import table_dir

RULES = ("carry_last", "infiloop", "damped")


def write_study(root: Path, study: str, n_files: int, rows_per_file: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    depth_dir = Path(table_dir(str(root), "depth_eval", study))
    trial_dir = Path(table_dir(str(root), "trials", study))
    depth_dir.mkdir(parents=True)
    trial_dir.mkdir(parents=True)
    depths = np.array([468 * 2**k for k in range(6)])
    now = datetime(2026, 1, 1, tzinfo=UTC)
    base = config_row(to_dict(TrialConfig()))
    sch = SCHEMAS["depth_eval"]
    for i in range(n_files):
        tid = f"t{i:06d}"
        n = rows_per_file
        d = depths[np.arange(n) % len(depths)]
        diff = np.where(np.arange(n) < len(depths), -1, 45 + (np.arange(n) // len(depths)) % 16)
        cols = {
            "trial_id": pa.array([tid] * n), "schema_version": pa.array(np.ones(n, np.int32)),
            "depth_layers": pa.array(d), "outer_cycles": pa.array(d // 26),
            "difficulty": pa.array(diff, mask=diff < 0), "n": pa.array(np.full(n, 100)),
            "exact_acc": pa.array(rng.random(n)), "cell_acc": pa.array(rng.random(n)),
            "halted_frac": pa.array(np.zeros(n)), "eff_layers": pa.array(d.astype(float)),
            "flops": pa.array(d * 3.0e5), "rollout_s": pa.array(d * 1e-4),
        }
        cols |= {f.name: pa.nulls(n, f.type) for f in sch if f.name not in cols}  # ARC's pass@k: null here
        pq.write_table(pa.table(cols, schema=sch), depth_dir / f"{tid}.parquet")
        row = {**base, "model.carry.rule": RULES[i % 3], "seed": i // 3, "trial_id": tid, "schema_version": 1,
               "status": "complete", "params": 1, "started": now, "ended": now, "wall_s": 1.0, "device": "cpu"}
        pq.write_table(pa.Table.from_pylist([row], schema=trials_schema()), trial_dir / f"{tid}.parquet")


def baseline(root: Path, study: str) -> pl.DataFrame:
    depth = pl.read_parquet(f"{table_dir(str(root), 'depth_eval', study)}/*.parquet")
    trials = (pl.read_parquet(f"{table_dir(str(root), 'trials', study)}/*.parquet")
              .select("trial_id", "model.carry.rule"))
    return (depth.filter(pl.col("difficulty").is_null()).join(trials, on="trial_id")
            .group_by("model.carry.rule", "depth_layers")
            .agg(pl.col("exact_acc").mean(), pl.col("exact_acc").std().alias("std"), pl.len()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        t0 = time.perf_counter()
        write_study(root, "big", args.files, args.rows // args.files)
        gen_s = time.perf_counter() - t0
        store = Store(root)
        ours, base = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            table = tables.build_table(store, "big", "depth")
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ref = baseline(root, "big")
            base.append(time.perf_counter() - t0)
        assert table.height == ref.height
        write_study(root, "small", 12, 6 * 17)
        t0 = time.perf_counter()
        files = figures.plot(store, "small", "all", root / "figures")
        fig_s = time.perf_counter() - t0
    print(json.dumps({"bench": "analysis", "rows": args.rows, "files": args.files, "generate_s": gen_s,
                      "table_s": min(ours), "baseline_s": min(base), "ratio": min(ours) / min(base),
                      "target_ratio": 1.5, "figures": len(files), "figures_s": fig_s, "target_figures_s": 10}))


if __name__ == "__main__":
    main()
