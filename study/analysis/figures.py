"""Figures from the results store alone (matplotlib, Agg; no torch, no Ray), each written as PNG and PDF. The kinds
and what each shows: study.analysis.figure_kinds; `fig_<kind>` draws one panel of it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter  # noqa: E402

from study.analysis.figure_kinds import FIGURE_KINDS  # noqa: E402
from study.analysis.pareto import Frontier, pareto  # noqa: E402
from study.analysis.published import dt_multiple, published_for, study_task  # noqa: E402
from study.analysis.selection import only  # noqa: E402
from study.analysis.tables import (  # noqa: E402
    AnalysisError,
    Context,
    aggregate,
    applies,
    checkpoint_readings,
    deepest,
    halting_evaluated,
    halts,
    load_context,
    overall,
    reads_past_training,
    with_depth_multiple,
)
from study.store import Store  # noqa: E402

matplotlib.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "svg.hashsalt": "loopstudy",
                            "figure.dpi": 100, "font.size": 9})


MAX_LEGEND = 8  # entries per axes; more settings are faceted into panels
LEGEND_INSIDE = 4  # entries a legend may have inside its axes; a longer one goes below them
LEGEND_TWO_COLUMNS = 40  # the longest name a legend below a panel fits in two columns (font size 7)


@dataclass
class Style:
    """How a figure is drawn for one study: a colour per setting (the same in every panel) and whether the
    published markers may widen the axes (--paper)."""

    colors: dict[str, str] = field(default_factory=dict)
    paper: bool = False

    def color(self, setting: str) -> str | None:
        return self.colors.get(setting)


def _bands(ax, lf: pl.LazyFrame, x: str, value: str, empty: str | None = None,
           limits: tuple[float, float] = (-math.inf, math.inf), alpha: float = 0.2, style: Style | None = None,
           linestyle: str = "-", label: bool = True) -> None:
    """One line per setting: the mean of `value` over seeds against `x`, with its 95% CI as a band (clipped to
    the value's range: an accuracy's band stops at 1). label False: a second series of the same settings, kept out
    of the legend."""
    df = aggregate(lf, ["setting", x], [value])
    if df.height == 0 and empty:
        raise AnalysisError(empty)
    style = style or Style()
    for (setting,), g in df.group_by("setting", maintain_order=True):
        g = g.sort(x)
        xs, mean = g[x].to_list(), g[f"{value}_mean"].to_list()
        ci = [c or 0.0 for c in g[f"{value}_ci95"].to_list()]
        line, = ax.plot(xs, mean, marker="o", ms=3, label=setting if label else None, color=style.color(setting),
                        linestyle=linestyle)
        lo, hi = limits
        ax.fill_between(xs, [max(lo, m - c) for m, c in zip(mean, ci)], [min(hi, m + c) for m, c in zip(mean, ci)],
                        alpha=alpha, color=line.get_color(), linewidth=0)


def _labels(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _integer_x(ax) -> None:
    """Whole quantities (blanks, updates, wrong cells) on whole ticks only."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _plain_log_ticks(ax, values: list[float], base: float) -> None:
    """A log axis labelled with the values themselves (12, 24, 48 / 0.5, 1, 2), no minor labels to collide."""
    ax.set_xscale("log", base=base)
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 100 else f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _by_difficulty(ctx: Context) -> pl.LazyFrame:
    return deepest(ctx.table("depth_eval")).filter(pl.col("difficulty").is_not_null())


def _dynamics(ctx: Context, kind: str) -> pl.LazyFrame:
    return ctx.table("dynamics").filter((pl.col("kind") == kind) & (pl.col("axis") == "outer"))


