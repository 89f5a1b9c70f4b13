"""Figures from the results store alone (matplotlib, Agg; no torch, no Ray). Each is written as PNG and PDF.

depth          exact accuracy vs executed layers (log x), mean line and 95% CI band per setting, paper markers
difficulty     exact accuracy by difficulty at the deepest depth, per setting
gamma          InfiLoop step size gamma_t aligned to each puzzle's solving update (offset 0)
score          content score (median) against the number of wrong cells
eff_layers     effective layers against difficulty (halting)
perturbation   solved puzzles kept and relative distance after a perturbation, per eps
overthinking   exact accuracy vs depth as a multiple of training depth, with Deep Thinking's published curves
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from study.analysis.tables import (  # noqa: E402
    AnalysisError,
    Context,
    aggregate,
    deepest,
    dt_multiple,
    load_context,
    overall,
    published,
    with_depth_multiple,
)
from study.store import Store  # noqa: E402

matplotlib.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "svg.hashsalt": "loopstudy",
                            "figure.dpi": 100, "font.size": 9})


def _bands(ax, lf: pl.LazyFrame, x: str, value: str, empty: str | None = None,
           limits: tuple[float, float] = (-math.inf, math.inf), alpha: float = 0.2) -> None:
    """One line per setting: the mean of `value` over seeds against `x`, with its 95% CI as a band (clipped to
    the value's range: an accuracy's band stops at 1)."""
    df = aggregate(lf, ["setting", x], [value])
    if df.height == 0 and empty:
        raise AnalysisError(empty)
    for (setting,), g in df.group_by("setting", maintain_order=True):
        g = g.sort(x)
        xs, mean = g[x].to_list(), g[f"{value}_mean"].to_list()
        ci = [c or 0.0 for c in g[f"{value}_ci95"].to_list()]
        line, = ax.plot(xs, mean, marker="o", ms=3, label=setting)
        lo, hi = limits
        ax.fill_between(xs, [max(lo, m - c) for m, c in zip(mean, ci)], [min(hi, m + c) for m, c in zip(mean, ci)],
                        alpha=alpha, color=line.get_color(), linewidth=0)


def _labels(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _by_difficulty(ctx: Context) -> pl.LazyFrame:
    return deepest(ctx.table("depth_eval")).filter(pl.col("difficulty").is_not_null())


def _dynamics(ctx: Context, kind: str) -> pl.LazyFrame:
    return ctx.table("dynamics").filter((pl.col("kind") == kind) & (pl.col("axis") == "outer"))


def fig_depth(ctx: Context, ax) -> None:
    _bands(ax, overall(ctx.table("depth_eval")), "depth_layers", "exact_acc", limits=(0.0, 1.0))
    pub = published("depth").filter(pl.col("metric") == "exact_acc")
    markers = {"InfiLoop": "^", "FPRM": "s", "TRM": "v"}
    for (method,), g in pub.group_by("method", maintain_order=True):
        if method in markers:
            ax.scatter([int(x) for x in g["x"]], [v / 100 for v in g["value"]], marker=markers[method],
                       facecolors="none", edgecolors="gray", s=30, label=f"{method} [paper, Sudoku-Extreme]")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    _labels(ax, "Accuracy vs test-time depth", "executed layers (test-time depth)", "exact accuracy")


def fig_difficulty(ctx: Context, ax) -> None:
    _bands(ax, _by_difficulty(ctx), "difficulty", "exact_acc", limits=(0.0, 1.0))
    _labels(ax, "Accuracy by difficulty", "difficulty (blanks / path length)", "exact accuracy at deepest depth")


def fig_gamma(ctx: Context, ax) -> None:
    _bands(ax, _dynamics(ctx, "aligned"), "offset", "gamma_mean",
           empty="no InfiLoop outer-axis dynamics in this study (gamma needs rule=infiloop)")
    ax.axvline(0, color="gray", lw=0.8, ls="--")
    _labels(ax, "Step size aligned to the solving update", "updates relative to the solving update",
            "step size gamma_t (outer axis)")


def fig_score(ctx: Context, ax) -> None:
    _bands(ax, _dynamics(ctx, "score_vs_wrong"), "wrong_cells", "score_median",
           empty="no InfiLoop content scores in this study (needs rule=infiloop)")
    _labels(ax, "Content score vs wrong cells", "wrong cells", "content score s_t (median)")


def fig_eff_layers(ctx: Context, ax) -> None:
    _bands(ax, _by_difficulty(ctx), "difficulty", "eff_layers")
    _labels(ax, "Effective layers vs difficulty", "difficulty (blanks / path length)", "effective layers")


def fig_overthinking(ctx: Context, ax) -> None:
    _bands(ax, overall(with_depth_multiple(ctx, ctx.table("depth_eval"))), "depth_x", "exact_acc", limits=(0.0, 1.0),
           alpha=0.07)  # many settings: faint bands
    markers = iter("v^s<>D")
    for (method,), g in published("overthinking").group_by("method", maintain_order=True):
        ax.plot([dt_multiple(x) for x in g["x"]], [v / 100 for v in g["value"]], marker=next(markers, "o"),
                ls=":", lw=0.8, color="black", alpha=0.6, mfc="none", ms=5, label=f"{method} [paper]")
    ax.axvline(1, color="gray", lw=0.8, ls="--")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # many settings: beside the axes
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    _labels(ax, "Overthinking: accuracy past the training depth", "test-time depth / training depth",
            "exact accuracy (all test lengths)")


def fig_perturbation(ctx: Context, ax) -> None:
    df = aggregate(ctx.table("perturbation"), ["setting", "eps", "updates_after"], ["solved_kept"])
    if df.height == 0:
        raise AnalysisError("no perturbation rows in this study (set eval.perturb_update)")
    for (setting, eps), g in df.group_by(["setting", "eps"], maintain_order=True):
        g = g.sort("updates_after")
        ax.plot(g["updates_after"].to_list(), g["solved_kept_mean"].to_list(), label=f"{setting} eps={eps:g}",
                lw=1)
    ax.set_ylim(-0.02, 1.02)
    _labels(ax, "Perturbation retention", "updates after the perturbation", "solved puzzles kept")


FIGURES: dict[str, Callable[[Context, plt.Axes], None]] = {
    "depth": fig_depth, "difficulty": fig_difficulty, "gamma": fig_gamma, "score": fig_score,
    "eff_layers": fig_eff_layers, "perturbation": fig_perturbation, "overthinking": fig_overthinking,
}


FIGSIZE = {"overthinking": (9.6, 4.6)}  # inches; the rest (6.4, 4.2)


def plot(store: Store, study: str, kind: str, out: str | Path, skip_bad: bool = False,
         ctx: Context | None = None, include_stale: bool = False) -> list[Path]:
    """Write figure `kind` (or 'all') as PNG and PDF into `out`; returns the files written."""
    kinds = list(FIGURES) if kind == "all" else [kind]
    for k in kinds:
        if k not in FIGURES:
            raise AnalysisError(f"unknown figure {k!r}; figures: {', '.join(FIGURES)}, all")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AnalysisError(f"--figures {out} is a file; give a folder (it is created if missing)")
    ctx = ctx or load_context(store, study, skip_bad, include_stale)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for k in kinds:
        fig, ax = plt.subplots(figsize=FIGSIZE.get(k, (6.4, 4.2)), layout="constrained")
        try:
            FIGURES[k](ctx, ax)
        except AnalysisError:
            plt.close(fig)
            if kind != "all":
                raise
            continue  # 'all' draws what the study has
        ax.grid(alpha=0.3)
        if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
        for ext, meta in (("png", {"Software": None}), ("pdf", {"CreationDate": None, "ModDate": None})):
            path = out / f"{study}_{k}.{ext}"
            fig.savefig(path, metadata=meta)
            written.append(path)
        plt.close(fig)
    return written
