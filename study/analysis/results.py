"""The Python API, for notebooks: a results store's tables as lazy Polars frames (with each trial's config joined),
the ablation tables as DataFrames, figures, SQL and knob importance. Torch-free and Ray-free, like the analysis
commands it shares its code with.

    from study.analysis.results import open_results

    res = open_results("results")                  # a local path, an NFS path or s3://bucket/prefix
    res.studies()                                  # DataFrame: study, complete / incomplete trials, compacted
    depth = res.frame("depth_eval", "smoke")       # LazyFrame: depth rows + "model.carry.rule", "seed", ...
    depth.filter(pl.col("difficulty").is_null()).group_by("model.carry.rule", "depth_layers").agg(pl.mean("exact_acc"))
    res.table("depth", "smoke", paper=True)        # the `loopstudy table depth` DataFrame
    res.evaluations("smoke")                       # every reading of each trained trial's stored weights
    res.figures("smoke", out="figures")            # PNG + PDF files, as `loopstudy plot all`
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from study.analysis.figures import plot
from study.analysis.formatting import widen
from study.analysis.importance import importance
from study.analysis.query import sql
from study.analysis.report import report
from study.analysis.tables import build_table, config_columns, list_studies, load_context
from study.metrics import DEFAULT_METRIC, METRICS
from study.store import TABLES, Store


class Results:
    """One results store. Every method reads Parquet only; nothing needs a GPU, torch or a Ray cluster."""

    def __init__(self, root: str | Path = "results", skip_bad: bool = False, include_stale: bool = False):
        self.store = Store(root).require()
        self.skip_bad = skip_bad
        self.include_stale = include_stale  # trials of earlier versions of a study's spec (study.spec.membership)

    def __repr__(self) -> str:
        return f"Results({self.store.uri!r})"

    def studies(self) -> pl.DataFrame:
        """The studies in the store: complete and incomplete trials, compacted or not."""
        return list_studies(self.store)

    def trials(self, study: str | None = None) -> pl.LazyFrame:
        """The trials table (one row per trial: config as dotted columns, status, timings, summary metrics)."""
        return self.store.scan("trials", study, self.skip_bad)

    def frame(self, table: str, study: str | None = None, config: bool = True) -> pl.LazyFrame:
        """A table (train_curve, depth_eval, dynamics, perturbation or trials) as a LazyFrame; with config, each
        row also carries its trial's config columns ("model.carry.rule", "seed", ...)."""
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
        lf = self.store.scan(table, study, self.skip_bad)
        if table == "trials" or not config:
            return lf
        trials = self.trials(study)
        cols = config_columns(pl.DataFrame(schema=trials.collect_schema()))
        return lf.join(trials.select(["study", "trial_id", *cols]), on=["study", "trial_id"], how="left")

    def evaluations(self, study: str) -> pl.DataFrame:
        """Every evaluation of the study's trained trials (loopstudy evaluate, and the spec's eval-only variants):
        one row per reading, its setting (named by what differs), the trained trial whose weights it read and at
        which training step, its eval_id and its final metrics; the trained trials themselves first."""
        every = load_context(self.store, study, self.skip_bad, self.include_stale).every_trial
        metrics = [m for m in METRICS if m in every.columns and every[m].is_not_null().any()]
        return every.select(
            "trial_id", "setting", "seed", pl.coalesce("weights_of", "trial_id").alias("trained_trial"),
            "weights_step", "eval_id", *metrics, "wall_s",
        ).sort("trained_trial", pl.col("trial_id") != pl.col("trained_trial"), "weights_step", "setting")

    def table(self, kind: str, study: str, paper: bool = False, wide: str | None = None) -> pl.DataFrame:
        """An ablation table, as `loopstudy table KIND --study STUDY [--paper] [--wide METRIC]` prints it."""
        df = build_table(self.store, study, kind, paper=paper, skip_bad=self.skip_bad, include_stale=self.include_stale)
        return widen(df, wide) if wide else df

    def compare(self, study: str, baseline: str, metric: str | None = None, depth: int | None = None,
                retention: bool = False, half_width: float | None = None,
                settings: list[str] | None = None, step: int | None = None) -> pl.DataFrame:
        """Each setting (or only `settings`) minus `baseline`, paired by seed (mean, 95% CI, paired p, Holm p over
        the settings compared; with half_width, the seeds a CI that narrow needs; step: the weights kept at that
        training step), as `loopstudy table compare` (study.analysis.compare)."""
        from study.analysis.compare import Comparison, compare

        ctx = load_context(self.store, study, self.skip_bad, self.include_stale)
        return compare(ctx, Comparison(baseline, metric or ctx.headline[0], depth, retention, half_width,
                                       tuple(settings) if settings else None, step))

    def pareto(self, study: str, metric: str | None = None, budget: float | None = None,
               every_point: bool = False, settings: list[str] | None = None) -> pl.DataFrame:
        """Accuracy against test-time FLOPs per sample over the study's readings (or only `settings`'): the front
        (or, with a budget, the most accurate reading within it), as `loopstudy table pareto`
        (study.analysis.pareto)."""
        from study.analysis.pareto import Frontier, pareto

        ctx = load_context(self.store, study, self.skip_bad, self.include_stale)
        return pareto(ctx, Frontier(metric, budget, every_point, tuple(settings) if settings else None))

    def figures(self, study: str, kind: str = "all", out: str | Path = "results/figures") -> list[Path]:
        """Write figure `kind` (or all) as PNG and PDF into `out`, as `loopstudy plot`; returns the files."""
        return plot(self.store, study, kind, out, skip_bad=self.skip_bad, include_stale=self.include_stale)

    def report(self, study: str, out: str | Path | None = None) -> Path:
        """One self-contained HTML page of the study, as `loopstudy report`; returns its path."""
        return report(self.store, study, out, self.skip_bad, self.include_stale)

    def sql(self, query: str, study: str | None = None) -> pl.DataFrame:
        """SQL over the store's tables, sandboxed (study.analysis.query), as `loopstudy query`."""
        return sql(self.store, query, study, self.skip_bad)

    def importance(self, study: str, metric: str = DEFAULT_METRIC, evaluator: str = "fanova") -> pl.DataFrame:
        """Which swept knob matters most for `metric`, by Optuna's evaluators, as `loopstudy importance`."""
        return importance(self.store, study, metric, evaluator, self.skip_bad, self.include_stale)


def open_results(root: str | Path = "results", skip_bad: bool = False, include_stale: bool = False) -> Results:
    """The results store at `root` (StoreError when nothing was ever written there)."""
    return Results(root, skip_bad, include_stale)
