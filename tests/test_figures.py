"""Figures read back: which ones a study gets, legends that stay readable at any number of settings, axes that
stop at the measured range, whole ticks for whole quantities, and no redrawing when nothing changed."""

from datetime import UTC, datetime

import matplotlib.pyplot as plt
import pytest

from study.analysis import figures, tables
from study.analysis.selection import only
from study.config import TrialConfig, to_dict
from study.store import Store, config_row


def write_study(store, study, settings, *, task="sudoku", difficulties=(8, 9), halting=False, depths=(12, 48)):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for i, label in enumerate(settings):
        cfg = to_dict(TrialConfig(label=label))
        cfg["task"]["name"] = task
        cfg["task"]["size"] = 9  # 9x9 sudoku is Sudoku-Extreme's task: the papers' markers may join
        halts = halting if isinstance(halting, bool) else label in halting  # all, none, or the settings named
        cfg["model"]["halting"]["enabled"] = halts
        tid = f"t{i:02d}"
        rows = []
        for d in depths:
            for diff in (None, *difficulties):
                rows.append({"depth_layers": d, "outer_cycles": d // 6, "difficulty": diff, "n": 10,
                             "exact_acc": 0.1 + 0.05 * i, "cell_acc": 0.9, "halted_frac": 0.5 * halts,
                             "eff_layers": d * (0.5 if halts else 1.0)})
        store.write("depth_eval", study, tid, rows)
        store.write("perturbation", study, tid, [{"eps": e, "update": 4, "updates_after": k, "n_solved": 5,
                                                  "solved_kept": 1.0 - e, "rel_distance": e}
                                                 for e in (0.0, 0.01, 0.1) for k in (1, 2, 3)])
        store.write("trials", study, tid, [{**config_row(cfg), "status": "complete", "params": 1,
                                            "started": now, "ended": now, "wall_s": 1.0, "device": "cpu"}])


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("many"))
    write_study(store, "many", [f"variant_{i}" for i in range(11)])
    return store


def legends(fig) -> list[int]:
    return [len(ax.get_legend().get_texts()) for ax in fig.axes if ax.get_visible() and ax.get_legend()]


@pytest.mark.parametrize("kind", ["depth", "difficulty", "perturbation"])
def test_no_legend_has_more_than_eight_entries_at_eleven_settings(many, kind):
    ctx = tables.load_context(many, "many")
    fig = figures.draw(ctx, kind, figures.Style(paper=True))
    try:
        counts = legends(fig)
        assert counts and max(counts) <= figures.MAX_LEGEND, counts
        drawn = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
        if kind != "perturbation":
            assert {f"variant_{i}" for i in range(11)} <= drawn  # every setting is drawn, in some panel
        else:
            assert len([ax for ax in fig.axes if ax.get_visible()]) == 11  # a panel per setting
    finally:
        plt.close(fig)


def test_paper_markers_stay_inside_the_measured_range_unless_asked(many):
    ctx = tables.load_context(many, "many")
    for paper, widest in ((False, 48), (True, 24_960)):
        fig = figures.draw(ctx, "depth", figures.Style(paper=paper))
        try:
            right = max(ax.get_xlim()[1] for ax in fig.axes if ax.get_visible())
            assert (right < 100) if not paper else (right >= widest), (paper, right)
        finally:
            plt.close(fig)


