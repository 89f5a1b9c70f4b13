"""Comparisons that decide: each setting against a baseline, paired by seed.

The variants of a study share their data and initial weights seed by seed, so a setting's value and the baseline's
at the same seed form a pair, and the question is the mean of the paired differences: its 95% CI (Student t over
the pairs), a paired t-test's p-value, Holm-corrected across the settings compared, and for a ratio such as
retention a percentile bootstrap CI as well. Pairs are matched on the seed: a study's settings differ in the
compared keys only (the swept axes), so everything else is the same within a pair. A seed that one side lacks is
named and left out.

Power: from a pilot's paired differences (their standard deviation), the seeds that give a CI of a given
half-width: the smallest n with t(0.975, n - 1) * sd / sqrt(n) <= half-width (`seeds_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from study.analysis.tables import Context, checkpoint_readings, deepest, overall, retention_per_trial, t975
from study.console import eprint
from study.errors import AnalysisError
from study.metrics import METRICS

BOOTSTRAP_SAMPLES = 10_000
BOOTSTRAP_SEED = 0  # the same CI every time the table is read
MAX_SEEDS = 10_000  # seeds_for's search bound


@dataclass(frozen=True)
class Comparison:
    """What to compare: the baseline setting, the value per trial (a depth_eval column at `depth` layers or at
    each trial's deepest reading, a trials metric, or retention: accuracy at 10x the training depth over the
    peak), optionally the CI half-width the power column aims at, and the settings compared (None: every other
    setting). The Holm correction runs over the settings compared. step: read the weights kept at that training
    step instead (loopstudy evaluate --checkpoints; the settings as the checkpoints table names them)."""

    baseline: str
    metric: str = "exact_acc"
    depth: int | None = None
    retention: bool = False
    half_width: float | None = None
    settings: tuple[str, ...] | None = None
    step: int | None = None

    @property
    def what(self) -> str:
        if self.retention:
            return "retained_10x"
        if self.metric in METRICS:
            return self.metric
        at = f"{self.metric}@{self.depth}" if self.depth else f"{self.metric}@deepest"
        return at if self.step is None else f"{at}, step {self.step}"


def values(ctx: Context, cmp: Comparison) -> pl.DataFrame:
    """One value per complete trial: setting, seed, value."""
    seeds = ctx.every_trial.select("trial_id", "seed").lazy()
    if cmp.step is not None and (cmp.retention or cmp.metric in METRICS):
        raise AnalysisError("--step reads the depth rows of checkpoint readings; it takes neither --retention nor a "
                            "trial metric")
    if cmp.retention:
        per = retention_per_trial(ctx).collect()
        if per["at_10x"].is_null().all():
            raise AnalysisError(f"retention needs a reading at 10x each trial's training depth ({read_at_10x(ctx)});"
                                f" no trial of study {ctx.study!r} was read there: add those depths to eval.depths "
                                "(loopstudy evaluate reads stored weights again)")
        lf = per.lazy().select("trial_id", "setting", pl.col("retained_10x").alias("value"))
    elif cmp.metric in METRICS:
        if cmp.depth is not None:
            raise AnalysisError(f"--depth reads a depth_eval column; {cmp.metric} is a trial metric (one per trial)")
        if cmp.metric not in ctx.trials.columns:
            raise AnalysisError(f"no trial of study {ctx.study!r} has {cmp.metric}")
        lf = ctx.trials.lazy().select("trial_id", "setting", pl.col(cmp.metric).alias("value"))
    else:
        columns = ctx.table("depth_eval").collect_schema().names()
        if cmp.metric not in columns or cmp.metric in ("trial_id", "setting", "study", "difficulty"):
            raise AnalysisError(f"unknown metric {cmp.metric!r}: a depth_eval column (e.g. exact_acc, cell_acc, "
                                f"eff_layers) or a trial metric ({', '.join(METRICS)})")
        lf = overall(ctx.table("depth_eval")) if cmp.step is None else at_step(ctx, cmp.step)
        if cmp.depth is not None:
            read = sorted(lf.select(pl.col("depth_layers").unique()).collect().to_series().to_list())
            if cmp.depth not in read:
                raise AnalysisError(f"--depth {cmp.depth}: study {ctx.study!r} has no reading at {cmp.depth} "
                                    f"layers; depths read: {', '.join(str(d) for d in read) or 'none'}")
        lf = lf.filter(pl.col("depth_layers") == cmp.depth) if cmp.depth is not None else deepest(lf)
        lf = lf.select("trial_id", "setting", pl.col(cmp.metric).cast(pl.Float64).alias("value"))
    df = lf.join(seeds, on="trial_id").drop("trial_id").collect()
    if df.height == 0:
        raise AnalysisError(f"study {ctx.study!r} has no {cmp.what} to compare"
                            + (f" (no reading at {cmp.depth} layers)" if cmp.depth else ""))
    return df


def at_step(ctx: Context, step: int) -> pl.LazyFrame:
    """The overall depth rows of the weights kept at training step `step` (loopstudy evaluate --checkpoints)."""
    lf = overall(checkpoint_readings(ctx))
    steps = sorted(lf.select(pl.col("train_step").unique()).collect().to_series().drop_nulls().to_list())
    if step not in steps:
        read = ", ".join(map(str, steps)) or "none (loopstudy evaluate STUDY --checkpoints)"
        raise AnalysisError(f"--step {step}: study {ctx.study!r} has no reading of weights kept at step {step}; "
                            f"steps read: {read}")
    return lf.filter(pl.col("train_step") == step).drop("train_step")


def read_at_10x(ctx: Context) -> str:
    """The depths that retention reads, per training depth: '240 layers for a training depth of 24'."""
    from study.analysis.tables import training_depth

    depths = sorted(ctx.trials.select(training_depth()).to_series().unique().to_list())
    return "; ".join(f"{10 * d:,} layers for a training depth of {d:,}" for d in depths)


def paired(df: pl.DataFrame, setting: str, baseline: str) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(setting - baseline per shared seed, the seeds one side lacks, the baseline's values at those seeds)."""
    mine = dict(df.filter(pl.col("setting") == setting).select("seed", "value").iter_rows())
    base = dict(df.filter(pl.col("setting") == baseline).select("seed", "value").iter_rows())
    shared = sorted(s for s in mine.keys() & base.keys() if mine[s] is not None and base[s] is not None)
    unpaired = sorted((mine.keys() | base.keys()) - set(shared))
    return (np.array([mine[s] - base[s] for s in shared], dtype=float), unpaired,
            np.array([base[s] for s in shared], dtype=float))


