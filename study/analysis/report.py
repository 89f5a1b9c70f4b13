"""`loopstudy report STUDY`: one self-contained HTML page from the stored Parquet alone.

The page holds every table the study supports (with the papers' rows beside the measured ones), every figure it
supports (PNG inlined as data: URIs, so the file can be mailed or archived on its own), the spec the study was run
with and each trial's config and summary. No scripts, no external resources. Torch-free and Ray-free.
"""

from __future__ import annotations

import base64
import html
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from study.analysis.figures import plot
from study.analysis.tables import TABLES, AnalysisError, _cell, build_table, config_columns, load_context
from study.metrics import METRICS
from study.store import Store
from study.store.layout import spec_file

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: 12px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; } th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; }
tr.paper td { color: #7a4b00; background: #fff8ea; }
figure { display: inline-block; margin: 0 1em 1em 0; } figure img { width: 520px; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 12px; }
nav a { margin-right: 1em; }
"""


def html_table(df: pl.DataFrame, table_id: str) -> str:
    """A DataFrame as an HTML table; rows whose `source` is 'paper' are marked (class="paper")."""
    cols = [c for c in df.columns if df[c].null_count() != df.height]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for row in df.select(cols).iter_rows(named=True):
        cls = ' class="paper"' if row.get("source") == "paper" else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(_cell(row[c]))}</td>" for c in cols) + "</tr>")
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def report(store: Store, study: str, out: str | Path | None = None, skip_bad: bool = False,
           include_stale: bool = False) -> Path:
    """Write the study's report to `out` (default `<study>_report.html`; a folder: that file inside it); returns
    its path."""
    ctx = load_context(store, study, skip_bad, include_stale)
    out = Path(out or f"{study}_report.html")
    if out.is_dir():  # a folder: the report goes inside it
        out = out / f"{study}_report.html"
    sections: list[tuple[str, str, str]] = []  # (anchor, title, html)

    tables = []
    for kind in TABLES:
        try:
            df = build_table(store, study, kind, paper=True, skip_bad=skip_bad, ctx=ctx)
        except AnalysisError:
            continue  # this study has no data for that table
        tables.append(f"<h3>{kind}</h3>" + html_table(df, f"table-{kind}"))
    sections.append(("tables", f"Tables ({len(tables)})", "".join(tables) or "<p>No table applies.</p>"))

    figures = []
    with tempfile.TemporaryDirectory() as d:
        for path in plot(store, study, "all", d, skip_bad=skip_bad, ctx=ctx):
            if path.suffix == ".png":
                data = base64.b64encode(path.read_bytes()).decode()
                kind = path.stem[len(study) + 1:]
                figures.append(f'<figure id="figure-{kind}"><img alt="{kind}" src="data:image/png;base64,{data}">'
                               f"<figcaption>{kind}</figcaption></figure>")
    sections.append(("figures", f"Figures ({len(figures)})", "".join(figures) or "<p>No figure applies.</p>"))

    spec = store.get_text(spec_file(study))
    sections.append(("spec", "Spec", f"<pre id='spec'>{html.escape(spec)}</pre>" if spec else
                     "<p>No saved spec (trials written by <code>loopstudy trial</code>).</p>"))

    trials = ctx.trials.sort("trial_id")
    summary = [c for c in (*METRICS, "wall_s", "device")
               if c in trials.columns]
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
            f"stored Parquet alone. Rows marked in amber are the papers' published numbers.</p>"
            f"<nav>{nav}</nav>{body}</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out

