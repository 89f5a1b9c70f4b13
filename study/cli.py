"""`loopstudy`: run studies on Ray, run one trial, and read results back as tables, figures and SQL.

The analysis commands (table, plot, query, ls) import neither torch nor Ray: they work on any machine that can
read the results store. Everything heavy is imported inside the command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path

from study.console import eprint
from study.paths import is_uri

DEFAULT_STORE = os.environ.get("LOOPSTUDY_STORE", "results")


# -- trial -------------------------------------------------------------------------------------------------------------
def cmd_trial(args: argparse.Namespace) -> int:
    from study.config import load_trial, trial_id
    from study.store import Store
    from study.trial import run_trial

    cfg = load_trial(args.config, args.overrides)
    store = None if args.no_store else Store(args.store)  # a bad root fails now, not after training
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


# -- studies on Ray ----------------------------------------------------------------------------------------------------
def print_main_table(store_root: str, study: str) -> None:
    from study.analysis.tables import AnalysisError, build_table, format_table

    try:
        print(format_table(build_table(_store(store_root), study, "depth")))
    except AnalysisError as e:
        eprint(f"loopstudy: {e}")


def cmd_run(args: argparse.Namespace) -> int:
    from study.launch import run_study, storage_root
    from study.spec import load_study

    study = load_study(args.spec, args.overrides)
    root = storage_root(study, args.store)
    if "working_dir_files" in os.getcwd():
        # Inside a Ray Job: Ray may delete the job's unpacked working dir once the trials sharing it end, pulling
        # the cwd from under this driver. Load what we need now and work from a directory that stays.
        importlib.import_module("study.analysis.figures")
        os.chdir(tempfile.gettempdir())
    out = run_study(study, address=args.address, storage=root, shared_storage=args.shared_storage,
                    num_cpus=args.num_cpus, compact_at=args.compact_at)
    if out.get("interrupted"):
        return 130
    print_main_table(root, study.name)
    figures = args.figures or ("results/figures" if is_uri(root) else f"{root}/figures")
    eprint(f"figures: loopstudy plot all --study {study.name} --store {root} --figures {figures}")
    if not args.no_plot:
        from study.analysis.figures import plot

        try:
            files = plot(_store(root), study.name, "all", figures)
            eprint(f"figures written to {Path(figures).resolve()} ({len(files)} files)")
        except Exception as e:  # a figure problem must not hide the study's results
            eprint(f"loopstudy: figures not written: {e}")
    return 1 if out["errors"] else 0


def cmd_resume(args: argparse.Namespace) -> int:
    from study.launch import resume_study

    out = resume_study(args.study, storage=args.store, address=args.address)
    from study.paths import resolve_root

    root = resolve_root(args.store)
    print_main_table(root, args.study)
    return 1 if out["errors"] else 0


def cmd_submit(args: argparse.Namespace) -> int:
    from study.launch import submit_study
    from study.spec import load_study

    load_study(args.spec, args.overrides)  # fail here, not on the cluster
    repo = Path(__file__).resolve().parents[1]
    extra = [*args.overrides] if args.overrides else []
    job_id = submit_study(str(args.spec), address=args.address, storage=args.store, repo=repo,
                          extra_args=extra)
    print(job_id)
    eprint(f"submitted {args.spec} as Ray job {job_id}\n"
           f"  follow:  ray job logs --address {args.address} --follow {job_id}\n"
           f"  status:  ray job status --address {args.address} {job_id}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Expected trials (from the saved spec) against complete ones in storage. No Ray needed."""
    from study.config import trial_id
    from study.spec import load_saved_study

    store = _store(args.store)
    study = load_saved_study(store, args.study)
    done = store.completed_trials(args.study)
    if study.is_optuna:
        print(f"{args.study}: Optuna search, {len(done)} of {study.spec.sweep.optuna.num_samples} samples complete")
        return 0
    ids = [trial_id(c) for c in study.trials]
    missing = [i for i in ids if i not in done]
    print(f"{args.study}: {len(ids) - len(missing)}/{len(ids)} trials complete in {store.uri}")
    for i in missing[:20]:
        print(f"  pending {i}")
    if len(missing) > 20:
        print(f"  ... and {len(missing) - 20} more pending")
    return 0