def bootstrap_ci(diffs: np.ndarray) -> tuple[float, float]:
    """Percentile bootstrap 95% CI of the mean paired difference (seeded: the same numbers every read)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = diffs[rng.integers(0, len(diffs), (BOOTSTRAP_SAMPLES, len(diffs)))].mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def seeds_for(sd: float, half_width: float) -> int | None:
    """The fewest pairs whose 95% CI of the mean difference has at most `half_width` (sd: of the differences)."""
    if half_width <= 0:
        raise AnalysisError(f"--half-width {half_width} is not allowed; give a positive width")
    if sd == 0:
        return 2
    return next((n for n in range(2, MAX_SEEDS) if t975(n) * sd / math.sqrt(n) <= half_width), None)


def holm(p: list[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of the p-values (None stays None)."""
    known = sorted((v, i) for i, v in enumerate(p) if v is not None)
    out: list[float | None] = [None] * len(p)
    running = 0.0
    for rank, (v, i) in enumerate(known):
        running = max(running, min(1.0, (len(known) - rank) * v))
        out[i] = running
    return out


def row(setting: str, diffs: np.ndarray, unpaired: list[int], base: np.ndarray, cmp: Comparison) -> dict:
    from scipy.special import stdtr

    n = len(diffs)
    mean = float(diffs.mean()) if n else None
    sd = float(diffs.std(ddof=1)) if n > 1 else None
    half = t975(n) * sd / math.sqrt(n) if sd is not None else None
    # the one-sample t-test's two-sided p (scipy.stats.ttest_1samp's, from the t CDF it uses); sd 0: pairs alike
    p = float(2 * stdtr(n - 1, -abs(mean / (sd / math.sqrt(n))))) if n > 1 and sd else None
    out = {"setting": setting, "n_pairs": n, "baseline_mean": float(base.mean()) if n else None, "diff": mean,
           "ci95_lo": mean - half if half is not None else None, "ci95_hi": mean + half if half is not None else None,
           "p": p, "unpaired_seeds": ",".join(map(str, unpaired)) or None}
    if cmp.retention:
        lo, hi = bootstrap_ci(diffs) if n > 1 else (None, None)
        out |= {"boot_lo": lo, "boot_hi": hi}
    if cmp.half_width is not None:
        out["seeds_for_half_width"] = seeds_for(sd, cmp.half_width) if sd is not None else None
    return out


def compare(ctx: Context, cmp: Comparison) -> pl.DataFrame:
    """One row per setting other than the baseline: the paired difference to the baseline and its statistics."""
    df = values(ctx, cmp)
    settings = sorted(df["setting"].unique().to_list())
    if cmp.baseline not in settings:
        raise AnalysisError(f"--baseline {cmp.baseline!r} is not a setting of study {ctx.study!r}; its settings: "
                            + "; ".join(settings))
    if cmp.settings is not None:
        unknown = [s for s in cmp.settings if s not in settings]
        if unknown:
            raise AnalysisError(f"--settings {', '.join(map(repr, unknown))}: not a setting of study {ctx.study!r}"
                                "; its settings: " + "; ".join(settings))
    chosen = [s for s in settings if s != cmp.baseline and (cmp.settings is None or s in cmp.settings)]
    rows = []
    for setting in chosen:
        diffs, unpaired, base = paired(df, setting, cmp.baseline)
        if unpaired:
            eprint(f"loopstudy: {setting} vs {cmp.baseline}: seed(s) {', '.join(map(str, unpaired))} unpaired "
                   "(one side has no value there): left out")
        rows.append(row(setting, diffs, unpaired, base, cmp))
    if not rows:
        raise AnalysisError(f"study {ctx.study!r} has no setting besides the baseline {cmp.baseline!r}")
    out = pl.DataFrame(rows).with_columns(pl.Series("p_holm", holm([r["p"] for r in rows]), dtype=pl.Float64))
    return out.select("setting", pl.lit(cmp.baseline).alias("baseline"), pl.lit(cmp.what).alias("metric"),
                      *[c for c in out.columns if c != "setting"])
