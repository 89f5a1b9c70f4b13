"""Accuracy against test-time compute: the Pareto front of a study's readings, and the best one within a budget.

A point is a setting read at one depth: its accuracy and its FLOPs per sample (study.evaluate.compute), each a mean
over seeds with a 95% CI, as every table's. A grid study's readings at many depths (and taus, and carries) are then
a cloud of points; a point is on the front when no other point is at least as accurate for at most the compute and
strictly better in one of the two. With halting a deeper budget may cost no more than a shallower one: the FLOPs are
the steps each sample ran. Rows stored before FLOPs were counted have none and are left out (said in the error when
nothing is left).

The rule itself (`nondominated`) is study.analysis.front's, shared with `table optuna`'s front of a search.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from study.analysis.front import nondominated
from study.analysis.selection import only
from study.analysis.tables import AnalysisError, Context, aggregate, overall


@dataclass(frozen=True)
class Frontier:
    """What `table pareto` reads. metric: the accuracy column (default: the study's headline); budget: FLOPs per
    sample, and the answer is the most accurate point within it; every_point: every point, with `front` marked;
    settings: the front over these settings' readings only (None: every setting's)."""

    metric: str | None = None
    budget: float | None = None
    every_point: bool = False
    settings: tuple[str, ...] | None = None


def points(ctx: Context, metric: str) -> pl.DataFrame:
    """Every (setting, depth) reading with FLOPs: metric, flops and eff_layers, mean / 95% CI / std over seeds."""
    columns = ctx.store.scan("depth_eval", ctx.study, ctx.skip_bad).collect_schema().names()
    if metric not in columns or metric in ("trial_id", "study", "difficulty", "flops"):
        raise AnalysisError(f"unknown metric {metric!r}: a depth_eval accuracy column, e.g. exact_acc or cell_acc")
    lf = overall(ctx.table("depth_eval")).filter(pl.col("flops").is_not_null() & pl.col(metric).is_not_null())
    df = aggregate(lf, ["setting", "depth_layers"], [metric, "flops", "eff_layers"]).drop("source")
    if df.height == 0:
        raise AnalysisError(f"no reading of study {ctx.study!r} carries FLOPs (rows stored before test-time compute "
                            "was counted); `loopstudy evaluate` reads the stored weights again with it")
    return df


def pareto(ctx: Context, frontier: Frontier = Frontier()) -> pl.DataFrame:
    """The front of accuracy (max) against FLOPs per sample (min) over the study's readings, cheapest first; with
    a budget, the most accurate reading within it (ties: the cheaper)."""
    metric = frontier.metric or ctx.headline[0]
    df = points(only(ctx, frontier.settings) if frontier.settings is not None else ctx, metric)
    acc, flops = f"{metric}_mean", "flops_mean"
    df = df.with_columns(pl.Series("front", nondominated(df.select(acc, flops).to_numpy(), [True, False])))
    df = df.select("setting", "depth_layers", pl.col("eff_layers_mean").alias("eff_layers"), flops, "flops_ci95",
                   acc, f"{metric}_ci95", "n", "front")
    if frontier.budget is not None:
        within = df.filter(pl.col(flops) <= frontier.budget)
        if within.height == 0:
            raise AnalysisError(f"no reading of study {ctx.study!r} costs {frontier.budget:.4g} FLOPs per sample or "
                                f"less; the cheapest costs {df[flops].min():.4g}")
        return within.sort([acc, flops], descending=[True, False]).head(1).drop("front")
    if not frontier.every_point:
        df = df.filter(pl.col("front")).drop("front")
    return df.sort(flops, acc)

