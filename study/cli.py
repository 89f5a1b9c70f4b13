"""`loopstudy`: run studies on Ray, run one trial, and read results back as tables, figures and SQL.

The analysis commands (table, plot, query, ls) import neither torch nor Ray: they work on any machine that can
read the results store. Everything heavy is imported inside the command that needs it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_STORE = os.environ.get("LOOPSTUDY_STORE", "results")


def eprint(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


# -- trial -------------------------------------------------------------------------------------------------------------
def cmd_trial(args: argparse.Namespace) -> int:
    from study.config import load_trial, trial_id
    from study.store import Store
    from study.trial import run_trial

    cfg = load_trial(args.config, args.overrides)
    store = None if args.no_store else Store(args.store)
    tid = trial_id(cfg)
    eprint(f"trial {tid}: task {cfg.task.name} {cfg.task.size}, model {cfg.model.kind} "
           f"rule={cfg.model.carry.rule} placement={cfg.model.carry.placement}, seed {cfg.seed}")

    def on_log(log) -> None:
        eprint(f"  step {log.step:6d}/{cfg.train.steps}  loss {log.loss:.4f}  cell {log.cell_acc:.3f}  "
               f"exact {log.exact_acc:.3f}  lr {log.lr:.2e}")

    metrics, result = run_trial(cfg, study_name=args.study, store=store, on_log=on_log,
                                on_phase=lambda m: eprint(f"  {m}"))
    print(format_depth_rows(result.depth))
    if store is not None:
        eprint(f"rows written to {store.uri} (study={args.study}, trial_id={tid})")
    return 0


def format_depth_rows(rows) -> str:
    head = f"{'depth_layers':>12} {'cycles':>7} {'exact_acc':>9} {'cell_acc':>9} {'halted':>7} {'eff_layers':>10}"
    lines = [head, "-" * len(head)]
    for r in sorted((r for r in rows if r.difficulty is None), key=lambda r: r.depth_layers):
        lines.append(f"{r.depth_layers:12d} {r.outer_cycles:7d} {r.exact_acc:9.3f} {r.cell_acc:9.3f} "
                     f"{r.halted_frac:7.2f} {r.eff_layers:10.0f}")
    return "\n".join(lines)


# -- parser ------------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopstudy",
        description="Ablation studies of looped-transformer reasoners (InfiLoop, FPRM, TRM) on Ray Tune, "
                    "with results in Parquet and tables/figures from Polars and matplotlib.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("trial", help="train and evaluate one configuration without Ray",
                       description="Train and evaluate one configuration (no Ray). CONFIG is a YAML file with "
                                   "sections task/model/train/eval/seed; key=value pairs override dotted keys, "
                                   "e.g. model.carry.rule=infiloop train.steps=200.")
    t.add_argument("config", type=Path)
    t.add_argument("overrides", nargs="*", metavar="key=value")
    t.add_argument("--store", default=DEFAULT_STORE, help="results root: a path or s3://... (default: %(default)s)")
    t.add_argument("--study", default="adhoc", help="study name the rows are filed under (default: %(default)s)")
    t.add_argument("--no-store", action="store_true", help="print the depth table only; write nothing")
    t.set_defaults(func=cmd_trial)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from study.config import ConfigError
    from study.store import StoreError

    try:
        return args.func(args)
    except (ConfigError, StoreError) as e:
        eprint(f"loopstudy: {e}")
        return 2
    except KeyboardInterrupt:
        eprint("loopstudy: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