# -- analysis (no torch, no Ray) ---------------------------------------------------------------------------------------
def _store(root: str):
    """The results store at root, for reading: StoreError when nothing was ever written there."""
    from study.store import Store

    return Store(root).require()


def cmd_table(args: argparse.Namespace) -> int:
    from study.analysis.tables import build_table, format_table, widen

    df = build_table(_store(args.store), args.study, args.kind, paper=args.paper, skip_bad=args.skip_bad)
    if args.wide:
        df = widen(df, args.wide)
    print(format_table(df, args.format))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from study.analysis.figures import plot

    files = plot(_store(args.store), args.study, args.kind, args.figures, skip_bad=args.skip_bad)
    for f in files:
        print(f)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from study.analysis.tables import format_table, sql

    print(format_table(sql(_store(args.store), args.sql, args.study, args.skip_bad), args.format))
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    store = _store(args.store)
    if args.study not in store.studies():
        eprint(f"loopstudy: no study {args.study!r} in {store.uri}; studies: {', '.join(store.studies()) or 'none'}")
        return 2

    def on_table(table: str, files: int, rows: int) -> None:
        eprint(f"  {table:<13} {files:>7,} trial files merged -> {rows:,} rows in _compacted.parquet")

    out = store.compact(args.study, on_table, grace_s=args.grace)
    eprint(f"{args.study}: {out['trials']:,} complete trials compacted; {out['files_removed']:,} per-trial files "
           "removed (trials not yet complete keep theirs)")
    return 0


def cmd_importance(args: argparse.Namespace) -> int:
    from study.analysis.importance import importance
    from study.analysis.tables import format_table

    df = importance(_store(args.store), args.study, args.metric, args.evaluator, skip_bad=args.skip_bad)
    eprint(f"{args.study}: importance of each swept knob for {args.metric} ({args.evaluator}, Optuna)")
    print(format_table(df, args.format))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from study.analysis.report import report

    path = report(_store(args.store), args.study, args.out, skip_bad=args.skip_bad)
    print(path)
    eprint(f"report written to {path.resolve()} (one self-contained HTML file)")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from study.analysis.tables import format_table, list_studies

    df = list_studies(_store(args.store))
    if df.height == 0:
        eprint(f"no studies in {args.store}")
        return 0
    print(format_table(df, "terminal"))
    return 0


def study_name(value: str) -> str:
    """argparse type for study names: the store's one rule, refused before anything runs."""
    from study.config import ConfigError, check_study_name

    try:
        return check_study_name(value)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# -- parser ------------------------------------------------------------------------------------------------------------
STORE_HELP = "results root: a path, an NFS path or s3://bucket/prefix"


def add_store(sp: argparse.ArgumentParser, default: str | None = DEFAULT_STORE, help: str = STORE_HELP) -> None:
    """--store, the results root, on every command (--storage is accepted as the same option)."""
    shown = "the spec's `storage`" if default is None else "%(default)s"
    sp.add_argument("--store", "--storage", dest="store", default=default, metavar="ROOT",
                    help=f"{help} (default: {shown}; --storage is the same option)")


def add_study(sp: argparse.ArgumentParser, positional: bool = False, **kw) -> None:
    """--study NAME on every command that takes a study; those that need nothing else take it positionally too."""
    if positional:
        sp.add_argument("study_pos", nargs="?", type=study_name, metavar="STUDY", help="the study (or --study)")
    sp.add_argument("--study", type=study_name, **kw)


