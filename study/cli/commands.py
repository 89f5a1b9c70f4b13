"""The commands of `loopstudy`, one function each (`cmd_<name>(args) -> exit code`). Everything heavy (torch,
Ray) is imported inside the command that needs it, so the reading commands run on any machine that can read the
store."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import tempfile
from pathlib import Path

from study.console import eprint
from study.errors import ConfigError
from study.metrics import DEFAULT_METRIC
from study.store.layout import figures_dir, weights_file


# -- trial -------------------------------------------------------------------------------------------------------------
def cmd_trial(args: argparse.Namespace) -> int:
    from study.config import trial_id
    from study.spec.study import load_trial_file
    from study.store import Store
    from study.trial.execute import TrialContext, TrialHooks, run_trial

    cfg = load_trial_file(args.config, args.overrides, store_root=None if args.no_store else args.store)
    store = None if args.no_store else Store(args.store)  # a bad root fails now, not after training
    tid = trial_id(cfg)
    from study.tasks import TASKS

    own = ", ".join(f"{k}={getattr(cfg.task, k)}" for k in TASKS[cfg.task.name].reads
                    if getattr(cfg.task, k) is not None)
    eprint(f"trial {tid}: task {cfg.task.name} ({own}), model {cfg.model.kind} "
           f"rule={cfg.model.carry.rule} placement={cfg.model.carry.placement}, seed {cfg.seed}")

    def on_log(log) -> None:
        eprint(f"  step {log.step:6d}/{cfg.train.steps}  loss {log.loss:.4f}  cell {log.cell_acc:.3f}  "
               f"exact {log.exact_acc:.3f}  lr {log.lr:.2e}")

    metrics, result = run_trial(cfg, context=TrialContext(store, args.study),
                                hooks=TrialHooks(on_log=on_log, on_phase=lambda m: eprint(f"  {m}")))
    print(format_depth_rows(result.depth))
    if store is not None:
        eprint(f"rows written to {store.uri} (study={args.study}, trial_id={tid}); weights: "
               f"{store.uri}/{weights_file(args.study, tid)}")
    return 0


def format_depth_rows(rows) -> str:
    """The overall depth rows as a terminal table; ARC's pooled pass@2 (per puzzle, per test input) leads when read."""
    overall = sorted((r for r in rows if r.difficulty is None), key=lambda r: r.depth_layers)
    pooled = any(r.puzzle_pass_at_2 is not None for r in overall)
    passes = f"{'pass@2/puzzle':>13} {'pass@2':>7} {'pass@1':>7} " if pooled else ""
    head = (f"{'depth_layers':>12} {'cycles':>7} {passes}"
            f"{'exact_acc':>9} {'cell_acc':>9} {'halted':>7} {'eff_layers':>10}")
    lines = [head, "-" * len(head)]
    for r in overall:
        passes = f"{r.puzzle_pass_at_2:13.3f} {r.pass_at_2:7.3f} {r.pass_at_1:7.3f} " if pooled else ""
        lines.append(f"{r.depth_layers:12d} {r.outer_cycles:7d} {passes}{r.exact_acc:9.3f} {r.cell_acc:9.3f} "
                     f"{r.halted_frac:7.2f} {r.eff_layers:10.0f}")
    return "\n".join(lines)


# -- studies on Ray ----------------------------------------------------------------------------------------------------
def print_main_table(store_root: str, study: str) -> None:
    """The closing table of a run: accuracy by depth, a column per setting (mean ± 95% CI), as the report shows it."""
    from study.analysis.formatting import format_table, settings_layout
    from study.analysis.tables import build_table
    from study.errors import AnalysisError

    try:
        df = build_table(_store(store_root), study, "depth")
        wide = settings_layout(df)
        print(format_table(df if wide is None else wide))
    except AnalysisError as e:
        eprint(f"loopstudy: {e}")


