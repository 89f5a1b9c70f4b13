"""`loopstudy report`: one self-contained HTML page, checked by rendering it in headless Chromium (Debian's package,
installed by tests/browser.sh) and reading both the DOM and the screenshot."""

import shutil
import subprocess

import matplotlib.image as mpimg
import numpy as np
import pytest

from study.analysis.report import report

from .test_analysis import store  # noqa: F401 - the hand-made study (two rules x three seeds)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args, timeout=120):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--allow-file-access-from-files", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def page(store, tmp_path_factory):  # noqa: F811
    store.put_text("_studies/hand.yaml", "name: hand\nsweep: {grid: {model.carry.rule: [carry_last, infiloop]}}\n")
    # the hand-made trials are not what this spec resolves to (study.spec.membership calls them stale): include them
    return report(store, "hand", tmp_path_factory.mktemp("report") / "hand.html", include_stale=True)


def test_report_is_one_self_contained_file_with_tables_figures_spec_and_configs(page):
    text = page.read_text()
    for needle in ('id="table-depth"', 'id="table-stability"', 'id="figure-depth"', "data:image/png;base64,",
                   "model.carry.rule: [carry_last, infiloop]", 'id="trials"', 'id="config-car0"', 'class="paper"'):
        assert needle in text, needle
    assert "<script" not in text and "http://" not in text and "https://" not in text  # nothing fetched


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (tests/browser.sh installs Debian's package)")
def test_report_renders_in_headless_chromium_with_its_tables_and_figures(page, tmp_path):
    dom = chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert html.count("<table") >= 5 and html.count("<img") >= 3
    assert "Study hand" in html and "infiloop" in html
    shot = tmp_path / "shot.png"
    proc = chromium(f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1200)
    ink = (pixels.mean(-1) < 0.6).mean()  # share of dark pixels: text, table rules, plotted lines
    assert 0.005 < ink < 0.5, ink
    colours = np.unique((pixels.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert len(colours) > 50  # figures drew in colour, not a blank or error page


def test_report_of_a_small_study_shows_only_what_applies_and_goes_beside_its_figures(tmp_path):
    from study.store import Store

    from .test_figures import write_study

    small = Store(tmp_path / "r")
    write_study(small, "small", ["trm", "infiloop"])
    from datetime import UTC, datetime

    from study.config import TrialConfig, to_dict
    from study.store import config_row

    now = datetime(2026, 1, 1, tzinfo=UTC)
    for tid, label in (("t00", "trm"), ("t01", "infiloop")):  # 4x4 boards: not the papers' task
        small.write("trials", "small", tid, [{**config_row(to_dict(TrialConfig(label=label))), "status": "complete",
                                              "params": 1, "started": now, "ended": now, "wall_s": 1.0}])
    page = report(small, "small")
    assert page == tmp_path / "r" / "figures" / "small_report.html"  # beside the study's figures
    text = page.read_text()
    assert 'id="summary-table"' in text and 'id="headline"' in text and "2 complete" in text
    assert text.index('id="summary"') < text.index('id="tables"') < text.index('id="figures"')
    for absent in ('class="paper"', 'id="table-placement"', 'id="table-beta"', 'id="table-scaling"',
                   'id="table-halting"', 'id="table-optuna"', 'id="figure-eff_layers"', 'id="figure-gamma"',
                   "1e+04", "[paper"):
        assert absent not in text, absent
    assert "figure img { width: 100%" in text and 'href="small_depth.png"' in text
    assert (page.parent / "small_depth.png").exists()  # the link opens the full-size figure


def test_report_reads_like_a_results_section_wide_tables_no_constant_columns_headline_figure_first(page):
    text = page.read_text()
    summary = text[text.index('<h2 id="summary"'):text.index('<h2 id="tables"')]
    assert 'id="headline-figure-depth"' in summary  # the headline figure opens the page
    wide = text[text.index('id="wide-depth"'):]
    wide = wide[:wide.index("</table>")]
    assert "rule=carry_last" in wide and "rule=infiloop" in wide and " ± " in wide  # a column per setting
    assert "<th>source</th>" not in wide and "<th>n</th>" not in wide
    long_form = text[text.index('id="table-depth"'):]
    assert "<th>source</th>" in long_form[:long_form.index("</thead>")]  # measured and paper rows: it varies
    assert text.index('id="wide-depth"') < text.index('id="table-depth"')  # the long form folded below


def test_a_column_the_same_on_every_row_is_left_out_and_a_long_table_folded():
    import polars as pl

    from study.analysis.report import FOLD_ROWS, html_table

    df = pl.DataFrame({"setting": ["a", "b"], "source": ["measured", "measured"], "exact_acc": [0.5, 0.7]})
    assert "<th>source</th>" not in html_table(df, "t") and "<th>exact_acc</th>" in html_table(df, "t")
    long = pl.DataFrame({"depth_layers": list(range(FOLD_ROWS + 1)), "exact_acc": [0.5] * (FOLD_ROWS + 1)})
    assert html_table(long, "t").startswith(f"<details><summary>{FOLD_ROWS + 1} rows</summary>")