def build_parser() -> argparse.ArgumentParser:
    from study.launch import COMPACT_AT  # Ray-free at import

    p = argparse.ArgumentParser(
        prog="loopstudy",
        description="Ablation studies of looped-transformer reasoners (InfiLoop, FPRM, TRM) on Ray Tune, "
                    "with results in Parquet and tables/figures from Polars and matplotlib. The same words "
                    "everywhere: --store ROOT (results root), --study NAME, --figures DIR.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("trial", help="train and evaluate one configuration without Ray",
                       description="Train and evaluate one configuration (no Ray). CONFIG is a YAML file with "
                                   "sections task/model/train/eval/seed; key=value pairs override dotted keys, "
                                   "e.g. model.carry.rule=infiloop train.steps=200.")
    t.add_argument("config", type=Path)
    t.add_argument("overrides", nargs="*", metavar="key=value")
    add_store(t)
    add_study(t, default="adhoc", help="study name the rows are filed under (default: %(default)s)")
    t.add_argument("--no-store", action="store_true", help="print the depth table only; write nothing")
    t.set_defaults(func=cmd_trial)

    r = sub.add_parser("run", help="run a study (grid or Optuna) on Ray Tune and print its depth table",
                       description="Run a study spec on Ray Tune. Trials already complete in the store are skipped. "
                                   "Ends with the depth table and the figures.")
    r.add_argument("spec", type=Path)
    r.add_argument("overrides", nargs="*", metavar="key=value", help="override spec keys, e.g. train.steps=50")
    r.add_argument("--address", default=None,
                   help="join a running Ray cluster: auto or HOST:PORT (default: embedded local Ray)")
    add_store(r, default=None)
    r.add_argument("--shared-storage", action="store_true",
                   help="the store (and task data) is mounted on every node (NFS): allow it on a multi-machine "
                        "cluster")
    r.add_argument("--num-cpus", type=int, default=None, help="CPUs for the embedded Ray (default: all)")
    r.add_argument("--figures", default=None, metavar="DIR", help="where figures go (default: <store>/figures)")
    r.add_argument("--no-plot", action="store_true", help="skip the figures")
    r.add_argument("--compact-at", type=int, default=COMPACT_AT, metavar="N",
                   help="after the run, compact the study when it has N or more per-trial files per table, so "
                        "reading it stays a few files (0: never; default: %(default)s)")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("submit", help="send a study to a cluster as a Ray Job (needs ray[default])",
                       description="Submit `loopstudy run SPEC --address auto` as a Ray Job with this repository "
                                   "as working directory. Prints the job id and how to follow its logs.")
    s.add_argument("spec", type=Path)
    s.add_argument("overrides", nargs="*", metavar="key=value")
    s.add_argument("--address", required=True, help="the cluster's job server, e.g. http://HEAD:8265")
    add_store(s, default=None, help="results root as seen from the cluster (a shared path or s3://...)")
    s.set_defaults(func=cmd_submit)

    st = sub.add_parser("status", help="trials complete vs pending for a study (from the store; no Ray)")
    add_study(st, positional=True)
    add_store(st)
    st.set_defaults(func=cmd_status)

    rs = sub.add_parser("resume", help="resume an interrupted study (Tuner.restore); finished trials stay done")
    add_study(rs, positional=True)
    add_store(rs)
    rs.add_argument("--address", default=None, help="join a running Ray cluster (default: embedded local Ray)")
    rs.set_defaults(func=cmd_resume)

    from_store = argparse.ArgumentParser(add_help=False)
    add_store(from_store)
    from_store.add_argument("--skip-bad", action="store_true",
                            help="skip corrupt or wrong-typed Parquet files (named on stderr)")

    tb = sub.add_parser("table", parents=[from_store], help="an ablation table from stored Parquet",
                        description="Tables: depth, final, placement, beta, scaling, halting, difficulty, stability, "
                                    "perturbation, overthinking (by depth / training depth), retention (peak vs 10x "
                                    "training depth). Aggregated over seeds (mean, std, n, 95%% CI).")
    tb.add_argument("kind")
    add_study(tb, required=True)
    tb.add_argument("--format", default="terminal", choices=["terminal", "markdown", "csv", "latex"])
    tb.add_argument("--paper", action="store_true", help="add the published rows, labelled [paper]")
    tb.add_argument("--wide", nargs="?", const="exact_acc", metavar="METRIC",
                    help="one column per setting with METRIC's 'mean ± 95%% CI' over seeds (default: exact_acc)")
    tb.set_defaults(func=cmd_table)

    pl_ = sub.add_parser("plot", parents=[from_store], help="figures (PNG and PDF) from stored Parquet",
                         description="Figures: depth, difficulty, gamma, score, eff_layers, perturbation, "
                                     "overthinking, or all.")
    pl_.add_argument("kind")
    add_study(pl_, required=True)
    pl_.add_argument("--figures", "--out", dest="figures", default="results/figures", metavar="DIR",
                     help="output folder (default: %(default)s; --out is the same option)")
    pl_.set_defaults(func=cmd_plot)

    q = sub.add_parser("query", parents=[from_store], help="Polars SQL over all tables",
                       description='SQL over the tables trials, train_curve, depth_eval, dynamics, perturbation. '
                                   'Config columns have dotted names: quote them, e.g. "model.carry.rule".')
    q.add_argument("sql")
    add_study(q, default=None, help="restrict every table to one study")
    q.add_argument("--format", default="terminal", choices=["terminal", "markdown", "csv", "latex"])
    q.set_defaults(func=cmd_query)

    cp = sub.add_parser("compact", parents=[from_store], help="merge a study's per-trial files, one file per table",
                        description="Merge the complete trials of STUDY into one _compacted.parquet per table, "
                                    "atomically, then remove their per-trial files: reading a study of thousands of "
                                    "trials becomes reading five files. Reads stay correct during and after; a trial "
                                    "that runs again later writes its own files, which take precedence. Best run "
                                    "when the study is not running.")
    add_study(cp, positional=True)
    cp.add_argument("--grace", type=float, default=5.0, metavar="S",
                    help="seconds between the compacted files appearing and the per-trial files going, so reads "
                         "that listed them just before can finish (default: %(default)s)")
    cp.set_defaults(func=cmd_compact)

    im = sub.add_parser("importance", parents=[from_store], help="which swept knob matters most (Optuna)",
                        description="Rank the knobs a study swept by their importance for a metric, with Optuna's "
                                    "importance evaluators over the stored trials (fANOVA by default).")
    add_study(im, positional=True)
    im.add_argument("--metric", default="final_exact_acc",
                    choices=["final_exact_acc", "best_exact_acc", "final_train_loss"])
    im.add_argument("--evaluator", default="fanova", choices=["fanova", "ped_anova", "mdi"])
    im.add_argument("--format", default="terminal", choices=["terminal", "markdown", "csv", "latex"])
    im.set_defaults(func=cmd_importance)

    rp = sub.add_parser("report", parents=[from_store], help="one self-contained HTML page of a study",
                        description="Every table (with the papers' rows), every figure (inlined), the spec and each "
                                    "trial's config, in one HTML file made from the stored Parquet alone.")
    add_study(rp, positional=True)
    rp.add_argument("--out", default=None, metavar="FILE", help="the HTML file (default: STUDY_report.html)")
    rp.set_defaults(func=cmd_report)

    ls = sub.add_parser("ls", parents=[from_store], help="studies in the store, with completeness")
    ls.set_defaults(func=cmd_ls)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    # key=value overrides may also come after the options (argparse stops collecting positionals there)
    if rest and hasattr(args, "overrides") and all("=" in r and not r.startswith("-") for r in rest):
        args.overrides = [*args.overrides, *rest]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if hasattr(args, "study_pos"):  # STUDY or --study, once
        if args.study_pos and args.study and args.study_pos != args.study:
            parser.error(f"two studies given: {args.study_pos!r} and --study {args.study!r}")
        args.study = args.study_pos or args.study
        if not args.study:
            parser.error(f"{args.command}: give the study (STUDY or --study NAME)")
    from study.analysis.tables import AnalysisError
    from study.config import ConfigError
    from study.store import StoreError
    from study.tasks.base import DataError

    try:
        return args.func(args)
    except (ConfigError, StoreError, AnalysisError, DataError) as e:
        eprint(f"loopstudy: {e}")
        return 2
    except FileNotFoundError as e:  # a compaction removed files this read had listed: never a wrong answer
        eprint(f"loopstudy: a results file went away while it was being read ({e}); a `loopstudy compact` "
               "probably ran at the same time: run the command again")
        return 2
    except KeyboardInterrupt:
        eprint("loopstudy: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
