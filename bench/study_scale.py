"""Benchmark: bookkeeping at thousands of trials. Prints a final JSON line.

1. N trials of a near-zero-work config (one training step of a tiny reasoner, one shallow reading, five Parquet
   files) through the real `loopstudy run` path (embedded Ray, a subprocess, as a user runs it), against the same
   N trials of a bare Tune function doing the same work (run_trial into a store; Tune with actor reuse and nothing
   else of ours), side by side, for each N in --sizes. Per-trial time = (last trial end - first trial start) / N,
   from the trials' own timestamps, so Ray's start-up and the closing table do not blur it.
   Targets: per-trial time at the largest N <= 1.2x the smallest; ours <= 1.3x bare Tune's at the largest N (also
   reported on whole wall times, Ray start-up and the closing table included).
2. Finding the complete trials among --store-trials (10,000) trial files (Store.completed_trials: what the
   driver does once per run). Target <= 0.5 s.
   Then `loopstudy compact` (what `loopstudy run` does at 500 per-trial files) and ls / table on the 10,000.
3. An Optuna search of --optuna (2,000) samples of the same config through `loopstudy run`.
4. (--smoke) `loopstudy run search_spaces/smoke.yaml` into that store (--store-trials complete trials of study
   `smoke`, compacted), against the same run into an empty store. Target <= 1.3x.

    python bench/study_scale.py                      # sizes 100 and 1000, Optuna 2000, 10,000-trial store (~20 min)
    python bench/study_scale.py --sizes 50 200 --optuna 0 --store-trials 2000 --no-smoke   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

TINY = {
    "task": {"name": "sudoku", "size": 4, "blanks": [6, 8], "n_train": 32, "n_test": 4},
    "model": {"kind": "nested", "hidden": 8, "heads": 1, "n_layers": 1, "H": 1, "L": 1, "grad_steps": 1},
    "train": {"steps": 1, "batch_size": 4, "warmup": 1, "n_sup": 1, "log_every": 1, "checkpoint_every": 0},
    "eval": {"depths": [2], "batch_size": 4, "perturb_update": None},
}

BARE = """
import json, sys
from ray import tune
from study.config import build_trial
from study.run.session import init_ray
from study.store import Store
from study.trial.execute import TrialContext, run_trial

def bare(config):
    metrics, _ = run_trial(build_trial(config["trial"]), context=TrialContext(Store(config["store"]), "bare"))
    tune.report(metrics)

root, n = sys.argv[1], int(sys.argv[2])
init_ray(None, num_cpus=2)
trials = [{**json.loads(sys.argv[3]), "seed": i} for i in range(n)]
tune.Tuner(tune.with_resources(bare, {"cpu": 1}),
           param_space={"trial": tune.grid_search(trials), "store": root},
           tune_config=tune.TuneConfig(reuse_actors=True),
           run_config=tune.RunConfig(name="bare", storage_path=root + "/_tune", verbose=0)).fit()
"""


def span_per_trial(root: str, study: str, n: int) -> float:
    """(last end - first start) / n over the study's complete trials, from the trials table."""

    from study.store import Store

    t = Store(root).scan("trials", study).select("started", "ended").collect()
    assert t.height == n, f"{study}: {t.height} trials complete, expected {n}"
    return (t["ended"].max() - t["started"].min()).total_seconds() / n


def run_ours(n: int, workdir: Path, optuna: bool = False) -> tuple[float, float]:
    """n trials through `loopstudy run`: a grid over seeds, or (optuna) an Optuna search of n samples."""
    sweep = ({"optuna": {"num_samples": n, "space": {"train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
                                                       "model.carry.beta_init": {"type": "uniform", "low": 0.1,
                                                                                 "high": 1.0}}}}
             if optuna else {"seeds": list(range(n))})
    spec = {"name": "scale", **TINY, "sweep": {**sweep, "max_failures": 0}, "resources": {"cpu": 1}}
    spec["model"] = {**spec["model"], "carry": {"rule": "infiloop"}}
    path = workdir / f"scale_{n}.yaml"
    path.write_text(yaml.safe_dump(spec))
    root = workdir / f"ours_{'optuna_' if optuna else ''}{n}"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "study.cli", "run", str(path), "--store", str(root), "--no-plot",
                           "--num-cpus", "2"], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    return span_per_trial(str(root), "scale", n), wall


def run_bare(n: int, workdir: Path) -> tuple[float, float]:
    root = workdir / f"bare_{n}"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", BARE, str(root), str(n), json.dumps(TINY)], cwd=REPO,
                          capture_output=True, text=True,
                          env={**os.environ, "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"})
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    return span_per_trial(str(root), "bare", n), wall


