"""Tables, figures, SQL and the analysis CLI on a hand-made dataset (no training, no Ray)."""

import math
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from study.analysis import figures, formatting, published, query, tables
from study.config import TrialConfig, to_dict
from study.store import Store, config_row

from .conftest import REPO

# two rules x three seeds; exact accuracy at two depths
ACC = {("carry_last", 0): (0.5, 0.4), ("carry_last", 1): (0.6, 0.5), ("carry_last", 2): (0.7, 0.6),
       ("infiloop", 0): (0.6, 0.8), ("infiloop", 1): (0.7, 0.9), ("infiloop", 2): (0.8, 0.7)}
DEPTHS = (12, 48)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    s = Store(root)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for (rule, seed), accs in ACC.items():
        cfg = to_dict(TrialConfig(seed=seed))
        cfg["model"]["carry"]["rule"] = rule
        cfg["task"]["size"] = 9  # 9x9 sudoku: the papers' Sudoku-Extreme rows join its tables
        tid = f"{rule[:3]}{seed}"
        rows = []
        for d, a in zip(DEPTHS, accs):
            rows.append({"depth_layers": d, "outer_cycles": d // 6, "difficulty": None, "n": 100, "exact_acc": a,
                         "cell_acc": 0.9, "halted_frac": 0.0, "eff_layers": float(d)})
            rows.append({"depth_layers": d, "outer_cycles": d // 6, "difficulty": 8, "n": 50, "exact_acc": a / 2,
                         "cell_acc": 0.8, "halted_frac": 0.0, "eff_layers": float(d)})
        s.write("depth_eval", "hand", tid, rows)
        s.write("dynamics", "hand", tid, [
            {"kind": "stability", "axis": "outer", "update": 8, "from_update": 4, "changed": seed + 1.0,
             "wrong_delta": -1.0, "flipped": 0.1, "lost": 0.0, "n": 100},
            *[{"kind": "aligned", "axis": "outer", "offset": o, "gamma_mean": 0.5 + 0.1 * (o == 0), "n": 10}
              for o in (-1, 0, 1)],
            {"kind": "score_vs_wrong", "axis": "outer", "wrong_cells": 0.0, "score_median": 7.0, "n": 5}])
        s.write("perturbation", "hand", tid, [{"eps": 1e-3, "update": 4, "updates_after": k, "n_solved": 5,
                                               "solved_kept": 1.0, "rel_distance": 0.01 * k} for k in (1, 2)])
        s.write("trials", "hand", tid, [{**config_row(cfg), "status": "complete", "params": 1, "started": now,
                                         "ended": now, "wall_s": 1.0, "device": "cpu"}])
    return s


def mean_ci(xs):
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return m, sd, 4.302653 * sd / math.sqrt(len(xs))  # t(0.975, df=2)


def test_depth_table_equals_hand_computed_means_and_cis(store):
    df = tables.build_table(store, "hand", "depth")
    assert set(df["setting"]) == {"rule=carry_last", "rule=infiloop"}
    for rule, (i, d) in ((r, x) for r in ("carry_last", "infiloop") for x in enumerate(DEPTHS)):
        xs = [ACC[(rule, s)][i] for s in range(3)]
        m, sd, ci = mean_ci(xs)
        row = df.filter((df["setting"] == f"rule={rule}") & (df["depth_layers"] == d)).row(0, named=True)
        assert row["exact_acc_mean"] == pytest.approx(m)
        assert row["exact_acc_std"] == pytest.approx(sd)
        assert row["exact_acc_ci95"] == pytest.approx(ci)
        assert row["n"] == 3


def test_the_ci_uses_students_t_at_every_sample_size():
    # beyond 30 degrees of freedom too: at n = 32 the normal 1.96 would be 4% too narrow
    assert tables.t975(3) == pytest.approx(4.302653, abs=1e-6)
    assert tables.t975(32) == pytest.approx(2.039513, abs=1e-6)
    assert tables.t975(1000) > 1.96


def test_difficulty_stability_and_final_tables(store):
    diff = tables.build_table(store, "hand", "difficulty")
    row = diff.filter(diff["setting"] == "rule=infiloop").row(0, named=True)
    assert row["difficulty"] == 8 and row["exact_acc_mean"] == pytest.approx((0.8 + 0.9 + 0.7) / 6)
    stab = tables.build_table(store, "hand", "stability")
    assert stab.filter(stab["setting"] == "rule=carry_last")["changed_mean"].item() == pytest.approx(2.0)
    final = tables.build_table(store, "hand", "final")
    assert final["depth_layers"].unique().to_list() == [48]