def fig_depth(ctx: Context, ax, style: Style | None = None) -> None:
    style = style or Style()
    lf = overall(ctx.table("depth_eval"))
    value, ylabel = ctx.headline
    _bands(ax, lf, "depth_layers", value, limits=(0.0, 1.0), style=style)
    if ctx.pooled:  # ARC: beside pass@2 (zero for long at small scale) the per-cell accuracy of every version, dashed
        same = dataclasses.replace(style, colors={line.get_label(): line.get_color() for line in ax.get_lines()})
        _bands(ax, lf, "depth_layers", "cell_acc", limits=(0.0, 1.0), style=same, linestyle="--", label=False)
        ylabel = f"{ylabel}; dashed: cell accuracy"
    measured = sorted(lf.select("depth_layers").unique().collect()["depth_layers"].to_list())
    # the published readings are on Sudoku-Extreme: beside sudoku studies only, and inside the measured range
    # unless asked for (--paper), so 24,960-layer markers never squash a study read to 192 layers
    pub = published_for("depth", study_task(ctx.trials)).filter(pl.col("metric") == "exact_acc")
    markers = {"InfiLoop": "^", "FPRM": "s", "TRM": "v"}
    shown = []
    for (method,), g in pub.group_by("method", maintain_order=True):
        xs = [int(x) for x in g["x"]]
        keep = [i for i, x in enumerate(xs) if style.paper or measured[0] <= x <= measured[-1]]
        if method in markers and keep:
            ax.scatter([xs[i] for i in keep], [g["value"][i] / 100 for i in keep], marker=markers[method],
                       facecolors="none", edgecolors="gray", s=30, label=f"{method} [paper, Sudoku-Extreme]")
            shown += [xs[i] for i in keep]
    ticks = sorted(set(measured) | set(shown))
    _plain_log_ticks(ax, ticks if len(ticks) <= 8 else ticks[::max(1, len(ticks) // 8)], base=2)
    ax.set_ylim(-0.02, 1.02)
    _labels(ax, "Accuracy vs test-time depth", "executed layers (test-time depth)", ylabel)


def fig_difficulty(ctx: Context, ax, style: Style | None = None) -> None:
    lf = _by_difficulty(ctx)
    if lf.select(pl.col("difficulty").n_unique()).collect().item() < 2:
        raise AnalysisError("one difficulty only: nothing to compare")
    value, ylabel = ctx.headline
    _bands(ax, lf, "difficulty", value, limits=(0.0, 1.0), style=style)
    if ctx.pooled:  # ARC's size classes are powers of two
        _plain_log_ticks(ax, sorted(lf.select("difficulty").unique().collect()["difficulty"].to_list()), base=2)
    else:
        _integer_x(ax)
    ax.set_ylim(-0.02, 1.02)
    what = "output cells, rounded up to a power of 2" if ctx.pooled else "blanks / path length"
    _labels(ax, "Accuracy by difficulty", f"difficulty ({what})", f"{ylabel} at deepest depth")


def fig_gamma(ctx: Context, ax, style: Style | None = None) -> None:
    _bands(ax, _dynamics(ctx, "aligned"), "offset", "gamma_mean",
           empty="no InfiLoop outer-axis dynamics in this study (gamma needs rule=infiloop)", style=style)
    ax.axvline(0, color="gray", lw=0.8, ls="--")
    _integer_x(ax)
    _labels(ax, "Step size aligned to the solving update", "updates relative to the solving update",
            "step size gamma_t (outer axis)")


def fig_score(ctx: Context, ax, style: Style | None = None) -> None:
    _bands(ax, _dynamics(ctx, "score_vs_wrong"), "wrong_cells", "score_median",
           empty="no InfiLoop content scores in this study (needs rule=infiloop)", style=style)
    _integer_x(ax)
    _labels(ax, "Content score vs wrong cells", "wrong cells", "content score s_t (median)")


def fig_eff_layers(ctx: Context, ax, style: Style | None = None) -> None:
    if not halting_evaluated(ctx):
        raise AnalysisError("no trial halts at test time: every sample runs every layer")
    # only the settings that halt: the others run every layer of the deepest reading, a flat line far above
    halting = dataclasses.replace(ctx, trials=ctx.trials.filter(halts(ctx)))
    _bands(ax, _by_difficulty(halting), "difficulty", "eff_layers", style=style)
    _integer_x(ax)
    _labels(ax, "Effective layers vs difficulty (settings that halt)", "difficulty (blanks / path length)",
            "effective layers at the deepest reading")


def fig_overthinking(ctx: Context, ax, style: Style | None = None) -> None:
    if not reads_past_training(ctx):
        raise AnalysisError("no reading past the training depth: nothing to show about overthinking")
    lf = overall(with_depth_multiple(ctx, ctx.table("depth_eval")))
    value, ylabel = ctx.headline
    _bands(ax, lf, "depth_x", value, limits=(0.0, 1.0), alpha=0.1, style=style)
    markers = iter("v^s<>D")
    for (method,), g in published_for("overthinking", study_task(ctx.trials)).group_by("method",
                                                                                       maintain_order=True):
        ax.plot([dt_multiple(x) for x in g["x"]], [v / 100 for v in g["value"]], marker=next(markers, "o"),
                ls=":", lw=0.8, color="black", alpha=0.6, mfc="none", ms=5, label=f"{method} [paper]")
    ax.axvline(1, color="gray", lw=0.8, ls="--")
    xs = sorted(lf.select("depth_x").unique().collect()["depth_x"].to_list())
    nice = [v for v in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200) if xs[0] <= v <= xs[-1] * 1.01]
    _plain_log_ticks(ax, xs if len(xs) <= 8 else nice, base=10)
    ax.set_ylim(-0.02, 1.02)
    lengths = [c for c in ("task.test_lengths", "task.test_size") if c in ctx.trials.columns
               and ctx.trials[c].is_not_null().any()]  # an extrapolation study: its accuracy spans every test size
    _labels(ax, "Overthinking: accuracy past the training depth", "test-time depth / training depth",
            f"{ylabel} (all test sizes)" if lengths else ylabel)


def fig_perturbation(ctx: Context, ax, style: Style | None = None) -> None:
    """One setting per panel (see PER_PANEL): a line per perturbation size."""
    df = aggregate(ctx.table("perturbation"), ["setting", "eps", "updates_after"], ["solved_kept"])
    if df.height == 0:
        raise AnalysisError("no perturbation rows in this study (set eval.perturb_update)")
    eps_all = sorted(df["eps"].unique().to_list())
    cmap = matplotlib.colormaps["viridis"]
    for (_, eps), g in df.group_by(["setting", "eps"], maintain_order=True):
        g = g.sort("updates_after")
        shade = cmap(eps_all.index(eps) / max(1, len(eps_all) - 1) * 0.85)
        ax.plot(g["updates_after"].to_list(), g["solved_kept_mean"].to_list(), label=f"eps={eps:g}", lw=1.2,
                marker="o", ms=3, color=shade)
    ax.set_ylim(-0.02, 1.02)
    _integer_x(ax)
    settings = df["setting"].unique().to_list()
    _labels(ax, f"Perturbation retention: {settings[0]}" if len(settings) == 1 else "Perturbation retention",
            "updates after the perturbation", "solved puzzles kept")


def fig_checkpoints(ctx: Context, ax, style: Style | None = None) -> None:
    """One setting per panel (see PER_PANEL): a line per test-time depth, accuracy against the training step."""
    why = applies("checkpoints", ctx)
    if why:
        raise AnalysisError(why)
    value, ylabel = ctx.headline
    df = aggregate(overall(checkpoint_readings(ctx)), ["setting", "depth_layers", "train_step"], [value])
    depths = sorted(df["depth_layers"].unique().to_list())
    cmap = matplotlib.colormaps["viridis"]
    for (_, depth), g in df.group_by(["setting", "depth_layers"], maintain_order=True):
        g = g.sort("train_step")
        ax.plot(g["train_step"].to_list(), g[f"{value}_mean"].to_list(), marker="o", ms=3, lw=1.2,
                color=cmap(depths.index(depth) / max(1, len(depths) - 1) * 0.85), label=f"{depth:,} layers")
    ax.set_ylim(-0.02, 1.02)
    settings = df["setting"].unique().to_list()
    _labels(ax, f"Accuracy along training: {settings[0]}" if len(settings) == 1 else "Accuracy along training",
            "training step of the weights read", f"{ylabel} (mean over seeds)")


def fig_pareto(ctx: Context, ax, style: Style | None = None) -> None:
    """Every reading (setting x depth) at its mean FLOPs per sample and accuracy, 95% CIs over seeds both ways; the
    front (study.analysis.pareto) joined by a step line: the best accuracy each compute buys."""
    style = style or Style()
    value, ylabel = ctx.headline
    df = pareto(ctx, Frontier(value, every_point=True))
    for (setting,), g in df.group_by("setting", maintain_order=True):
        ax.errorbar(g["flops_mean"].to_list(), g[f"{value}_mean"].to_list(),
                    xerr=[c or 0.0 for c in g["flops_ci95"].to_list()],
                    yerr=[c or 0.0 for c in g[f"{value}_ci95"].to_list()], fmt="o", ms=4, capsize=2, lw=0.8,
                    color=style.color(setting), label=setting, alpha=0.85)
    front = df.filter(pl.col("front")).sort("flops_mean")
    xs, ys = front["flops_mean"].to_list(), front[f"{value}_mean"].to_list()
    # carried on to the costliest reading: the best accuracy any larger budget buys
    ax.step([*xs, df["flops_mean"].max()], [*ys, ys[-1]], where="post", color="black", lw=1.0, label="Pareto front")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    _labels(ax, "Accuracy vs test-time compute", "FLOPs per sample (test time, log scale)",
            f"{ylabel} (mean over seeds)")


FIGURES: dict[str, Callable[..., None]] = {kind: globals()[f"fig_{kind}"] for kind in FIGURE_KINDS}
# settings per panel, so that no legend has more than MAX_LEGEND entries: room for the published series (up to
# three) beside the measured ones; one setting per perturbation panel (its lines are the perturbation sizes); the
# Pareto front is over every setting at once: one panel, whatever its legend's length
ONE_PANEL = 10**9
PER_PANEL = {"perturbation": 1, "checkpoints": 1, "depth": MAX_LEGEND - 3, "overthinking": MAX_LEGEND - 3,
             "pareto": ONE_PANEL}
PANEL = (5.6, 4.0)  # inches per panel
# A one-panel figure whose legend has no bound (the Pareto front's) puts it beside the axes, one entry a line, and
# grows to hold it: inches per entry and per character at the legend's font size 7 (so long reading names, such as
# `evaluate`'s `... halting=true halting_rule=q_head`, never squeeze the axes).
LEGEND_LINE, LEGEND_CHAR = 0.16, 0.052


def panels(settings: list[str], kind: str) -> list[list[str]]:
    """The settings split into panels of at most PER_PANEL[kind] (default MAX_LEGEND)."""
    per = PER_PANEL.get(kind, MAX_LEGEND)
    return [settings[i:i + per] for i in range(0, len(settings), per)] or [[]]


def draw(ctx: Context, kind: str, style: Style):
    """One figure of `kind`: a panel per group of settings, sharing the y axis; AnalysisError when it does not
    apply to this study."""
    drawn = ctx.checkpoints if kind == "checkpoints" and ctx.checkpoints is not None else ctx.trials
    settings = sorted(drawn["setting"].unique().to_list())
    groups = panels(settings, kind)
    cols = min(len(groups), 3)
    rows = math.ceil(len(groups) / cols)
    size = (PANEL[0] * cols + 0.4, PANEL[1] * rows)
    beside = PER_PANEL.get(kind) == ONE_PANEL  # every setting in one panel: the legend beside it
    if beside:
        labels = [*settings, "Pareto front"]
        size = (size[0] + 0.6 + LEGEND_CHAR * max(map(len, labels)), max(size[1], 0.5 + LEGEND_LINE * len(labels)))
    fig, axes = plt.subplots(rows, cols, figsize=size, sharey=True, layout="constrained", squeeze=False)
    try:
        for ax, group in zip(axes.flat, groups):
            kept = ctx.checkpoints.filter(pl.col("setting").is_in(group)) if ctx.checkpoints is not None else None
            sub = dataclasses.replace(ctx, trials=ctx.trials.filter(pl.col("setting").is_in(group)), checkpoints=kept)
            FIGURES[kind](sub, ax, style)
            ax.grid(alpha=0.3)
            entries = len(ax.get_legend_handles_labels()[0])
            if beside:
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
            elif entries > LEGEND_INSIDE:  # below the axes: inside, "best" still hides some line of a busy panel
                # two columns of long names (readings `evaluate` added) would run into the next panel's
                wide = max(map(len, ax.get_legend_handles_labels()[1])) > LEGEND_TWO_COLUMNS
                ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1 if wide else 2,
                          frameon=False)
            elif entries:
                ax.legend(fontsize=7, loc="best")
        for ax in list(axes.flat)[len(groups):]:
            ax.set_visible(False)
    except AnalysisError:
        plt.close(fig)
        raise
    return fig


def fingerprint(ctx: Context, kinds: list[str], style: Style) -> str:
    """What the figures are drawn from: the study's trials (each as of when it ended), the kinds, the options
    and the package version. The same fingerprint means the same figures."""
    import study

    trials = ctx.every_trial
    key = sorted(zip(trials["trial_id"].to_list(), map(str, trials["ended"].to_list())))
    text = json.dumps([key, kinds, style.paper, study.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Figures(list):
    """The files of the figures (a list of paths); redrawn: False when the data had not changed."""

    redrawn: bool = True


def plot(store: Store, study: str, kind: str, out: str | Path, skip_bad: bool = False,
         ctx: Context | None = None, include_stale: bool = False, paper: bool = False,
         only_changed: bool = False, settings: tuple[str, ...] | None = None) -> Figures:
    """Write figure `kind` (or 'all': each that applies to the study) as PNG and PDF into `out`; returns the
    files. paper: published markers may widen the axes. only_changed: redraw nothing when the study's trials are
    the same as when these figures were drawn. settings: draw these settings only (None: every one, the readings
    `loopstudy evaluate` added included)."""
    kinds = list(FIGURES) if kind == "all" else [kind]
    for k in kinds:
        if k not in FIGURES:
            raise AnalysisError(f"unknown figure {k!r}; figures: {', '.join(FIGURES)}, all")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AnalysisError(f"--figures {out} is a file; give a folder (it is created if missing)")
    ctx = ctx or load_context(store, study, skip_bad, include_stale)
    if settings is not None:
        ctx = only(ctx, settings)
    style = Style({s: f"C{i % 10}" for i, s in enumerate(sorted(ctx.trials["setting"].unique().to_list()))}, paper)
    stamp, mark = fingerprint(ctx, kinds, style), out / f".{study}.figures.json"
    if only_changed and mark.is_file():
        was = json.loads(mark.read_text())
        if was.get("fingerprint") == stamp and all(Path(f).is_file() for f in was.get("files", [])):
            kept = Figures(Path(f) for f in was["files"])
            kept.redrawn = False
            return kept
    out.mkdir(parents=True, exist_ok=True)
    written = Figures()
    for k in kinds:
        try:
            fig = draw(ctx, k, style)
        except AnalysisError:
            if kind != "all":
                raise
            continue  # 'all' draws what the study has
        for ext, meta in (("png", {"Software": None}), ("pdf", {"CreationDate": None, "ModDate": None})):
            path = out / f"{study}_{k}.{ext}"
            fig.savefig(path, metadata=meta)
            written.append(path)
        plt.close(fig)
    if kind == "all":  # figures that no longer apply must not linger beside the ones that do
        for k in set(FIGURES) - {p.stem[len(study) + 1:] for p in written}:
            for ext in ("png", "pdf"):
                (out / f"{study}_{k}.{ext}").unlink(missing_ok=True)
    mark.write_text(json.dumps({"fingerprint": stamp, "files": [str(p) for p in written]}))
    return written
