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
    once evaluation ends; the training loss is not a goal). help: one line for --help. task: the one task that
    has it (ARC's pass@2; null in the other tasks' rows), None: every task."""

    name: str
    mode: Literal["max", "min"]
    searchable: bool
    help: str
    task: str | None = None

    @property
    def every_task(self) -> bool:
        return self.task is None


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("final_exact_acc", "max", True, "exact accuracy at the deepest test-time depth"),
    Metric("best_exact_acc", "max", True, "exact accuracy at the best test-time depth"),
    Metric("final_train_loss", "min", False, "training loss at the last logged step"),
    Metric("final_cell_acc", "max", True, "cell accuracy at the deepest test-time depth"),
    Metric("final_flops", "min", True, "test-time FLOPs per sample of the deepest reading (final_exact_acc's)"),
    Metric("final_pass_at_2", "max", True, "ARC: pass@2 per puzzle (the papers' count) at the deepest depth",
           task="arc"),
)}

SEARCH_METRICS = tuple(n for n, m in METRICS.items() if m.searchable)  # sweep.optuna.metric
SearchMetric = Literal[SEARCH_METRICS]  # type: ignore[valid-type]
MetricName = Literal[tuple(METRICS)]  # type: ignore[valid-type]  # any trial metric (sweep.optuna.constraints)
DEFAULT_METRIC = "final_exact_acc"

# Output formats of every command that prints a table.
FORMATS = ("terminal", "markdown", "csv", "json", "latex")
MACHINE_FORMATS = ("csv", "json")  # every value as stored; the others round for reading


def summary_metrics(depth: list, final_train_loss: float | None) -> dict[str, float]:
    """Every metric of METRICS for one trial, from its depth rows (objects or dicts with depth_layers, difficulty,
    exact_acc, cell_acc) and its last training loss: the one computation, for a trial just run and for one read
    back from the store."""
    def get(r, k):
        return r.get(k) if isinstance(r, dict) else getattr(r, k, None)

    overall = [r for r in depth if get(r, "difficulty") is None]
    deepest = max(overall, key=lambda r: get(r, "depth_layers"))
    out = {"final_exact_acc": get(deepest, "exact_acc"), "best_exact_acc": max(get(r, "exact_acc") for r in overall),
           "final_cell_acc": get(deepest, "cell_acc")}
    if get(deepest, "flops") is not None:
        out["final_flops"] = get(deepest, "flops")
    if get(deepest, "puzzle_pass_at_2") is not None:
        out["final_pass_at_2"] = get(deepest, "puzzle_pass_at_2")
    if final_train_loss is not None:
        out["final_train_loss"] = final_train_loss
    return out


DEPTH_KEY = "depth/exact_acc/"  # + executed layers: a trial's last report carries its depth curve (study.run.tracking)


def depth_report(depth_rows) -> dict[str, float]:
    """The depth curve in a trial's last report: overall exact accuracy (every difficulty) at each test-time depth."""
    return {f"{DEPTH_KEY}{r.depth_layers}": r.exact_acc for r in depth_rows if r.difficulty is None}