def test_paper_rows_are_added_and_labelled(store):
    df = tables.build_table(store, "hand", "depth", paper=True)
    paper = df.filter(df["source"] == "paper")
    row = paper.filter((paper["setting"] == "InfiLoop [paper]") & (paper["depth_layers"] == 24960)).row(0, named=True)
    assert row["exact_acc_mean"] == pytest.approx(0.927)
    assert (df.filter(df["source"] == "measured")["n"] == 3).all()


@pytest.mark.parametrize("fmt,marker", [("markdown", "| setting |"), ("csv", "setting,depth_layers"),
                                        ("latex", r"\begin{tabular}"), ("terminal", "setting")])
def test_table_formats(store, fmt, marker):
    text = formatting.format_table(tables.build_table(store, "hand", "depth"), fmt)
    assert marker in text and "carry" in text and "infiloop" in text


def test_figures_are_nonempty_png_and_pdf_and_depth_lines_carry_table_numbers(store, tmp_path):
    files = figures.plot(store, "hand", "all", tmp_path)
    names = {f.name for f in files}
    assert {"hand_depth.png", "hand_depth.pdf", "hand_gamma.png", "hand_perturbation.pdf"} <= names
    for f in files:
        assert f.stat().st_size > 1000
        assert f.read_bytes()[:4] in (b"\x89PNG", b"%PDF")
    # the depth figure's lines carry the table's means
    import matplotlib.pyplot as plt

    ctx = tables.load_context(store, "hand")
    fig, ax = plt.subplots()
    figures.fig_depth(ctx, ax)
    lines = {ln.get_label(): ln.get_ydata() for ln in ax.get_lines()}
    table = tables.build_table(store, "hand", "depth")
    for setting in ("rule=carry_last", "rule=infiloop"):
        want = table.filter(table["setting"] == setting).sort("depth_layers")["exact_acc_mean"].to_list()
        assert list(lines[setting]) == pytest.approx(want)
    plt.close(fig)


def test_pdf_output_is_deterministic(store, tmp_path):
    a = figures.plot(store, "hand", "depth", tmp_path / "a")
    b = figures.plot(store, "hand", "depth", tmp_path / "b")
    for x, y in zip(a, b):
        assert x.read_bytes() == y.read_bytes(), x.name


def test_query_answers_sql_over_the_tables(store):
    df = query.sql(store, 'SELECT t."model.carry.rule" AS rule, avg(d.exact_acc) AS acc FROM depth_eval d '
                           'JOIN trials t ON d.trial_id = t.trial_id WHERE d.difficulty IS NULL AND '
                           'd.depth_layers = 48 GROUP BY rule ORDER BY rule')
    assert df["rule"].to_list() == ["carry_last", "infiloop"]
    assert df["acc"].to_list() == pytest.approx([0.5, 0.8])


def cli(*args):
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_analysis_commands_import_neither_torch_nor_ray(store, tmp_path):
    code = ("import sys, runpy; sys.argv = ['loopstudy'] + sys.argv[1:]\n"
            "from study.cli import main\n"
            "rc = main(sys.argv[1:])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray'))\n"
            "print('HEAVY', heavy); sys.exit(rc)")
    for args in (["table", "depth", "--study", "hand", "--store", store.uri],
                 ["plot", "depth", "--study", "hand", "--store", store.uri, "--out", str(tmp_path)],
                 ["query", "SELECT count(*) AS n FROM trials", "--store", store.uri],
                 ["ls", "--store", store.uri]):
        proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "HEAVY []" in proc.stdout, (args, proc.stdout[-300:])


def test_bad_input_says_what_exists(store, tmp_path):
    proc = cli("table", "depth", "--study", "nope", "--store", store.uri)
    assert proc.returncode == 2 and "no study 'nope'" in proc.stderr and "hand" in proc.stderr
    proc = cli("table", "wat", "--study", "hand", "--store", store.uri)
    assert proc.returncode == 2 and "unknown table 'wat'; tables: depth" in proc.stderr
    proc = cli("plot", "wat", "--study", "hand", "--store", store.uri, "--out", str(tmp_path))
    assert proc.returncode == 2 and "unknown figure 'wat'; figures: depth" in proc.stderr
    empty = Store(tmp_path / "empty")
    empty.write("depth_eval", "e", "t", [{"depth_layers": 1}])
    proc = cli("table", "depth", "--study", "e", "--store", empty.uri)
    assert proc.returncode == 2 and "no completed trials" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("ls", "--store", store.uri)
    assert proc.returncode == 0 and "hand" in proc.stdout


