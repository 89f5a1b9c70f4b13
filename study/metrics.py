"""One registry of the names every layer shares: the summary metrics a trial reports, and output formats.

A trial's summary metrics are computed once (study.trial.summary_metrics), stored in its `trials` row, sent to
Tune, searched by Optuna (`sweep.optuna.metric`) and ranked by `loopstudy importance`. Each list below is derived
from METRICS, so a new metric is one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Metric:
    """name: column of the trials table. mode: which way is better. searchable: Optuna may optimise it (known
    once evaluation ends; the training loss is not a goal). help: one line for --help."""

    name: str
    mode: Literal["max", "min"]
    searchable: bool
    help: str


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("final_exact_acc", "max", True, "exact accuracy at the deepest test-time depth"),
    Metric("best_exact_acc", "max", True, "exact accuracy at the best test-time depth"),
    Metric("final_train_loss", "min", False, "training loss at the last logged step"),
    Metric("final_cell_acc", "max", True, "cell accuracy at the deepest test-time depth"),
)}

SEARCH_METRICS = tuple(n for n, m in METRICS.items() if m.searchable)  # sweep.optuna.metric
SearchMetric = Literal[SEARCH_METRICS]  # type: ignore[valid-type]
DEFAULT_METRIC = "final_exact_acc"

# Output formats of every command that prints a table.
FORMATS = ("terminal", "markdown", "csv", "latex")
