"""Pareto dominance, the one rule every front in loopstudy is drawn by: a point is on the front when no other point
is at least as good in every objective and strictly better in one. `search_front` marks the front of an Optuna search
with several objectives (`table optuna`), counting only the complete trials that meet its constraints, as Optuna's
`best_trials` does; study.analysis.pareto draws accuracy against test-time compute over a study's readings with it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from study.spec.schema import OptunaSpec


def nondominated(values: np.ndarray, maximize: list[bool]) -> np.ndarray:
    """Per row of values (n, k): whether no other row is at least as good in every column and better in one."""
    signed = np.where(maximize, values, -values).astype(np.float64)  # larger is better in every column
    front = np.ones(len(signed), dtype=bool)
    for i, row in enumerate(signed):
        dominated_by = (signed >= row).all(axis=1) & (signed > row).any(axis=1)
        front[i] = not dominated_by.any()
    return front


def search_front(trials: pl.DataFrame, search: OptunaSpec) -> pl.DataFrame:
    """The trials with a `pareto` column: True on the front of the search's objectives among its complete trials
    that meet every constraint, False for the other complete ones, null for the rest."""
    ok = (pl.col("status") == "complete") & pl.all_horizontal(pl.col(m).is_not_null() for m in search.metrics)
    for metric, limit in search.constraints.items():
        if limit.min is not None:
            ok = ok & (pl.col(metric) >= limit.min)
        if limit.max is not None:
            ok = ok & (pl.col(metric) <= limit.max)
    trials = trials.with_row_index("_row")
    scored = trials.filter(ok)
    front = nondominated(scored.select(search.metrics).to_numpy(), [m == "max" for m in search.modes])
    on = set(scored["_row"].filter(pl.Series(front)).to_list())
    complete = pl.col("status") == "complete"
    return trials.with_columns(pl.when(complete).then(pl.col("_row").is_in(list(on))).alias("pareto")).drop("_row")