def cmd_run(args: argparse.Namespace) -> int:
    from study.run.driver import run_study, storage_root
    from study.spec import load_study

    study = load_study(args.spec, args.overrides, store_root=args.store)
    more = [f"tracking.{t}=true" for t in args.tracking if not getattr(study.spec.tracking, t)]
    if more:  # --tracking turns on what the spec's tracking section leaves off (and keeps its settings)
        study = load_study(args.spec, [*args.overrides, *more], store_root=args.store)
    root = storage_root(study, args.store, allow_placeholder=args.dry_run)
    if args.dry_run:
        return dry_run(study, args, root)
    if "working_dir_files" in os.getcwd():
        # Inside a Ray Job: Ray may delete the job's unpacked working dir once the trials sharing it end, pulling
        # the cwd from under this driver. Load what we need now and work from a directory that stays.
        importlib.import_module("study.analysis.figures")
        os.chdir(tempfile.gettempdir())
    out = run_study(study, address=args.address, storage=root, shared_storage=args.shared_storage,
                    num_cpus=args.num_cpus, compact_at=args.compact_at, verbose=args.verbose)
    if out.get("interrupted"):
        return 130
    print_main_table(root, study.name)
    figures = args.figures or figures_dir(root)
    eprint(f"figures: loopstudy plot all --study {study.name} --store {shlex.quote(root)} "
           f"--figures {shlex.quote(str(figures))}")
    if not args.no_plot:
        from study.analysis.figures import plot

        try:
            files = plot(_store(root), study.name, "all", figures, only_changed=True)
            state = "written to" if files.redrawn else "unchanged (the data is the same) in"
            eprint(f"figures {state} {Path(figures).resolve()} ({len(files)} files)")
        except Exception as e:  # a figure problem must not hide the study's results
            eprint(f"loopstudy: figures not written: {e}")
    return 1 if out["errors"] else 0


def dry_run(study, args: argparse.Namespace, root: str) -> int:
    """`run --dry-run`: the trials it would run and skip (stdout), what each holds, what the cluster offers and
    every check a run would fail (stderr); nothing started or stored."""
    import polars as pl

    from study.analysis.formatting import format_table
    from study.run.driver import dry_run_study

    plan = dry_run_study(study, address=args.address, storage=root, shared_storage=args.shared_storage,
                         num_cpus=args.num_cpus, verbose=args.verbose)
    table = pl.DataFrame(plan["trials"])
    shown = [c for c in table.columns if (c, table[c][0]) not in (("gpu", "0"), ("workers", 1))]
    print(format_table(table.select(shown)))
    res = study.spec.resources
    runs = sum(1 for t in plan["trials"] if not t["action"].startswith("skip"))
    if study.is_optuna:
        space = ", ".join(f"{k}: {p.type}" for k, p in study.spec.sweep.optuna.space.items())
        eprint(f"[{study.name}] Optuna search ({study.spec.sweep.optuna.sampler}) over {space}")
    eprint(f"[{study.name}] would run {runs} of {table.height} trial(s) on Ray ({plan['where']}), each holding "
           f"{res.cpu:g} CPU, {res.gpu:g} GPU" + (f" on each of {res.workers} workers" if res.workers > 1 else "")
           + f"; the cluster offers {'; '.join(plan['offers'])}; results -> {plan['root']}")
    for reason in plan["refused"]:
        eprint(f"[{study.name}] preflight: a run here would be refused: {reason}")
    eprint(f"[{study.name}] dry run: nothing was started or stored" + ("" if plan["refused"] else
                                                                        "; every check passed"))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from study.analysis.formatting import format_table
    from study.analysis.tables import build_table
    from study.config import flatten, parse_overrides
    from study.errors import AnalysisError
    from study.paths import resolve_root
    from study.run.driver import evaluate_study
    from study.run.plan import check_eval_overrides

    overrides = flatten(parse_overrides(args.overrides))
    check_eval_overrides(overrides)  # before anything is read or started
    out = evaluate_study(args.study, storage=args.store, overrides=overrides, trials=args.trials,
                         checkpoints=args.checkpoints, address=args.address, num_cpus=args.num_cpus,
                         verbose=args.verbose)
    root = resolve_root(args.store)
    try:
        print(format_table(build_table(_store(root), args.study, "checkpoints" if args.checkpoints else "depth")))
    except AnalysisError as e:
        eprint(f"loopstudy: {e}")
    if not args.no_plot:
        from study.analysis.figures import plot

        figures = args.figures or figures_dir(root)
        try:
            files = plot(_store(root), args.study, "all", figures, only_changed=True)
            eprint(f"figures in {Path(figures).resolve()} ({len(files)} files)")
        except Exception as e:  # a figure problem must not hide the readings
            eprint(f"loopstudy: figures not written: {e}")
    return 1 if out["errors"] else 0