def fill_store(root: str, study: str, template_root: str, template_study: str, n: int) -> None:
    """n complete trials in `study`: the template trial's files under n new trial ids (each file's trial_id column
    rewritten, so every file is a sound file of its own trial), written with pyarrow directly for speed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from study.store import TABLES, Store

    src = Store(template_root)
    for table in [*(t for t in TABLES if t != "trials"), "trials"]:  # trials files last, as a trial writes them
        base = pq.read_table(src.files(table, template_study)[0])
        d = Path(root) / table / f"study={study}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            tid = f"fill{i:08d}"
            col = pa.array([tid] * base.num_rows, pa.string())
            pq.write_table(base.set_column(base.schema.get_field_index("trial_id"), "trial_id", col),
                           d / f"{tid}.parquet")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cli_s(*args: str) -> float:
    """Wall time of one `loopstudy` command, as a user types it (Python start-up included)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--store-trials", type=int, default=10_000)
    p.add_argument("--no-smoke", dest="smoke", action="store_false", help="skip the smoke-into-a-full-store run")
    p.add_argument("--optuna", type=int, default=2000, metavar="N",
                   help="also run an Optuna search of N samples through loopstudy run (0: skip)")
    args = p.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    out: dict = {"bench": "study_scale", "sizes": args.sizes}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for n in args.sizes:
            ours, ours_wall = run_ours(n, work)
            bare, bare_wall = run_bare(n, work)
            out[f"n{n}"] = {"ours_per_trial_s": ours, "bare_per_trial_s": bare, "ours_over_bare": ours / bare,
                            "ours_wall_s": ours_wall, "bare_wall_s": bare_wall,
                            "ours_over_bare_wall": ours_wall / bare_wall}
            print(json.dumps({"n": n, **out[f"n{n}"]}), flush=True)
        if args.optuna:
            per, wall = run_ours(args.optuna, work, optuna=True)
            out["optuna"] = {"samples": args.optuna, "per_trial_s": per, "wall_s": wall}
            print(json.dumps(out["optuna"]), flush=True)
        lo, hi = out[f"n{min(args.sizes)}"], out[f"n{max(args.sizes)}"]
        out["per_trial_growth"] = hi["ours_per_trial_s"] / lo["ours_per_trial_s"]
        out["ours_over_bare_at_largest"] = hi["ours_over_bare"]
        out["ours_over_bare_wall_at_largest"] = hi["ours_over_bare_wall"]

        from study.store import Store

        full = work / "full"
        t0 = time.perf_counter()
        fill_store(str(full), "smoke", str(work / f"ours_{min(args.sizes)}"), "scale", args.store_trials)
        print(json.dumps({"filled": args.store_trials, "seconds": time.perf_counter() - t0}), flush=True)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            done = Store(full).completed_trials("smoke")  # a fresh Store: nothing remembered between runs
            times.append(time.perf_counter() - t0)
        assert len(done) == args.store_trials
        out["find_complete_s"] = min(times)
        out["find_complete_trials"] = args.store_trials

        # as a study of this size is left by `loopstudy run` (it compacts at 500 per-trial files per table)
        from study.analysis.tables import build_table, list_studies

        out["compact_s"] = cli_s("compact", "smoke", "--store", str(full), "--grace", "0")
        out["compacted_store"] = {
            "completed_trials_s": timed(lambda: Store(full).completed_trials("smoke")),
            "ls_s": timed(lambda: list_studies(Store(full))),
            "table_depth_s": timed(lambda: build_table(Store(full), "smoke", "depth")),
            "cli_ls_s": cli_s("ls", "--store", str(full)),
            "cli_table_s": cli_s("table", "depth", "--study", "smoke", "--store", str(full)),
        }
        print(json.dumps(out["compacted_store"]), flush=True)

        if args.smoke:
            walls = {}
            for label, root in (("empty", work / "empty"), ("full", full)):
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "study.cli", "run", "search_spaces/smoke.yaml",
                                       "--store", str(root), "--figures", str(work / f"fig_{label}")],
                                      cwd=REPO, capture_output=True, text=True)
                walls[label] = time.perf_counter() - t0
                assert proc.returncode == 0, proc.stderr[-3000:]
                print(json.dumps({"smoke_into": label, "wall_s": walls[label]}), flush=True)
            out["smoke_empty_s"], out["smoke_full_s"] = walls["empty"], walls["full"]
            out["smoke_full_over_empty"] = walls["full"] / walls["empty"]
    out["targets"] = {"per_trial_growth": 1.2, "ours_over_bare": 1.3, "find_complete_s": 0.5,
                      "smoke_full_over_empty": 1.3}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
