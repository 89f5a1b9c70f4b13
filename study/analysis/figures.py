"""Figures from the results store alone (matplotlib, Agg; no torch, no Ray). Each is written as PNG and PDF.

depth          exact accuracy vs executed layers (log x), mean line and 95% CI band per setting, paper markers
difficulty     exact accuracy by difficulty at the deepest depth, per setting
gamma          InfiLoop step size gamma_t aligned to each puzzle's solving update (offset 0)
score          content score (median) against the number of wrong cells
eff_layers     effective layers against difficulty (halting)
perturbation   solved puzzles kept and relative distance after a perturbation, per eps
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from study.analysis.tables import AnalysisError, Context, aggregate, deepest, load_context, overall, published  # noqa: E402
from study.store import Store  # noqa: E402

matplotlib.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "svg.hashsalt": "loopstudy",
                            "figure.dpi": 100, "font.size": 9})


def _band(ax, x, mean, ci, label):
    line, = ax.plot(x, mean, marker="o", ms=3, label=label)
    lo = [m - (c or 0) for m, c in zip(mean, ci)]
    hi = [m + (c or 0) for m, c in zip(mean, ci)]
    ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color(), linewidth=0)
    return line


def fig_depth(ctx: Context, ax) -> None:
    df = aggregate(overall(ctx.table("depth_eval")), ["setting", "depth_layers"], ["exact_acc"])
    for setting, g in df.group_by("setting", maintain_order=True):
        g = g.sort("depth_layers")
        _band(ax, g["depth_layers"].to_list(), g["exact_acc_mean"].to_list(), g["exact_acc_ci95"].to_list(),
              setting[0])
    pub = published("depth").filter(pl.col("metric") == "exact_acc")
    markers = {"InfiLoop": "^", "FPRM": "s", "TRM": "v"}
    for method, g in pub.group_by("method", maintain_order=True):
        if method[0] in markers:
            ax.scatter([int(x) for x in g["x"]], [v / 100 for v in g["value"]], marker=markers[method[0]],
                       facecolors="none", edgecolors="gray", s=30, label=f"{method[0]} [paper, Sudoku-Extreme]")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("executed layers (test-time depth)")
    ax.set_ylabel("exact accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Accuracy vs test-time depth")


def fig_difficulty(ctx: Context, ax) -> None:
    lf = deepest(ctx.table("depth_eval")).filter(pl.col("difficulty").is_not_null())
    df = aggregate(lf, ["setting", "difficulty"], ["exact_acc"])
    for setting, g in df.group_by("setting", maintain_order=True):
        g = g.sort("difficulty")
        _band(ax, g["difficulty"].to_list(), g["exact_acc_mean"].to_list(), g["exact_acc_ci95"].to_list(),
              setting[0])
    ax.set_xlabel("difficulty (blanks / path length)")
    ax.set_ylabel("exact accuracy at deepest depth")
    ax.set_title("Accuracy by difficulty")


def _dynamics(ctx: Context, kind: str) -> pl.LazyFrame:
    return ctx.table("dynamics").filter((pl.col("kind") == kind) & (pl.col("axis") == "outer"))


def fig_gamma(ctx: Context, ax) -> None:
    df = aggregate(_dynamics(ctx, "aligned"), ["setting", "offset"], ["gamma_mean"])
    if df.height == 0:
        raise AnalysisError("no InfiLoop outer-axis dynamics in this study (gamma needs rule=infiloop)")
    for setting, g in df.group_by("setting", maintain_order=True):
        g = g.sort("offset")
        _band(ax, g["offset"].to_list(), g["gamma_mean_mean"].to_list(), g["gamma_mean_ci95"].to_list(), setting[0])
    ax.axvline(0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("updates relative to the solving update")
    ax.set_ylabel("step size gamma_t (outer axis)")
    ax.set_title("Step size aligned to the solving update")


def fig_score(ctx: Context, ax) -> None:
    df = aggregate(_dynamics(ctx, "score_vs_wrong"), ["setting", "wrong_cells"], ["score_median"])
    if df.height == 0:
        raise AnalysisError("no InfiLoop content scores in this study (needs rule=infiloop)")
    for setting, g in df.group_by("setting", maintain_order=True):
        g = g.sort("wrong_cells")
        _band(ax, g["wrong_cells"].to_list(), g["score_median_mean"].to_list(), g["score_median_ci95"].to_list(),
              setting[0])
    ax.set_xlabel("wrong cells")
    ax.set_ylabel("content score s_t (median)")
    ax.set_title("Content score vs wrong cells")


def fig_eff_layers(ctx: Context, ax) -> None:
    lf = deepest(ctx.table("depth_eval")).filter(pl.col("difficulty").is_not_null())
    df = aggregate(lf, ["setting", "difficulty"], ["eff_layers"])
    for setting, g in df.group_by("setting", maintain_order=True):
        g = g.sort("difficulty")
        _band(ax, g["difficulty"].to_list(), g["eff_layers_mean"].to_list(), g["eff_layers_ci95"].to_list(),
              setting[0])
    ax.set_xlabel("difficulty (blanks / path length)")
    ax.set_ylabel("effective layers")
    ax.set_title("Effective layers vs difficulty")


def fig_perturbation(ctx: Context, ax) -> None:
    df = aggregate(ctx.table("perturbation"), ["setting", "eps", "updates_after"], ["solved_kept"])
    if df.height == 0:
        raise AnalysisError("no perturbation rows in this study (set eval.perturb_update)")
    for (setting, eps), g in df.group_by(["setting", "eps"], maintain_order=True):
        g = g.sort("updates_after")
        ax.plot(g["updates_after"].to_list(), g["solved_kept_mean"].to_list(), label=f"{setting} eps={eps:g}",
                lw=1)
    ax.set_xlabel("updates after the perturbation")
    ax.set_ylabel("solved puzzles kept")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Perturbation retention")


FIGURES: dict[str, Callable[[Context, plt.Axes], None]] = {
    "depth": fig_depth, "difficulty": fig_difficulty, "gamma": fig_gamma, "score": fig_score,
    "eff_layers": fig_eff_layers, "perturbation": fig_perturbation,
}


def plot(store: Store, study: str, kind: str, out: str | Path, skip_bad: bool = False,
         ctx: Context | None = None) -> list[Path]:
    """Write figure `kind` (or 'all') as PNG and PDF into `out`; returns the files written."""
    kinds = list(FIGURES) if kind == "all" else [kind]
    for k in kinds:
        if k not in FIGURES:
            raise AnalysisError(f"unknown figure {k!r}; figures: {', '.join(FIGURES)}, all")
    ctx = ctx or load_context(store, study, skip_bad)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for k in kinds:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
        try:
            FIGURES[k](ctx, ax)
        except AnalysisError:
            plt.close(fig)
            if kind != "all":
                raise
            continue  # 'all' draws what the study has
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
        for ext, meta in (("png", {"Software": None}), ("pdf", {"CreationDate": None, "ModDate": None})):
            path = out / f"{study}_{k}.{ext}"
            fig.savefig(path, metadata=meta)
            written.append(path)
        plt.close(fig)
    return written
