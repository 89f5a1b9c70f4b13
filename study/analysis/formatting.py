"""How tables look: the papers' wide layout, and each value formatted for its kind in every output format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from study.errors import AnalysisError
from study.metrics import FORMATS, MACHINE_FORMATS


def widen(df: pl.DataFrame, metric: str | None = None) -> pl.DataFrame:
    """The papers' layout: one column per setting holding `metric` as 'mean +- 95% CI' (paper rows: the number);
    metric None: the table's first (its headline: exact_acc, ARC's pass@2 per puzzle).

    Rows are the table's other group columns (e.g. depth_layers); the std, n and source columns are dropped.
    """
    if metric is None:
        metric = next((c.removesuffix("_mean") for c in df.columns if c.endswith("_mean")), None)
        if metric is None:
            raise AnalysisError("this table has no mean over seeds to lay out a column per setting")
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


def informative_columns(df: pl.DataFrame, keep: tuple[str, ...] = ("setting", "trial_id")) -> list[str]:
    """The columns worth showing: not empty on every row, and (with two rows or more) not the same on every row,
    but for `keep`."""
    return [c for c in df.columns if df[c].null_count() != df.height
            and (df.height < 2 or c in keep or df[c].cast(pl.String).n_unique() > 1)]


def settings_layout(df: pl.DataFrame) -> pl.DataFrame | None:
    """A table that compares settings as the papers print it: the measured rows, a column per setting holding the
    headline's 'mean ± 95% CI' (widen), no column that says the same on every row. None when it has no settings
    or no mean over seeds to lay out."""
    measured = df.filter(pl.col("source") == "measured") if "source" in df.columns else df
    if "setting" not in df.columns or measured.height == 0:
        return None
    try:
        wide = widen(measured)
    except (AnalysisError, pl.exceptions.PolarsError):
        return None
    return wide.select(informative_columns(wide, keep=tuple(measured["setting"].unique().to_list())))


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


def machine_readable(df: pl.DataFrame, fmt: str) -> str:
    """The table for another program: every stored value as it is (no rounding, no thousands separators). csv:
    nested values (lists, structs) as JSON text in their cell; json: an array of one object per row."""
    if fmt == "json":  # (Polars writes decimals as strings; SQL literals are decimals: JSON numbers here)
        return df.with_columns(pl.col(pl.Decimal).cast(pl.Float64)).write_json()
    flat = df.with_columns(pl.Series(c, [None if v is None else json.dumps(v) for v in df[c].to_list()],
                                     dtype=pl.String) for c, t in df.schema.items() if t.is_nested())
    return flat.write_csv()


def write_table(df: pl.DataFrame, path: Path) -> None:
    """The table whole into a Parquet file (--out FILE.parquet): the values and their types as read."""
    if path.suffix != ".parquet":
        raise AnalysisError(f"--out {path}: a .parquet file (for csv or json, use --format and redirect stdout)")
    path.parent.mkdir(parents=True, exist_ok=True)
    df.write_parquet(path)


def format_table(df: pl.DataFrame, fmt: str = "terminal") -> str:
    """The table in `fmt`: terminal, markdown and latex round for reading (_cell); csv and json carry every
    value as stored (machine_readable)."""
    if fmt in MACHINE_FORMATS:
        return machine_readable(df, fmt)
    cols = [c for c in df.columns if df[c].null_count() != df.height]
    rows = [[_cell(v, c) for v, c in zip(r, cols)] for r in df.select(cols).iter_rows()]
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
