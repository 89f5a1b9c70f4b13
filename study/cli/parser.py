"""The `loopstudy` command line: one vocabulary everywhere (--store ROOT, --study NAME, --figures DIR), one small
function per command group."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from study.cli import commands as cmd
from study.metrics import DEFAULT_METRIC, FORMATS, METRICS

DEFAULT_STORE = os.environ.get("LOOPSTUDY_STORE", "results")
STORE_HELP = "results root: a path, an NFS path or s3://bucket/prefix"


def study_name(value: str) -> str:
    """argparse type for study names: the store's one rule, refused before anything runs."""
    from study.errors import ConfigError
    from study.store.names import check_study_name

    try:
        return check_study_name(value)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def count(least: int):
    """argparse type for an integer option that must be >= least."""
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{n} is not allowed; it must be >= {least}")
        return n
    return parse


def number(what: str, least: float = 0.0, strict: bool = True):
    """argparse type for a finite number above `least` (strict) or at least `least`: NaN and infinities are refused,
    as everywhere a number is read from the command line."""
    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        if not math.isfinite(x) or (x <= least if strict else x < least):
            raise argparse.ArgumentTypeError(f"{value} is not allowed; give {what} {'>' if strict else '>='} "
                                             f"{least:g} (a finite number)")
        return x
    return parse


seconds = number("seconds", 0.0, strict=False)


def add_store(sp: argparse.ArgumentParser, default: str | None = DEFAULT_STORE, help: str = STORE_HELP) -> None:
    """--store, the results root, on every command (--storage is accepted as the same option)."""
    shown = "the spec's `storage`" if default is None else "%(default)s"
    sp.add_argument("--store", "--storage", dest="store", default=default, metavar="ROOT",
                    help=f"{help} (default: {shown}; --storage is the same option)")


def add_study(sp: argparse.ArgumentParser, positional: bool = False, **kw) -> None:
    """--study NAME on every command that takes a study; those that need nothing else take it positionally too."""
    if positional:
        sp.add_argument("study_pos", nargs="?", type=study_name, metavar="STUDY", help="the study (or --study)")
    kw.setdefault("help", "the study: the `name` of its spec")
    sp.add_argument("--study", type=study_name, metavar="NAME", **kw)


