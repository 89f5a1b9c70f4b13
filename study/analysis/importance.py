"""Which swept knob matters most: Optuna's importance evaluators over a study's stored trials.

The stored trials become finished trials of an in-memory Optuna study (each swept config column a parameter, its
distribution from the values the study used), and Optuna's evaluator ranks them; the statistics are Optuna's.
Torch-free and Ray-free, like the rest of the analysis.
"""

from __future__ import annotations

import polars as pl

from study.analysis.tables import NOT_AXES, config_columns, load_context
from study.errors import AnalysisError
from study.metrics import DEFAULT_METRIC, METRICS
from study.store import Store

EVALUATORS = ("fanova", "ped_anova", "mdi")
MIN_TRIALS = 4  # below this no evaluator's ranking is more than noise
TRIALS_PER_KNOB = 2


def make_evaluator(name: str, seed: int = 0):
    import optuna

    if name == "fanova":
        return optuna.importance.FanovaImportanceEvaluator(seed=seed)
    if name == "mdi":
        return optuna.importance.MeanDecreaseImpurityImportanceEvaluator(seed=seed)
    if name == "ped_anova":
        return optuna.importance.PedAnovaImportanceEvaluator()
    raise AnalysisError(f"evaluator {name!r} is not known; use one of {', '.join(EVALUATORS)}")


def swept_knobs(trials: pl.DataFrame) -> list[str]:
    """Config columns (dotted keys) that take more than one value across the trials; a variant's name is not a
    knob (its keys are), nor is the seed."""
    return [c for c in config_columns(trials) if c not in NOT_AXES | {"label"}
            and trials[c].drop_nulls().n_unique() > 1]


def confounded(trials: pl.DataFrame, knobs: list[str]) -> list[tuple[str, str]]:
    """Pairs of knobs whose values determine each other across the trials (each value of one always comes with
    the same value of the other, both ways): their effects cannot be told apart."""
    out = []
    for i, a in enumerate(knobs):
        for b in knobs[i + 1:]:
            pairs = trials.select(pl.col(a).cast(pl.String), pl.col(b).cast(pl.String)).unique()
            if pairs.height == pairs[a].n_unique() == pairs[b].n_unique():
                out.append((a, b))
    return out


def distribution(values: pl.Series):
    """An Optuna distribution spanning the values a study used: numbers as ranges, anything else as choices."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if values.dtype.is_integer():
        return IntDistribution(int(values.min()), int(values.max()))
    if values.dtype.is_float():
        return FloatDistribution(float(values.min()), float(values.max()))
    return CategoricalDistribution(sorted(str(v) for v in values.unique().to_list()))


def importance(store: Store, study: str, metric: str = DEFAULT_METRIC, evaluator: str = "fanova",
               skip_bad: bool = False, include_stale: bool = False) -> pl.DataFrame:
    """One row per swept knob: its importance for `metric` (summing to 1), most important first."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    if metric not in METRICS:
        raise AnalysisError(f"metric {metric!r} is not known; use one of {', '.join(METRICS)}")
    ctx = load_context(store, study, skip_bad, include_stale)
    trials = ctx.trials.filter(pl.col(metric).is_not_null())
    knobs = swept_knobs(trials)
    if not knobs:
        raise AnalysisError(f"study {study!r} sweeps no knob (only seeds): there is nothing to rank")
    need = max(MIN_TRIALS, TRIALS_PER_KNOB * len(knobs))
    if trials.height < need:
        raise AnalysisError(f"study {study!r} has {trials.height} complete trial(s) with {metric} for {len(knobs)} "
                            f"swept knob(s); a ranking needs at least {need} ({TRIALS_PER_KNOB} per knob, "
                            f"{MIN_TRIALS} at least) to mean anything: run more samples")
    # an Optuna search samples its knobs independently: all-distinct values pair up one to one by chance, not by design
    searched = ctx.members is not None and ctx.members.search is not None
    tied = [] if searched else confounded(trials, knobs)
    if tied:
        pairs = "; ".join(f"{a} and {b}" for a, b in tied)
        raise AnalysisError(f"study {study!r}: the knobs change together across its trials ({pairs}), so no "
                            "evaluator can tell their effects apart; sweep them separately (or rank one of them)")
    dists = {k: distribution(trials[k].drop_nulls()) for k in knobs}
    opt = optuna.create_study(direction="minimize" if METRICS[metric].mode == "min" else "maximize")
    categorical = {k for k, d in dists.items() if isinstance(d, CategoricalDistribution)}
    for row in trials.select([*knobs, metric]).iter_rows(named=True):
        params = {k: str(row[k]) if k in categorical else row[k] for k in knobs if row[k] is not None}
        opt.add_trial(optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params},
                                                value=float(row[metric])))
    try:
        # params in sorted order: Optuna 5.1's MDI evaluator hands its scores back in sorted-name order whatever
        # order `params` has, so any other order swaps knobs (checked on a two-knob example)
        scores = optuna.importance.get_param_importances(opt, evaluator=make_evaluator(evaluator),
                                                         params=sorted(knobs))
    except (ImportError, RuntimeError, ValueError) as e:
        raise AnalysisError(f"importance ({evaluator}) failed: {e}") from None
    return pl.DataFrame({"knob": list(scores), "importance": [float(v) for v in scores.values()],
                         "values": [str(sorted(trials[k].drop_nulls().unique().to_list())) for k in scores]})