def test_published_numbers_ship_with_their_sources():
    pub = published.published()
    assert pub.filter((pub["table"] == "depth") & (pub["method"] == "InfiLoop") & (pub["x"] == "24960"))[
        "value"].item() == 92.7
    assert pub["source"].null_count() == 0
    # every table kind that takes --paper finds published rows
    assert {"depth", "placement", "beta", "scaling", "halting", "stability", "perturbation"} <= set(pub["table"])


def test_a_study_with_one_named_variant_so_far_is_labelled_by_it(tmp_path):
    s = Store(tmp_path)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for seed in (0, 1):
        cfg = {**to_dict(TrialConfig(seed=seed)), "label": "trm_carry_last"}
        s.write("depth_eval", "partial", f"t{seed}", [{"depth_layers": 12, "outer_cycles": 2, "difficulty": None,
                                                       "n": 10, "exact_acc": 0.5, "cell_acc": 0.9,
                                                       "halted_frac": 0.0, "eff_layers": 12.0}])
        s.write("trials", "partial", f"t{seed}", [{**config_row(cfg), "status": "complete", "params": 1,
                                                   "started": now, "ended": now, "wall_s": 1.0, "device": "cpu"}])
    assert tables.build_table(s, "partial", "depth")["setting"].to_list() == ["trm_carry_last"]


def test_wide_table_has_a_column_per_setting_with_mean_and_ci(store):
    wide = formatting.widen(tables.build_table(store, "hand", "depth", paper=True))
    assert wide.columns[:3] == ["depth_layers", "rule=carry_last", "rule=infiloop"]
    assert "InfiLoop [paper]" in wide.columns
    m, _, ci = mean_ci([ACC[("infiloop", s)][1] for s in range(3)])
    assert wide.filter(depth_layers=48)["rule=infiloop"].item() == f"{m:.3f} ± {ci:.3f}"
    assert wide.filter(depth_layers=24960)["InfiLoop [paper]"].item() == "0.927"  # a published number: no CI
    with pytest.raises(tables.AnalysisError, match="metrics: cell_acc, exact_acc"):
        formatting.widen(tables.build_table(store, "hand", "depth"), "accuracy")


def test_one_vocabulary_across_commands_with_the_old_spellings_as_aliases():
    from study.cli import build_parser

    p = build_parser()
    for argv in (["run", "s.yaml", "--store", "R"], ["run", "s.yaml", "--storage", "R"], ["submit", "s.yaml",
                 "--address", "http://x", "--store", "R"], ["status", "x", "--store", "R"],
                 ["status", "--study", "x", "--storage", "R"], ["resume", "x", "--store", "R"],
                 ["table", "depth", "--study", "x", "--store", "R"], ["plot", "all", "--study", "x", "--store", "R"],
                 ["query", "SELECT 1", "--store", "R"], ["compact", "--study", "x", "--store", "R"],
                 ["ls", "--store", "R"], ["trial", "c.yaml", "--store", "R"]):
        assert p.parse_args(argv).store == "R", argv
    for argv in (["plot", "all", "--study", "x", "--figures", "F"], ["plot", "all", "--study", "x", "--out", "F"],
                 ["run", "s.yaml", "--figures", "F"]):
        assert p.parse_args(argv).figures == "F", argv


