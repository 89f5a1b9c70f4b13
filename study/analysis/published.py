"""The papers' published numbers (study/data/published.csv, each row with its source), and the rule that puts
them beside measured rows: only of the same task."""

from __future__ import annotations

import io
from importlib import resources

import polars as pl


def published(table: str | None = None) -> pl.DataFrame:
    """The papers' numbers shipped with the package (study/data/published.csv), each row with its source."""
    text = resources.files("study.data").joinpath("published.csv").read_text()
    df = pl.read_csv(io.StringIO(text), schema_overrides={"x": pl.String})
    return df if table is None else df.filter(pl.col("table") == table)


def dt_multiple(x: str) -> float:
    """A published Deep Thinking reading's depth as a multiple of its training depth: x = "test/train" iterations."""
    test, train = x.split("/")
    return int(test) / int(train)


# The task each published table was measured on: Deep Thinking's curves by method, every other table on
# Sudoku-Extreme (the InfiLoop and FPRM papers' ablations). Published rows join measured rows of the same task only.
DT_TASKS = {"prefix sums": "prefix_sums", "maze": "maze"}


def published_for(table: str, task: str | None) -> pl.DataFrame:
    """The published rows of `table` measured on `task` (none for another task)."""
    pub = published(table)
    if table == "overthinking":
        keep = [m for m in pub["method"].unique().to_list() if any(k in m and t == task for k, t in DT_TASKS.items())]
        return pub.filter(pl.col("method").is_in(keep))
    if table == "main":  # the papers' headline rows: per benchmark; here ARC's (the sudoku tables carry their own)
        return pub.filter(pl.col("x") == task) if task in ARC_BENCHMARKS.values() else pub.clear()
    return pub if task == SUDOKU_EXTREME else pub.clear()


SUDOKU_EXTREME = "sudoku 9x9"  # the task of every published table but Deep Thinking's and the ARC rows
# task.dataset -> the benchmark its published rows name; only a study on the whole 30x30 canvas is that benchmark
ARC_BENCHMARKS = {"arc_agi_1": "ARC-AGI-1", "arc_agi_2": "ARC-AGI-2"}


def study_task(trials: pl.DataFrame) -> str | None:
    """The study's task, when all its trials share one: its name, for sudoku the board ("sudoku 9x9" is what
    Sudoku-Extreme is; the papers' numbers are not set beside 4x4 boards), for ARC on the 30x30 canvas the
    benchmark ("ARC-AGI-1")."""
    cols = [c for c in ("task.name", "task.size", "task.dataset") if c in trials.columns]
    keys = trials.select(cols).unique().rows() if cols else []
    if len(keys) != 1:
        return None
    name, *rest = keys[0]
    if name == "arc" and len(rest) == 2 and rest[0] == 30:  # the whole benchmark (a smaller canvas is a subset)
        return ARC_BENCHMARKS[rest[1] or "arc_agi_1"]
    return f"sudoku {rest[0]}x{rest[0]}" if name == "sudoku" and rest else name


# a published metric (a percentage) -> the measured column it stands beside (ARC's pass@2 counts per puzzle)
PUBLISHED_COLUMNS = {"exact_acc": "exact_acc", "pass@2": "puzzle_pass_at_2"}


def paper_rows(kind: str, paper_table: str | None, measured: pl.DataFrame, task: str | None = "sudoku"
               ) -> pl.DataFrame:
    """Published rows of `paper_table` shaped like the measured table of `kind`: setting '<method> [paper]',
    metric in <metric>_mean; only those measured on the study's task."""
    if paper_table is None:
        return measured.clear()
    pub = published_for(paper_table, task)
    rows = []
    for r in pub.iter_rows(named=True):
        row = {c: None for c in measured.columns}
        row.update({"setting": f"{r['method']} [paper, {r['x']}]", "source": "paper"})
        if kind == "depth":
            row.update({"setting": f"{r['method']} [paper]", "depth_layers": int(r["x"])})
        if kind == "difficulty" and r["x"].isdigit():
            row.update({"setting": f"{r['method']} [paper]", "difficulty": int(r["x"])})
        if kind == "overthinking":  # x is "<test iterations>/<training iterations>"
            row.update({"setting": f"{r['method']} [paper]", "depth_x": round(dt_multiple(r["x"]), 3)})
        # published percentages are shown as fractions, like the measured accuracies
        value = r["value"] / 100 if r["metric"] in PUBLISHED_COLUMNS else r["value"]
        col = f"{PUBLISHED_COLUMNS.get(r['metric'], r['metric'])}_mean"
        if col in row:
            row[col] = value
            rows.append(row)
    if not rows:
        return measured.clear()
    return pl.DataFrame(rows, schema=measured.schema)