def cmd_resume(args: argparse.Namespace) -> int:
    from study.run.driver import resume_study

    out = resume_study(args.study, storage=args.store, address=args.address, verbose=args.verbose)
    from study.paths import resolve_root

    root = resolve_root(args.store)
    print_main_table(root, args.study)
    return 1 if out["errors"] else 0


def cmd_submit(args: argparse.Namespace) -> int:
    from study.run.submit import submit_study
    from study.spec import load_study

    load_study(args.spec, args.overrides)  # fail here, not on the cluster
    repo = Path(__file__).resolve().parents[2]  # study/cli/commands.py -> the repository
    extra = [*args.overrides] if args.overrides else []
    job_id = submit_study(str(args.spec), address=args.address, storage=args.store, repo=repo,
                          extra_args=extra)
    print(job_id)
    eprint(f"submitted {args.spec} as Ray job {job_id}\n"
           f"  follow:  ray job logs --address {args.address} --follow {job_id}\n"
           f"  status:  ray job status --address {args.address} {job_id}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """The study's trials by kind (study.spec.membership), from storage alone: the same counts as `ls`. No Ray."""
    from study.spec import load_saved_study
    from study.spec.membership import KINDS, membership

    store = _store(args.store)
    load_saved_study(store, args.study)  # says which studies exist when this one does not
    m = membership(store, args.study)
    counts = m.counts()
    expected = m.optuna_samples or sum(counts[k] for k in KINDS if k != "stale")
    what = "Optuna samples" if m.optuna_samples else "trials"
    others = ", ".join(f"{counts[k]} {k}" for k in KINDS if k != "complete" and counts[k])
    print(f"{args.study}: {counts['complete']}/{expected} {what} complete in {store.uri}" +
          (f" ({others})" if others else ""))
    for kind in ("pending", "running", "stopped", "failed"):
        ids = sorted(t for t, s in m.status.items() if s == kind)
        for i in ids[:20]:
            print(f"  {kind} {i}")
        if len(ids) > 20:
            print(f"  ... and {len(ids) - 20} more {kind}")
    if m.evaluations:
        print(f"  {len(m.evaluations)} evaluation(s) of their stored weights (loopstudy evaluate)")
    if counts["stale"]:
        print(f"  {counts['stale']} stale: trials of an earlier version of the spec, kept in storage, left out of "
              "tables and figures (--all includes them)")
    if m.note:
        print(f"  note: {m.note}")
    return 0


# -- analysis (no torch, no Ray) ---------------------------------------------------------------------------------------
def _store(root: str):
    """The results store at root, for reading: StoreError when nothing was ever written there."""
    from study.store import Store

    return Store(root).require()


# the options of the tables that take their own (`table compare`, `table pareto`); the others take none of them
KIND_OPTIONS = {"compare": ("baseline", "metric", "depth", "retention", "half_width", "settings", "step"),
                "pareto": ("metric", "budget", "every_point", "settings")}


def show_table(df, args: argparse.Namespace) -> None:
    """A command's table: printed in --format, or with --out FILE.parquet written whole to that file."""
    from study.analysis.formatting import format_table, write_table

    if args.out is not None:
        write_table(df, args.out)
        eprint(f"{df.height:,} row(s) x {df.width} column(s) written to {args.out}")
        return
    text = format_table(df, args.format)
    print(text, end="" if text.endswith("\n") else "\n")  # a CSV ends its last row itself: no blank row after it


def check_kind_options(args: argparse.Namespace) -> None:
    """An option of another table's kind is refused, naming the tables it is for."""
    own = KIND_OPTIONS.get(args.kind, ())
    for option in sorted({o for opts in KIND_OPTIONS.values() for o in opts} - set(own)):
        if getattr(args, option) not in (None, False):
            kinds = " or ".join(f"`loopstudy table {k}`" for k, opts in KIND_OPTIONS.items() if option in opts)
            raise ConfigError(f"--{option.replace('_', '-')}: for {kinds} only")


def cmd_table(args: argparse.Namespace) -> int:
    from study.analysis.formatting import widen
    from study.analysis.tables import build_table

    check_kind_options(args)
    if args.kind == "compare":
        return cmd_compare(args)
    if args.kind == "pareto":
        return cmd_pareto(args)
    df = build_table(_store(args.store), args.study, args.kind, paper=args.paper, skip_bad=args.skip_bad,
                     include_stale=args.all)
    if args.wide is not None:
        df = widen(df, args.wide or None)
    show_table(df, args)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from study.analysis.compare import Comparison, compare
    from study.analysis.tables import load_context

    if not args.baseline:
        raise ConfigError("table compare needs --baseline SETTING (a setting as the study's tables name it)")
    ctx = load_context(_store(args.store), args.study, args.skip_bad, args.all)
    cmp = Comparison(args.baseline, args.metric or ctx.headline[0], args.depth, args.retention, args.half_width,
                     tuple(args.settings) if args.settings else None, args.step)
    show_table(compare(ctx, cmp), args)
    return 0


def cmd_pareto(args: argparse.Namespace) -> int:
    from study.analysis.pareto import Frontier, pareto
    from study.analysis.tables import load_context

    ctx = load_context(_store(args.store), args.study, args.skip_bad, args.all)
    df = pareto(ctx, Frontier(args.metric, args.budget, args.every_point,
                              tuple(args.settings) if args.settings else None))
    if args.budget is not None:
        eprint(f"{args.study}: the most accurate reading within {args.budget:.4g} FLOPs per sample")
    show_table(df, args)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from study.analysis.figures import plot

    files = plot(_store(args.store), args.study, args.kind, args.figures or figures_dir(args.store),
                 skip_bad=args.skip_bad, include_stale=args.all, paper=args.paper,
                 settings=tuple(args.settings) if args.settings else None)
    for f in files:
        print(f)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from study.analysis.query import sql

    show_table(sql(_store(args.store), args.sql, args.study, args.skip_bad), args)
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    store = _store(args.store)
    if args.study not in store.studies():
        eprint(f"loopstudy: no study {args.study!r} in {store.uri}; studies: {', '.join(store.studies()) or 'none'}")
        return 2

    def on_table(table: str, files: int, rows: int) -> None:
        eprint(f"  {table:<13} {files:>7,} trial files merged -> {rows:,} rows in study.compacted.parquet")

    out = store.compact(args.study, on_table, grace_s=args.grace)
    eprint(f"{args.study}: {out['trials']:,} complete trials compacted; {out['files_removed']:,} per-trial files "
           "removed (trials not yet complete keep theirs)")
    return 0


def cmd_importance(args: argparse.Namespace) -> int:
    import polars as pl

    from study.analysis.importance import importance
    from study.spec.membership import membership

    store = _store(args.store)
    members = membership(store, args.study)
    counts = members.counts()
    left = ", ".join(f"{counts[k]} {k}" for k in ("stopped", "running", "failed") if counts[k])
    eprint(f"{args.study}: {counts['complete']} complete trial(s)" + (f" ({left}: left out)" if left else ""))
    # a search with several objectives is ranked for each of them, unless one is named
    metrics = [args.metric] if args.metric else (members.search.metrics if members.search else [DEFAULT_METRIC])
    frames = []
    for metric in metrics:
        df = importance(store, args.study, metric, args.evaluator, skip_bad=args.skip_bad, include_stale=args.all)
        frames.append(df.select(pl.lit(metric).alias("metric"), pl.all()) if len(metrics) > 1 else df)
    eprint(f"{args.study}: importance of each swept knob for {', '.join(metrics)} ({args.evaluator}, Optuna)")
    show_table(pl.concat(frames), args)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from study.analysis.report import report

    path = report(_store(args.store), args.study, args.out, skip_bad=args.skip_bad, include_stale=args.all)
    print(path)
    eprint(f"report written to {path.resolve()} (one self-contained HTML file)")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from study.spec.json_schema import schema_text

    print(schema_text(plugins=not args.own), end="")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from study.spec.plugins import listing

    print("\n".join(listing()))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from study.analysis.formatting import format_table
    from study.analysis.tables import list_studies

    df = list_studies(_store(args.store))
    if df.height == 0:
        eprint(f"no studies in {args.store}")
        return 0
    print(format_table(df, "terminal"))
    return 0


