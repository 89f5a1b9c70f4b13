"""Tasks: valid unique sudokus with exact blank counts, valid augmentation, shortest-path mazes, group products."""

import itertools

import numpy as np
import pytest

from study.config import TaskConfig
from study.tasks import IGNORE, accuracies, maze, state_tracking, sudoku
from study.tasks.loader import load_task


@pytest.mark.parametrize("size,blanks", [(4, (6, 12)), (6, (14, 24)), (9, (40, 54))])
def test_generated_sudokus_are_unique_with_exact_blank_counts(size, blanks):
    split = sudoku.generate(size, 12, blanks, seed=1)
    solver = sudoku.Solver(size)
    for inp, lab, diff in zip(split.inputs, split.labels, split.difficulty):
        puzzle = (inp - 1).tolist()
        assert puzzle.count(0) == diff and blanks[0] <= diff <= blanks[1]
        count, sol = solver.solve(puzzle, limit=2)
        assert count == 1
        assert sol == (lab - 1).tolist()
        assert sudoku.is_valid_solution(lab - 1, size)
        given = inp != 1
        assert (inp[given] == lab[given]).all()


@pytest.mark.parametrize("size", [4, 6, 9])
def test_augmentation_keeps_puzzles_valid_and_consistent(size):
    split = sudoku.generate(size, 6, (6, 8), seed=2)
    aug = sudoku.augment(split, size, np.random.default_rng(0))
    solver = sudoku.Solver(size)
    assert not (aug.inputs == split.inputs).all()
    for inp, lab in zip(aug.inputs, aug.labels):
        assert sudoku.is_valid_solution(lab - 1, size)
        count, sol = solver.solve((inp - 1).tolist(), limit=2)
        assert count == 1 and sol == (lab - 1).tolist()
    assert (aug.difficulty == split.difficulty).all()


def test_maze_labels_are_shortest_paths():
    split = maze.generate(11, 20, min_path=12, seed=3)
    for inp, lab, diff in zip(split.inputs, split.labels, split.difficulty):
        g, lg = inp.reshape(11, 11), lab.reshape(11, 11)
        s = tuple(np.argwhere(g == maze.START)[0])
        t = tuple(np.argwhere(g == maze.GOAL)[0])
        dist, _ = maze.bfs(g, s)
        path = {tuple(c) for c in np.argwhere(lg == maze.PATH)} | {s, t}
        assert len(path) == diff == dist[t] + 1 >= 12
        # the marked cells form a connected walk of open cells from s to t
        for cell in path:
            assert g[cell] != maze.WALL
        steps = [c for c in path if c not in (s, t)]
        for c in steps:
            nbrs = sum((c[0] + dr, c[1] + dc) in path for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)))
            assert nbrs == 2


@pytest.mark.parametrize("group,order", [("S5", 120), ("A5", 60)])
def test_state_tracking_labels_are_the_composed_permutations(group, order):
    elems = state_tracking.elements(group)
    assert len(elems) == order
    split = state_tracking.generate(group, 9, 5, seed=4)
    for word, lab in zip(split.inputs, split.labels):
        p = tuple(range(5))
        for t, g in enumerate(word):
            p = state_tracking.compose(elems[g - 1], p)
            assert elems[lab[t] - 1] == p
    if group == "A5":
        assert all(state_tracking.parity(elems[i - 1]) == 0 for i in split.labels.reshape(-1))


def test_accuracy_counts_only_scored_cells():
    labels = np.array([[2, 3, IGNORE], [2, 3, 4]])
    pred = np.array([[2, 3, 9], [2, 9, 4]])
    exact, cell = accuracies(pred, labels)
    assert exact.tolist() == [True, False]
    assert cell.tolist() == [1.0, pytest.approx(2 / 3)]


def test_generation_is_deterministic_and_cached(tmp_path):
    cfg = TaskConfig(name="sudoku", size=4, blanks=(6, 8), n_train=20, n_test=5, cache_dir=str(tmp_path))
    a = load_task(cfg)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and not any(f.startswith(".") for f in files)
    b = load_task(cfg)
    assert (a.train.inputs == b.train.inputs).all() and (a.test.labels == b.test.labels).all()
    # train and test do not share puzzles
    assert not {r.tobytes() for r in a.train.inputs} & {r.tobytes() for r in a.test.inputs}