def test_python_api_gives_lazy_frames_with_config_tables_and_figures_without_torch_or_ray(store, tmp_path):
    code = f"""
import sys
import polars as pl
from study.analysis.results import open_results
res = open_results({store.uri!r})
depth = res.frame("depth_eval", "hand")
assert isinstance(depth, pl.LazyFrame)
got = (depth.filter(pl.col("difficulty").is_null() & (pl.col("depth_layers") == 48))
       .group_by("model.carry.rule").agg(pl.mean("exact_acc")).sort("model.carry.rule").collect())
assert got["exact_acc"].round(6).to_list() == [0.5, 0.8], got
assert res.table("depth", "hand").height == 4
assert res.studies()["study"].to_list() == ["hand"]
assert len(res.figures("hand", "depth", {str(tmp_path)!r})) == 2
assert res.sql("SELECT count(*) AS n FROM trials")["n"][0] == 6
assert "torch" not in sys.modules and "ray" not in sys.modules
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.fixture(scope="module")
def overthinking_store(tmp_path_factory):
    """Two variants x 3 seeds, trained at 16 layers (H 8, L 1, 1 layer, n_sup 1), read at 1x, 2x and 10x."""
    s = Store(tmp_path_factory.mktemp("over"))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    curves = {"forgets": [(0.8, 0.6, 0.2), (0.9, 0.5, 0.3), (0.7, 0.7, 0.1)],
              "recalls": [(0.8, 0.9, 0.9), (0.9, 0.9, 0.9), (0.7, 0.8, 0.8)]}
    for label, seeds in curves.items():
        for seed, accs in enumerate(seeds):
            cfg = to_dict(TrialConfig(seed=seed, label=label))
            cfg["model"].update(H=8, L=1, n_layers=1, grad_steps=8)
            cfg["train"]["n_sup"] = 1
            cfg["task"]["name"] = "prefix_sums"  # Deep Thinking's published curves join their own task only
            tid = f"{label}{seed}"
            s.write("depth_eval", "over", tid, [
                {"depth_layers": d, "outer_cycles": d // 2, "difficulty": None, "n": 10, "exact_acc": a,
                 "cell_acc": a, "halted_frac": 0.0, "eff_layers": float(d)} for d, a in zip((16, 32, 160), accs)])
            s.write("trials", "over", tid, [{**config_row(cfg), "status": "complete", "params": 1, "started": now,
                                             "ended": now, "wall_s": 1.0, "device": "cpu"}])
    return s, curves


def test_overthinking_table_reads_depth_as_a_multiple_of_training_depth(overthinking_store):
    store, _ = overthinking_store
    df = tables.build_table(store, "over", "overthinking", paper=True)
    measured = df.filter(df["source"] == "measured")
    assert sorted(set(measured["depth_x"])) == [1.0, 2.0, 10.0]
    row = measured.filter((measured["setting"] == "forgets") & (measured["depth_x"] == 10.0)).row(0, named=True)
    assert row["exact_acc_mean"] == pytest.approx(0.2) and row["n"] == 3
    # Deep Thinking's published curve: 8.0% at 100 of its 30 training iterations
    paper = df.filter(df["setting"] == "DT prefix sums, no recall: 32-bit training set [paper]")
    assert paper.filter(paper["depth_x"] == round(100 / 30, 3))["exact_acc_mean"].item() == pytest.approx(0.08)


def test_retention_is_computed_per_seed_then_aggregated(overthinking_store):
    store, curves = overthinking_store
    df = tables.build_table(store, "over", "retention")
    for label, seeds in curves.items():
        row = df.filter(df["setting"] == label).row(0, named=True)
        retained = [a[2] / max(a) for a in seeds]
        m, sd, ci = mean_ci(retained)
        assert row["retained_10x_mean"] == pytest.approx(m) and row["retained_10x_ci95"] == pytest.approx(ci)
        assert row["peak_mean"] == pytest.approx(sum(max(a) for a in seeds) / 3)
        assert row["deepest_x"] == 10.0
    assert df.filter(df["setting"] == "forgets")["retained_10x_mean"].item() < 0.5  # loses over half its peak


def test_overthinking_figure_is_drawn_from_the_store(overthinking_store, tmp_path):
    store, _ = overthinking_store
    written = figures.plot(store, "over", "overthinking", tmp_path)
    assert {p.suffix for p in written} == {".png", ".pdf"} and all(p.stat().st_size > 1000 for p in written)


def test_float_settings_are_named_in_the_fewest_digits_that_keep_them_apart_and_at_least_three():
    import polars as pl

    from study.analysis.tables import with_setting

    df = pl.DataFrame({"train.lr": [0.0010426094533788973, 0.0010429912, 0.0031, 0.0031, None],
                       "model.L": [1, 2, 3, 3, 4]})
    assert with_setting(df, ["train.lr", "model.L"])["setting"].to_list() == [
        "lr=0.0010426 L=1", "lr=0.001043 L=2", "lr=0.0031 L=3", "lr=0.0031 L=3", "lr=- L=4"]
    one = pl.DataFrame({"train.lr": [0.0010426094533788973, 0.5]})
    assert with_setting(one, ["train.lr"])["setting"].to_list() == ["lr=0.00104", "lr=0.5"]
    assert one["train.lr"][0] == 0.0010426094533788973  # the value itself stays whole
