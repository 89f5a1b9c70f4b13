"""How tables look: the papers' wide layout, and each value formatted for its kind in every output format."""

from __future__ import annotations

import csv
import io
import math

import polars as pl

from study.errors import AnalysisError
from study.metrics import FORMATS


def widen(df: pl.DataFrame, metric: str | None = None) -> pl.DataFrame:
    """The papers' layout: one column per setting holding `metric` as 'mean +- 95% CI' (paper rows: the number);
    metric None: the table's first (its headline: exact_acc, ARC's pass@2 per puzzle).

    Rows are the table's other group columns (e.g. depth_layers); the std, n and source columns are dropped.
    """
    if metric is None:
        metric = next(c.removesuffix("_mean") for c in df.columns if c.endswith("_mean"))
    if f"{metric}_mean" not in df.columns:
        metrics = sorted(c.removesuffix("_mean") for c in df.columns if c.endswith("_mean"))
        raise AnalysisError(f"no metric {metric!r} in this table; metrics: {', '.join(metrics)}")
    stats = ("_mean", "_ci95", "_std")
    index = [c for c in df.columns if c not in ("setting", "source", "n") and not c.endswith(stats)]
    cells = [None if m is None else f"{m:.3f}" if c is None or math.isnan(c) else f"{m:.3f} ± {c:.3f}"
             for m, c in zip(df[f"{metric}_mean"].to_list(), df[f"{metric}_ci95"].to_list())]
    out = df.with_columns(pl.Series("cell", cells, dtype=pl.String))
    out = out.pivot(on="setting", index=index or None, values="cell", maintain_order=True)
    return out.sort(index, nulls_last=True) if index else out


def _cell(v, column: str = "") -> str:
    """A value as a table shows it: counts and layer numbers whole with thousands separators (24,960), fractions
    to three decimals, tiny values in scientific notation."""
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if "flops" in column:  # counts of 1e6..1e11: their magnitude is what a reader compares
            return f"{v:.3g}" if v else "0"
        if "layers" in column or abs(v) >= 1000:  # layer counts are whole numbers, however they were averaged
            if abs(v) < 1000 and abs(v - round(v)) >= 0.05:
                return f"{v:.1f}"
            return f"{v:,.0f}" if abs(v - round(v)) < 0.05 else f"{v:,.1f}"
        return f"{v:.2e}" if 0 < abs(v) < 1e-3 else f"{v:.3f}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


def format_table(df: pl.DataFrame, fmt: str = "terminal") -> str:
    cols = [c for c in df.columns if df[c].null_count() != df.height]
    rows = [[_cell(v, c) for v, c in zip(r, cols)] for r in df.select(cols).iter_rows()]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        w.writerows(rows)
        return buf.getvalue()
    if fmt == "markdown":
        out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out)
    if fmt == "latex":
        esc = str.maketrans({"_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#"})
        out = [r"\begin{tabular}{" + "l" * len(cols) + "}", r"\toprule",
               " & ".join(c.translate(esc) for c in cols) + r" \\", r"\midrule"]
        out += [" & ".join(v.translate(esc) for v in r) + r" \\" for r in rows]
        out += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(out)
    if fmt != "terminal":
        raise AnalysisError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(out)
