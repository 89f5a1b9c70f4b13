"""Settings chosen by name (`--settings` of `table pareto` and `plot`): a study's context narrowed to them."""

from __future__ import annotations

import dataclasses

import polars as pl

from study.analysis.tables import Context
from study.errors import AnalysisError


def only(ctx: Context, settings: tuple[str, ...]) -> Context:
    """The context of these settings alone; AnalysisError naming the study's settings when one of them is not
    among them."""
    known = set(ctx.trials["setting"].to_list())
    unknown = [s for s in settings if s not in known]
    if unknown:
        raise AnalysisError(f"--settings {', '.join(map(repr, unknown))}: no reading of study {ctx.study!r} has "
                            "that setting; its settings: " + "; ".join(sorted(known)))
    keep = pl.col("setting").is_in(list(settings))
    kept = ctx.checkpoints.filter(keep) if ctx.checkpoints is not None else None
    return dataclasses.replace(ctx, trials=ctx.trials.filter(keep), checkpoints=kept)
