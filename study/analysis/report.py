"""`loopstudy report STUDY`: one self-contained HTML page from the stored Parquet alone.

The page reads like a paper's results section: a summary (what was swept, how many trials are complete / stopped /
stale, the headline table and the headline figure); every table that applies to the study, each comparing settings
in the papers' wide form (a column per setting, mean ± 95% CI) with its long form folded below (std, n, and the
papers' rows of the same task beside the measured ones); the comparisons paired by seed against the first setting
(when settings share two or more seeds); the accuracy-compute front (when readings carry FLOPs); every figure that
applies (full width, PNG inlined as data: URIs, so the file can be mailed or archived on its own; each links to its
PNG beside the report to open large); the spec the study was run with and each trial's config and summary. Columns
that say the same on every row are left out and long tables folded. Written beside the study's figures by default.
No scripts, no external resources.
"""

from __future__ import annotations

import base64
import html
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import yaml

from study.analysis.figures import plot
from study.analysis.formatting import _cell, informative_columns, settings_layout
from study.analysis.tables import TABLES, build_table, config_columns, load_context
from study.errors import AnalysisError
from study.metrics import METRICS
from study.store import Store
from study.store.layout import figures_dir, spec_file

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: 12px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; } th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; }
tr.paper td { color: #7a4b00; background: #fff8ea; }
figure { display: block; margin: 0 0 1.5em; } figure img { width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 12px; } .summary td:first-child { font-weight: 600; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 12px; }
nav a { margin-right: 1em; }
"""


FOLD_ROWS = 25  # a longer table is folded (<details>), its row count on the fold


def html_table(df: pl.DataFrame, table_id: str) -> str:
    """A DataFrame as an HTML table; rows whose `source` is 'paper' are marked (class="paper"). A column empty on
    every row, or (with two rows or more) the same on every row, is left out; a long table is folded."""
    cols = informative_columns(df)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for row in df.select(cols).iter_rows(named=True):
        cls = ' class="paper"' if row.get("source") == "paper" else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(_cell(row[c], c))}</td>" for c in cols) + "</tr>")
    table = f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    return table if df.height <= FOLD_ROWS else f"<details><summary>{df.height} rows</summary>{table}</details>"


def settings_table(df: pl.DataFrame, kind: str) -> str:
    """A table that compares settings, as the papers print one: a column per setting holding the headline's
    'mean ± 95% CI' over seeds (`table --wide`), with the long form (std, n, the papers' rows) folded below."""
    wide = settings_layout(df)
    if wide is None or df["setting"].n_unique() < 2:
        return html_table(df, f"table-{kind}")
    return (html_table(wide, f"wide-{kind}") + f"<details><summary>long form ({df.height} rows: std, n"
            f"{', the papers' if 'source' in df.columns and (df['source'] == 'paper').any() else ''})</summary>"
            + html_table(df, f"table-{kind}").replace("<details>", "<div>").replace("</details>", "</div>")
            + "</details>")


def summary_section(store: Store, study: str, ctx, headline: str) -> str:
    """What the study swept, how many of its trials are in which state, and its headline table."""
    counts = ctx.members.counts()
    swept = [(c, sorted(map(_cell, ctx.trials[c].unique().to_list()))) for c in ctx.axes] or [("(nothing)", [])]
    rows = [("swept", "; ".join(f"{c}: {', '.join(v)}" if v else c for c, v in swept)),
            ("trials", ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "none"),
            *([("evaluations", f"{len(ctx.members.evaluations)} readings of the trials' stored weights (loopstudy "
                f"evaluate), {0 if ctx.checkpoints is None else ctx.checkpoints.height} of them of weights kept "
                "along training (checkpoints table)")] if ctx.members.evaluations else []),
            ("settings", str(ctx.trials["setting"].n_unique())),
            ("seeds", str(ctx.trials["seed"].n_unique()) if "seed" in ctx.trials.columns else "1")]
    table = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary" id="summary-table"><tbody>{table}</tbody></table>{headline}'


def comparisons_section(ctx) -> str:
    """Each setting against the first (the spec's first variant, else the first by name), paired by seed: the
    headline accuracy at each trial's deepest reading and, for readings past 10x the training depth, retention."""
    from study.analysis.compare import Comparison, compare
    from study.analysis.tables import retention_per_trial

    settings = ctx.trials["setting"].unique().to_list()
    seeds = ctx.trials["seed"].n_unique() if "seed" in ctx.trials.columns else 1
    if len(settings) < 2 or seeds < 2:
        return ""
    spec = yaml.safe_load(ctx.store.get_text(spec_file(ctx.study)) or "{}") or {}
    variants = [str(v.get("name")) for v in (spec.get("sweep") or {}).get("variants") or [] if isinstance(v, dict)]
    baseline = next((v for v in variants if v in settings), sorted(settings)[0])
    metric = ctx.headline[0]
    parts = [f"<p>Baseline <code>{html.escape(baseline)}</code>; each row is a setting minus the baseline at the "
             f"same seed (95% CI: t over the pairs; p: paired t-test, Holm-corrected).</p>"]
    for title, cmp in ((f"{metric} at each trial's deepest reading", Comparison(baseline, metric)),
                       ("retention at 10x the training depth", Comparison(baseline, metric, retention=True))):
        if cmp.retention and not retention_per_trial(ctx).select(pl.col("at_10x").is_not_null().all()).collect().item():
            continue  # some trial has no reading at 10x its training depth
        try:
            parts.append(f"<h3>{html.escape(title)}</h3>" + html_table(compare(ctx, cmp), f"compare-{len(parts)}"))
        except AnalysisError:
            continue
    return "".join(parts) if len(parts) > 1 else ""


def pareto_section(ctx) -> str:
    """The readings no other beats on both accuracy and test-time FLOPs per sample (study.analysis.pareto)."""
    from study.analysis.pareto import pareto

    try:
        return html_table(pareto(ctx), "pareto")
    except AnalysisError:
        return ""


def figures_section(store: Store, study: str, ctx, folder: Path, skip_bad: bool) -> list[str]:
    """Every figure that applies, inlined full width; each opens large from the PNG written beside the report."""
    out = []
    for path in plot(store, study, "all", folder, skip_bad=skip_bad, ctx=ctx, only_changed=True):
        if path.suffix == ".png":
            data = base64.b64encode(path.read_bytes()).decode()
            kind = path.stem[len(study) + 1:]
            out.append(f'<figure id="figure-{kind}"><a href="{html.escape(path.name)}"><img alt="{kind}" '
                       f'src="data:image/png;base64,{data}"></a><figcaption>{kind} (click to open '
                       f"{html.escape(path.name)})</figcaption></figure>")
    return out


def report(store: Store, study: str, out: str | Path | None = None, skip_bad: bool = False,
           include_stale: bool = False) -> Path:
    """Write the study's report to `out` (default: beside the study's figures, `<store>/figures/<study>_report.html`;
    a folder: that file inside it); returns its path. Only the tables and figures that apply to the study."""
    ctx = load_context(store, study, skip_bad, include_stale)
    out = Path(out or Path(figures_dir(store.uri)) / f"{study}_report.html")
    if out.is_dir():  # a folder: the report goes inside it
        out = out / f"{study}_report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    sections: list[tuple[str, str, str]] = []  # (anchor, title, html)

    tables, headline = [], ""
    for kind in TABLES:
        try:
            df = build_table(store, study, kind, paper=True, skip_bad=skip_bad, ctx=ctx)
        except AnalysisError:
            continue  # this study has no data for that table, or does not sweep what it shows
        tables.append(f"<h3>{kind}</h3>" + settings_table(df, kind))
        if kind == "final":
            headline = "<h3>Headline: accuracy at the deepest reading</h3>" + html_table(
                df.filter(pl.col("source") == "measured"), "headline")
    figures = figures_section(store, study, ctx, out.parent, skip_bad)
    first = next((f for f in figures if 'id="figure-depth"' in f), figures[0] if figures else "")
    sections.append(("summary", "Summary", summary_section(store, study, ctx, headline)
                     + first.replace('id="figure-', 'id="headline-figure-')))
    sections.append(("tables", f"Tables ({len(tables)})", "".join(tables) or "<p>No table applies.</p>"))
    for anchor, title, part in (("compare", "Paired by seed", comparisons_section(ctx)),
                                ("pareto", "Accuracy against test-time compute", pareto_section(ctx))):
        if part:
            sections.append((anchor, title, part))
    sections.append(("figures", f"Figures ({len(figures)})", "".join(figures) or "<p>No figure applies.</p>"))

    spec = store.get_text(spec_file(study))
    sections.append(("spec", "Spec", f"<pre id='spec'>{html.escape(spec)}</pre>" if spec else
                     "<p>No saved spec (trials written by <code>loopstudy trial</code>).</p>"))

    trials = ctx.trials.sort("trial_id")
    summary = [c for c in (*METRICS, "wall_s", "device")  # (a metric no trial has, ARC's pass@2 elsewhere: left out)
               if c in trials.columns and trials[c].is_not_null().any()]
    overview = trials.select(["trial_id", "setting", *[c for c in ctx.axes if c != "label"], "seed", *summary])
    configs = "".join(
        f"<details><summary>{html.escape(r['trial_id'])}</summary>"
        + html_table(pl.DataFrame({"key": list(r), "value": [_cell(v) for v in r.values()]}), f"config-{r['trial_id']}")
        + "</details>" for r in trials.select(config_columns(trials)).with_columns(trials["trial_id"])
        .iter_rows(named=True))
    sections.append(("trials", f"Trials ({trials.height})", html_table(overview, "trials") + configs))

    nav = "".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t, _ in sections)
    body = "".join(f'<h2 id="{a}">{html.escape(t)}</h2>{h}' for a, t, h in sections)
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>loopstudy: {html.escape(study)}"
            f"</title><style>{STYLE}</style></head><body><h1>Study {html.escape(study)}</h1>"
            f"<p>{trials.height} complete trials in <code>{html.escape(store.uri)}</code>; made {made} from the "
            f"stored Parquet alone. Rows marked in amber are the papers' published numbers, shown only beside "
            f"measured rows of the same task.</p><nav>{nav}</nav>{body}</body></html>")
    out.write_text(page, encoding="utf-8")
    return out