def add_verbose(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--verbose", action="store_true", help="show Ray's and Tune's own output too (default: only "
                    "loopstudy's lines)")


def add_format(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--format", default="terminal", choices=FORMATS, help="how the table is printed: terminal, "
                    "markdown and latex round for reading; csv and json carry every value as stored "
                    "(default: %(default)s)")
    sp.add_argument("--out", type=Path, default=None, metavar="FILE.parquet",
                    help="write the table whole to a Parquet file instead of printing it")


def add_spec(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("spec", type=Path, help="the study spec (YAML): base trial, sweep, resources, storage")
    sp.add_argument("overrides", nargs="*", metavar="key=value", help="override spec keys, e.g. train.steps=50")


def add_trial(sub) -> None:
    t = sub.add_parser("trial", help="train and evaluate one configuration without Ray",
                       description="Train and evaluate one configuration (no Ray). CONFIG is a YAML file with "
                                   "sections task/model/train/eval/seed; key=value pairs override dotted keys, "
                                   "e.g. model.carry.rule=infiloop train.steps=200.")
    t.add_argument("config", type=Path, help="the trial config (YAML)")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="override dotted keys")
    add_store(t)
    add_study(t, default="adhoc", help="study name the rows are filed under (default: %(default)s)")
    t.add_argument("--no-store", action="store_true", help="print the depth table only; write nothing")
    t.set_defaults(func=cmd.cmd_trial)


TRACKERS = ("tensorboard", "mlflow", "wandb")  # the spec's tracking section's switches (study.spec.schema.TrackingSpec)


def add_run(sub) -> None:
    from study.run.driver import COMPACT_AT  # Ray- and torch-free at import

    r = sub.add_parser("run", help="run a study (grid or Optuna) on Ray Tune and print its depth table",
                       description="Run a study spec on Ray Tune. Trials already complete in the store are skipped. "
                                   "Ends with the depth table and the figures.")
    add_spec(r)
    r.add_argument("--address", default=None,
                   help="join a running Ray cluster: auto or HOST:PORT (default: embedded local Ray)")
    add_store(r, default=None)
    r.add_argument("--shared-storage", action="store_true",
                   help="the store (and task data) is mounted on every node (NFS): allow it on a multi-machine "
                        "cluster")
    r.add_argument("--num-cpus", type=count(1), default=None, help="CPUs for the embedded Ray (default: all)")
    r.add_argument("--figures", default=None, metavar="DIR", help="where figures go (default: <store>/figures)")
    r.add_argument("--no-plot", action="store_true", help="skip the figures")
    r.add_argument("--dry-run", action="store_true",
                   help="validate, expand the sweep and check the cluster it would use; print the trials it would "
                        "run and skip, what each holds and what the cluster offers; start and store nothing")
    add_verbose(r)
    r.add_argument("--compact-at", type=count(0), default=COMPACT_AT, metavar="N",
                   help="after the run, compact the study when it has N or more per-trial files per table, so "
                        "reading it stays a few files (0: never; default: %(default)s)")
    r.add_argument("--tracking", type=trackers, default=[], metavar="LIST",
                   help="live tracking, comma-separated: tensorboard, mlflow, wandb (the spec's `tracking:` "
                        "section with defaults: MLflow's SQLite store and W&B's offline runs under "
                        "<store>/_tracking/STUDY, TensorBoard's event files in <store>/_tune/STUDY)")
    r.set_defaults(func=cmd.cmd_run)


def trackers(text: str) -> list[str]:
    """--tracking: a comma-separated subset of tensorboard, mlflow, wandb."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TRACKERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more of {', '.join(TRACKERS)}, comma-separated")
    return names


def add_cluster(sub) -> None:
    """submit, status and resume: a study's life on a cluster."""
    s = sub.add_parser("submit", help="send a study to a cluster as a Ray Job (needs ray[default])",
                       description="Submit `loopstudy run SPEC --address auto` as a Ray Job with this repository "
                                   "as working directory. Prints the job id and how to follow its logs.")
    add_spec(s)
    s.add_argument("--address", required=True, help="the cluster's job server, e.g. http://HEAD:8265")
    add_store(s, default=None, help="results root as seen from the cluster (a shared path or s3://...)")
    s.set_defaults(func=cmd.cmd_submit)

    st = sub.add_parser("status", help="trials complete vs pending for a study (from the store; no Ray)")
    add_study(st, positional=True)
    add_store(st)
    st.set_defaults(func=cmd.cmd_status)

    rs = sub.add_parser("resume", help="resume an interrupted study (Tuner.restore); finished trials stay done")
    add_study(rs, positional=True)
    add_store(rs)
    rs.add_argument("--address", default=None, help="join a running Ray cluster (default: embedded local Ray)")
    add_verbose(rs)
    rs.set_defaults(func=cmd.cmd_resume)


def add_evaluate(sub) -> None:
    e = sub.add_parser(
        "evaluate", help="read a finished study's stored weights again (new depths, readout, halting, checkpoints)",
        description="Train once, read many times: evaluate the stored weights of a study's trained trials under "
                    "eval.* overrides, without training. Each reading is stored as a trial of its own (named in "
                    "tables and figures by the eval keys that differ); readings already stored are skipped, so "
                    "running the command again after an interruption finishes the rest. Only eval.* keys may "
                    "change: anything else is a new trial (a spec and `loopstudy run`).",
        epilog="examples:\n  loopstudy evaluate cpu_depth_scaling 'eval.depths=[48,96,480,960]'\n"
               "  loopstudy evaluate cpu_overthinking eval.readout=max_conf --trials 1a2b3c4d5e6f\n"
               "  loopstudy evaluate tiny --checkpoints   (needs train.keep_checkpoints in the spec)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study(e, positional=True)
    e.add_argument("overrides", nargs="*", metavar="eval.KEY=VALUE", help="eval.* overrides (YAML values)")
    add_store(e)
    e.add_argument("--trials", nargs="+", metavar="ID", default=None,
                   help="only these trained trials (default: every complete trained trial of the study)")
    e.add_argument("--checkpoints", action="store_true",
                   help="read every checkpoint the trials kept along training (train.keep_checkpoints) as well; "
                        "ends with the checkpoints table (accuracy vs training step at each depth)")
    e.add_argument("--address", default=None, help="join a running Ray cluster (default: embedded local Ray)")
    e.add_argument("--num-cpus", type=count(1), default=None, help="CPUs for the embedded Ray (default: all)")
    e.add_argument("--figures", default=None, metavar="DIR", help="where figures go (default: <store>/figures)")
    e.add_argument("--no-plot", action="store_true", help="skip the figures")
    add_verbose(e)
    e.set_defaults(func=cmd.cmd_evaluate)


def reading_parent() -> argparse.ArgumentParser:
    """The options every command that reads the store shares."""
    p = argparse.ArgumentParser(add_help=False)
    add_store(p)
    p.add_argument("--skip-bad", action="store_true", help="skip corrupt or wrong-typed Parquet files (named on "
                   "stderr)")
    return p


def add_all(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--all", action="store_true", help="include stale trials: those of earlier versions of the "
                    "study's spec (left out by default)")


def add_tables(sub, parent: argparse.ArgumentParser) -> None:
    """table, plot and query: what a study shows."""
    from study.analysis.figure_kinds import FIGURE_KINDS
    from study.analysis.tables import TABLES

    table_kinds, figure_kinds = [*TABLES, "compare", "pareto"], [*FIGURE_KINDS, "all"]
    tb = sub.add_parser("table", parents=[parent], help="an ablation table from stored Parquet",
                        description="An ablation table, aggregated over seeds (mean, std, n, 95% CI).")
    tb.add_argument("kind", metavar="KIND", help=f"one of: {', '.join(table_kinds)}")
    add_study(tb, required=True)
    add_all(tb)
    add_format(tb)
    tb.add_argument("--paper", action="store_true", help="add the published rows, labelled [paper]")
    tb.add_argument("--wide", nargs="?", const="", metavar="METRIC",
                    help="one column per setting with METRIC's 'mean ± 95%% CI' over seeds (default: the table's "
                         "first metric: exact_acc, or pass@2 per puzzle for ARC)")
    add_compare(tb)
    add_pareto(tb)
    tb.set_defaults(func=cmd.cmd_table)


    pl_ = sub.add_parser("plot", parents=[parent], help="figures (PNG and PDF) from stored Parquet",
                         description="Figures (PNG and PDF) from the stored Parquet alone.")
    pl_.add_argument("kind", metavar="KIND", help=f"one of: {', '.join(figure_kinds)}")
    add_study(pl_, required=True)
    add_all(pl_)
    pl_.add_argument("--figures", "--out", dest="figures", default=None, metavar="DIR",
                     help="output folder (default: <store>/figures, beside the tables; --out is the same option)")
    pl_.add_argument("--paper", action="store_true", help="show every published marker, even outside the measured "
                     "range (default: only inside it)")
    pl_.add_argument("--settings", nargs="+", metavar="SETTING", help="draw only these settings (default: every "
                     "one, the readings `loopstudy evaluate` added included)")
    pl_.set_defaults(func=cmd.cmd_plot)

    q = sub.add_parser("query", parents=[parent], help="SQL (DuckDB) over all tables, sandboxed",
                       description='SQL (DuckDB\'s dialect) over the tables trials, train_curve, depth_eval, dynamics, '
                                   'perturbation, and nothing else: no file, extension or network is reachable. '
                                   'At most 100,000 rows, 2 GB of memory and 120 s. Config columns have dotted '
                                   'names: quote them, e.g. "model.carry.rule".')
    q.add_argument("sql", help="one SELECT statement")
    add_study(q, default=None, help="restrict every table to one study")
    add_format(q)
    q.set_defaults(func=cmd.cmd_query)


def add_upkeep(sub, parent: argparse.ArgumentParser) -> None:
    """compact, importance, report and ls: keeping and summarising a store."""
    cp = sub.add_parser("compact", parents=[parent], help="merge a study's per-trial files, one file per table",
                        description="Merge the complete trials of STUDY into one study.compacted.parquet per table, "
                                    "atomically, then remove their per-trial files: reading a study of thousands of "
                                    "trials becomes reading five files. Reads stay correct during and after; a trial "
                                    "that runs again later first takes its rows out of them. Best run "
                                    "when the study is not running.")
    add_study(cp, positional=True)
    cp.add_argument("--grace", type=seconds, default=5.0, metavar="S",
                    help="seconds between the compacted files appearing and the per-trial files going, so reads "
                         "that listed them just before can finish (default: %(default)s)")
    cp.set_defaults(func=cmd.cmd_compact)

    im = sub.add_parser("importance", parents=[parent], help="which swept knob matters most (Optuna)",
                        description="Rank the knobs a study swept by their importance for a metric, with Optuna's "
                                    "importance evaluators over the stored trials (fANOVA by default).")
    add_study(im, positional=True)
    add_all(im)
    im.add_argument("--metric", default=None, choices=list(METRICS),
                    help=f"the trial metric to explain (default: each objective of the study's Optuna search, or "
                         f"{DEFAULT_METRIC})")
    im.add_argument("--evaluator", default="fanova", choices=["fanova", "ped_anova", "mdi"],
                    help="Optuna's importance evaluator (default: %(default)s)")
    add_format(im)
    im.set_defaults(func=cmd.cmd_importance)

    rp = sub.add_parser("report", parents=[parent], help="one self-contained HTML page of a study",
                        description="Every table (with the papers' rows), every figure (inlined), the spec and each "
                                    "trial's config, in one HTML file made from the stored Parquet alone.")
    add_study(rp, positional=True)
    add_all(rp)
    rp.add_argument("--out", default=None, metavar="FILE", help="the HTML file, or a folder for STUDY_report.html "
                    "(default: beside the study's figures, <store>/figures/STUDY_report.html)")
    rp.set_defaults(func=cmd.cmd_report)

    ls = sub.add_parser("ls", parents=[parent], help="studies in the store, with completeness")
    ls.set_defaults(func=cmd.cmd_ls)

    sc = sub.add_parser("schema", help="print the JSON Schema of spec files (editors validate and complete keys)",
                        description="Print the JSON Schema of a study spec, generated from the models that check one "
                                    "(the package ships it as study/spec/spec.schema.json). Name it on a spec's first "
                                    "line, `# yaml-language-server: $schema=PATH`, and an editor with the YAML "
                                    "language server validates and completes keys while you type. It includes the "
                                    "carry rules and tasks of the plugins installed here (`loopstudy plugins`).")
    sc.add_argument("--own", action="store_true",
                    help="loopstudy's own rules and tasks only, as the shipped file holds them")
    sc.set_defaults(func=cmd.cmd_schema)

    pl = sub.add_parser("plugins", help="the carry rules and tasks installed here, built-in and by plugin",
                        description="List every carry rule and task found by entry point (groups "
                                    "loopstudy.carry_rules and loopstudy.tasks), each with its distribution, version "
                                    "and entry point, its settings (spec keys), and any that failed to load with the "
                                    "reason. docs/extending.md says how to write one.")
    pl.set_defaults(func=cmd.cmd_plugins)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopstudy",
        description="Ablation studies of looped-transformer reasoners (InfiLoop, FPRM, TRM) on Ray Tune, "
                    "with results in Parquet and tables/figures from Polars and matplotlib. The same words "
                    "everywhere: --store ROOT (results root), --study NAME, --figures DIR.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_trial(sub)
    add_run(sub)
    add_cluster(sub)
    add_evaluate(sub)
    parent = reading_parent()
    add_tables(sub, parent)
    add_upkeep(sub, parent)
    return p


def add_pareto(tb: argparse.ArgumentParser) -> None:
    """`table pareto`'s options (its --metric is table compare's: the accuracy column to read)."""
    g = tb.add_argument_group("table pareto", "accuracy against test-time FLOPs per sample over every reading "
                              "(setting x depth, mean and 95%% CI over seeds): the readings no other beats on both")
    g.add_argument("--budget", type=number("a FLOPs budget"), metavar="FLOPS",
                   help="the most accurate reading that costs at most FLOPS "
                   "per sample (e.g. 2e8)")
    g.add_argument("--every-point", action="store_true", help="every reading, with a `front` column, not the front "
                   "only")


def add_compare(tb: argparse.ArgumentParser) -> None:
    """`table compare`'s options: each setting against a baseline, paired by seed."""
    g = tb.add_argument_group("table compare", "each setting minus a baseline setting, paired by seed: mean, 95% CI "
                              "(t over the pairs), paired t-test p, Holm-corrected p")
    g.add_argument("--baseline", metavar="SETTING", help="the setting (as the tables name it) the others are compared "
                   "with")
    g.add_argument("--metric", metavar="M", help="a depth_eval column (exact_acc, cell_acc, eff_layers, ...) or, "
                   "for compare, a trial metric (final_exact_acc, ...); default: the study's headline accuracy")
    which = g.add_mutually_exclusive_group()
    which.add_argument("--depth", type=count(1), metavar="LAYERS", help="read M at this depth (default: each trial's "
                       "deepest reading)")
    which.add_argument("--retention", action="store_true", help="compare retention (accuracy at 10x the training "
                       "depth over the peak), with a bootstrap CI as well")
    g.add_argument("--settings", nargs="+", metavar="SETTING", help="compare only these settings with the "
                   "baseline: the Holm family is the settings compared (default: every other setting, readings that "
                   "`loopstudy evaluate` added included); for pareto, the front over these settings' readings only")
    g.add_argument("--step", type=count(1), metavar="N", help="read the weights kept at training step N instead "
                   "(loopstudy evaluate --checkpoints; settings as the checkpoints table names them)")
    g.add_argument("--half-width", type=number("a half-width"), metavar="W",
                   help="power: the seeds a CI of half-width W needs, from "
                   "these pairs' spread (seeds_for_half_width)")