def test_whole_quantities_get_whole_ticks(many):
    ctx = tables.load_context(many, "many")
    fig = figures.draw(ctx, "difficulty", figures.Style())
    try:
        ticks = [t for ax in fig.axes if ax.get_visible() for t in ax.get_xticks()
                 if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    finally:
        plt.close(fig)


def test_each_study_gets_only_the_figures_it_has_data_for(tmp_path):
    store = Store(tmp_path / "r")
    write_study(store, "plain", ["a", "b"], difficulties=(8,))
    write_study(store, "halts", ["a", "b"], halting=True)
    plain = {p.stem for p in figures.plot(store, "plain", "all", tmp_path / "f")}
    halts = {p.stem for p in figures.plot(store, "halts", "all", tmp_path / "f")}
    assert "plain_eff_layers" not in plain and "plain_difficulty" not in plain and "plain_depth" in plain
    assert {"halts_eff_layers", "halts_difficulty"} <= halts
    assert "plain_gamma" not in plain  # no InfiLoop dynamics were stored


def test_effective_layers_are_drawn_for_the_settings_that_halt_only(tmp_path):
    store = Store(tmp_path / "r")
    write_study(store, "mixed", ["runs_all", "halts"], halting={"halts"}, depths=(48, 24960))
    fig = figures.draw(tables.load_context(store, "mixed"), "eff_layers", figures.Style())
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["halts"]
        assert ax.get_ylim()[1] < 24960  # the setting that runs every layer does not set the scale
    finally:
        plt.close(fig)


def test_deep_thinking_curves_only_beside_their_own_task(tmp_path):
    store = Store(tmp_path)
    write_study(store, "sud", ["a"], depths=(24, 96, 480))  # read far past the training depth
    write_study(store, "pre", ["a"], task="prefix_sums", difficulties=(), depths=(24, 96, 480))
    for study, expect in (("sud", False), ("pre", True)):
        fig = figures.draw(tables.load_context(store, study), "overthinking", figures.Style())
        try:
            labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
            assert any("[paper]" in label for label in labels) == expect, labels
        finally:
            plt.close(fig)


def test_unchanged_data_is_not_redrawn(tmp_path):
    store = Store(tmp_path / "r")
    write_study(store, "s", ["a", "b"])
    first = figures.plot(store, "s", "all", tmp_path / "f", only_changed=True)
    stamps = {p: p.stat().st_mtime_ns for p in first}
    again = figures.plot(store, "s", "all", tmp_path / "f", only_changed=True)
    assert again.redrawn is False and {p: p.stat().st_mtime_ns for p in again} == stamps
    write_study(store, "s", ["a", "b", "c"])  # a new trial: redrawn
    assert figures.plot(store, "s", "all", tmp_path / "f", only_changed=True).redrawn is True


def test_published_numbers_never_join_a_4x4_sudoku_study(tmp_path):
    store = Store(tmp_path)
    write_study(store, "small", ["a", "b"])
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for tid in ("t00", "t01"):  # the same trials on 4x4 boards
        cfg = to_dict(TrialConfig(label="a" if tid == "t00" else "b"))
        store.write("trials", "small", tid, [{**config_row(cfg), "status": "complete", "params": 1,
                                              "started": now, "ended": now, "wall_s": 1.0, "device": "cpu"}])
    df = tables.build_table(store, "small", "depth", paper=True)
    assert (df["source"] == "measured").all()
    fig = figures.draw(tables.load_context(store, "small"), "depth", figures.Style(paper=True))
    try:
        assert not [t for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()
                    if "[paper" in t.get_text()]
    finally:
        plt.close(fig)


def test_plot_settings_draws_those_settings_only_and_names_the_study_s_settings_for_an_unknown_one(many, tmp_path):
    ctx = only(tables.load_context(many, "many"), ("variant_1", "variant_3"))
    fig = figures.draw(ctx, "depth", figures.Style())
    try:
        drawn = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    finally:
        plt.close(fig)
    assert drawn == {"variant_1", "variant_3"}
    files = figures.plot(many, "many", "depth", tmp_path / "two", settings=("variant_1", "variant_3"))
    assert {f.suffix for f in files} == {".png", ".pdf"} and all(f.stat().st_size for f in files)
    one = figures.plot(many, "many", "depth", tmp_path / "one", settings=("variant_1",))
    png = {f.parent.name: f.read_bytes() for f in (*files, *one) if f.suffix == ".png"}
    assert png["one"] != png["two"]  # plot draws the settings it is given (its PNGs carry no time stamp)
    with pytest.raises(figures.AnalysisError, match="'nope'.*variant_0; variant_1"):
        figures.plot(many, "many", "depth", tmp_path, settings=("variant_1", "nope"))


def test_a_legend_of_long_reading_names_below_a_panel_takes_one_column(tmp_path):
    store = Store(tmp_path)
    names = [f"arch rule=r{i} depths=[12, 48, 192, 468, 1872] halting=true halting_rule=q_head" for i in range(6)]
    write_study(store, "long", names)
    fig = figures.draw(tables.load_context(store, "long"), "depth", figures.Style())
    try:
        below = [ax.get_legend() for ax in fig.axes if ax.get_legend() and len(ax.get_legend().get_texts()) > 4]
        fig.canvas.draw()  # one column: every entry's text starts at the same x
        assert below and all(len({round(t.get_window_extent().x0) for t in leg.get_texts()}) == 1 for leg in below)
    finally:
        plt.close(fig)