def test_half_written_cache_file_is_never_read(tmp_path):
    cfg = TaskConfig(name="sudoku", size=4, blanks=(6, 8), n_train=20, n_test=5, cache_dir=str(tmp_path))
    good = load_task(cfg)
    for f in tmp_path.iterdir():
        f.write_bytes(f.read_bytes()[:40])  # truncated in place: unreadable, so it is regenerated
    again = load_task(cfg)
    assert (again.train.inputs == good.train.inputs).all()


@pytest.mark.parametrize(
    "kw,match",
    [({"name": "chess"}, "name"), ({"size": 5}, r"size=5.*\[4, 6, 9\]"), ({"blanks": (8, 70), "size": 9},
                                                                          r"blanks=70.*0..58"),
     ({"name": "maze", "size": 9, "min_path": 1000}, r"min_path=1000.*2..40"), ({"blanks": (9, 8)}, "min")],
)
def test_bad_task_config_is_refused_up_front(kw, match):
    with pytest.raises(ValueError, match=match):
        TaskConfig(**kw)


def write_csv(path, rows):
    path.write_text("source,q,a,rating\n" + "\n".join(rows) + "\n")


def test_sudoku_extreme_csv_loads(tmp_path):
    split = sudoku.generate(9, 3, (50, 52), seed=5)
    rows = []
    for inp, lab in zip(split.inputs, split.labels):
        q = "".join("." if v == 1 else str(v - 1) for v in inp)
        a = "".join(str(v - 1) for v in lab)
        rows.append(f"gen,{q},{a},0")
    path = tmp_path / "test.csv"
    write_csv(path, rows)
    loaded = sudoku.load_csv(path)
    assert (loaded.inputs == split.inputs).all() and (loaded.labels == split.labels).all()
    assert (loaded.difficulty == split.difficulty).all()


@pytest.mark.parametrize(
    "q_edit,a_edit,match",
    [(lambda q: q[:-1], lambda a: a, "test.csv:3: q has 80 characters"),
     (lambda q: "x" + q[1:], lambda a: a, r"test.csv:3: q has bad characters \['x'\]"),
     (lambda q: q, lambda a: a[:5] + "0" + a[6:], "test.csv:3: a has bad characters"),
     (lambda q: q, None, "test.csv:3: q and a disagree")],
)
def test_malformed_csv_rows_name_file_and_line(tmp_path, q_edit, a_edit, match):
    split = sudoku.generate(9, 2, (50, 50), seed=6)
    rows = []
    for i, (inp, lab) in enumerate(zip(split.inputs, split.labels)):
        q = "".join("." if v == 1 else str(v - 1) for v in inp)
        a = "".join(str(v - 1) for v in lab)
        if i == 1:
            if a_edit is None:  # change a given digit in the answer
                g = next(j for j, ch in enumerate(q) if ch != ".")
                a = a[:g] + str(int(a[g]) % 9 + 1) + a[g + 1:]
            else:
                q, a = q_edit(q), a_edit(a)
        rows.append(f"gen,{q},{a},0")
    path = tmp_path / "test.csv"
    write_csv(path, rows)
    with pytest.raises(ValueError, match=match):
        sudoku.load_csv(path)


def test_sudoku_generator_bench_size_is_reachable():
    # 54 blanks on 9x9 (the benchmark's setting) is within the generator's allowed range
    sudoku.check_blanks(9, 54)
    assert list(itertools.islice(sudoku.BOXES, 3)) == [4, 6, 9]


def test_tasks_register_themselves_and_the_config_takes_exactly_those_names():
    import typing

    from study.config import TaskName
    from study.tasks import FOUND, TASKS

    own = {n for n, p in FOUND.origin.items() if p.builtin}  # (installed plugins, the example's, come on top)
    assert own == {"sudoku", "maze", "state_tracking", "prefix_sums", "arc"}
    assert set(typing.get_args(TaskName)) == set(TASKS)
    for name, task in TASKS.items():
        cfg = TaskConfig(name=name, size=5 if name == "maze" else 4, min_path=4, n_train=4, n_test=2, length=4,
                         blanks=(6, 8))
        split = task.generate(cfg, "train", 3, 0)
        assert split.inputs.shape[1] == task.spec(cfg).seq_len
        # ARC's n counts puzzles (task.n_train), each giving its pairs; the generators' n counts samples
        assert len(split) >= 3 if name == "arc" else len(split) == 3
