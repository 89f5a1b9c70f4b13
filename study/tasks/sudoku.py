"""Sudoku n^2 x n^2 boards (4x4 with 2x2 boxes, 6x6 with 2x3 boxes, 9x9 with 3x3 boxes).

Tokens: 0 PAD, 1 blank, 2..n+1 digits 1..n (vocab n + 2; 11 for 9x9 as in the papers).
Generation: a random full grid from a randomised solver, then cells are blanked in random order, each removal kept
only if the puzzle stays uniquely solvable (checked by asking the solver for a solution that differs at that cell).
Difficulty = number of blanks, exact by construction.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from study.errors import DataError
from study.tasks.base import Split, TaskDef, TaskSpec

BOXES = {4: (2, 2), 6: (2, 3), 9: (3, 3)}
# Blank counts the greedy remover reaches reliably. Above these it would search for a very long time
# (9x9 puzzles with 64 blanks exist but are found by luck, not by removal order), so we refuse up front.
MAX_BLANKS = {4: 12, 6: 24, 9: 58}


def sudoku_spec(size: int) -> TaskSpec:
    return TaskSpec("sudoku", size + 2, size * size, (size, size), "blanks")


class Solver:
    """Bitmask DFS with the fewest-candidates heuristic over an n x n board (0 = empty)."""

    def __init__(self, size: int):
        if size not in BOXES:
            raise ValueError(f"task.size={size} is not allowed for sudoku; use one of {sorted(BOXES)}")
        self.n = size
        br, bc = BOXES[size]
        self.full = (1 << size) - 1
        self.row = [i // size for i in range(size * size)]
        self.col = [i % size for i in range(size * size)]
        self.box = [(r // br) * (size // bc) + (c // bc) for r, c in zip(self.row, self.col)]

    def masks(self, grid: list[int]) -> tuple[list[int], list[int], list[int], list[int]] | None:
        """Bit masks of the digits used per row, column and box, and the empty cells; None when a digit repeats."""
        rows, cols, boxes = [0] * self.n, [0] * self.n, [0] * self.n
        empties = []
        for i, v in enumerate(grid):
            if v:
                bit = 1 << (v - 1)
                r, c, b = self.row[i], self.col[i], self.box[i]
                if (rows[r] | cols[c] | boxes[b]) & bit:
                    return None
                rows[r] |= bit
                cols[c] |= bit
                boxes[b] |= bit
            else:
                empties.append(i)
        return rows, cols, boxes, empties

    def solve(self, grid: list[int], limit: int = 1, rng: np.random.Generator | None = None,
              forbid: tuple[int, int] | None = None) -> tuple[int, list[int] | None]:
        """Count solutions up to `limit`; return (count, first solution). `forbid=(cell, v)`: cell may not be v.

        `rng` randomises the digit order (used to draw random full grids).
        """
        n, full = self.n, self.full
        grid = list(grid)
        masks = self.masks(grid)
        if masks is None:
            return 0, None
        rows, cols, boxes, empties = masks
        ban = [0] * (n * n)
        if forbid is not None:
            ban[forbid[0]] = 1 << (forbid[1] - 1)
        R, C, Bx = self.row, self.col, self.box
        found: list[list[int]] = []
        count = 0

        def search(k: int) -> None:
            nonlocal count
            if k == len(empties):
                count += 1
                if not found:
                    found.append(list(grid))
                return
            best_j, best_m, best_cnt = k, 0, n + 1
            for j in range(k, len(empties)):
                i = empties[j]
                m = full & ~(rows[R[i]] | cols[C[i]] | boxes[Bx[i]] | ban[i])
                cnt = m.bit_count()
                if cnt < best_cnt:
                    best_j, best_m, best_cnt = j, m, cnt
                    if cnt <= 1:
                        break
            if best_cnt == 0:
                return
            empties[k], empties[best_j] = empties[best_j], empties[k]
            i = empties[k]
            r, c, b = R[i], C[i], Bx[i]
            digits = [d for d in range(n) if best_m >> d & 1]
            if rng is not None:
                rng.shuffle(digits)
            for d in digits:
                bit = 1 << d
                rows[r] |= bit
                cols[c] |= bit
                boxes[b] |= bit
                grid[i] = d + 1
                search(k + 1)
                rows[r] &= ~bit
                cols[c] &= ~bit
                boxes[b] &= ~bit
                grid[i] = 0
                if count >= limit:
                    break
            empties[k], empties[best_j] = empties[best_j], empties[k]

        search(0)
        return count, (found[0] if found else None)


def check_blanks(size: int, blanks: int) -> None:
    if size not in BOXES:
        raise ValueError(f"task.size={size} is not allowed for sudoku; use one of {sorted(BOXES)}")
    if not 0 <= blanks <= MAX_BLANKS[size]:
        raise ValueError(
            f"task.blanks={blanks} cannot be reached for {size}x{size} sudoku; allowed: 0..{MAX_BLANKS[size]} "
            "(more blanks would need an exhaustive search for rare minimal puzzles)"
        )


def generate_puzzle(solver: Solver, blanks: int, rng: np.random.Generator,
                    attempts: int = 200) -> tuple[list[int], list[int]]:
    """One (puzzle, solution) with exactly `blanks` empty cells and a unique solution."""
    n2 = solver.n * solver.n
    for _ in range(attempts):
        _, solution = solver.solve([0] * n2, rng=rng)
        puzzle = list(solution)
        removed = 0
        for cell in rng.permutation(n2).tolist():
            if removed == blanks:
                break
            v = puzzle[cell]
            puzzle[cell] = 0
            # Unique iff no solution puts another digit in this cell (the rest of the board being as it is).
            if solver.solve(puzzle, forbid=(cell, v))[0]:
                puzzle[cell] = v
            else:
                removed += 1
        if removed == blanks:
            return puzzle, solution
    raise RuntimeError(f"could not reach {blanks} blanks on {solver.n}x{solver.n} in {attempts} attempts")


def encode(puzzle: list[int] | np.ndarray) -> np.ndarray:
    """Board values (0 blank, 1..n digits) -> tokens (1 blank, 2..n+1)."""
    return np.asarray(puzzle, dtype=np.int64) + 1


def generate(size: int, n: int, blanks: tuple[int, int], seed: int) -> Split:
    """n puzzles, blank counts uniform over [blanks[0], blanks[1]]."""
    lo, hi = blanks
    if lo > hi:
        raise ValueError(f"task.blanks=({lo}, {hi}) is not allowed; the minimum must not exceed the maximum")
    check_blanks(size, hi)
    check_blanks(size, lo)
    rng = np.random.default_rng(seed)
    solver = Solver(size)
    inputs, labels, diff = [], [], []
    for _ in range(n):
        k = int(rng.integers(lo, hi + 1))
        puzzle, solution = generate_puzzle(solver, k, rng)
        inputs.append(encode(puzzle))
        labels.append(encode(solution))
        diff.append(k)
    return Split(np.stack(inputs), np.stack(labels), np.asarray(diff, dtype=np.int64))


def augment(split: Split, size: int, rng: np.random.Generator) -> Split:
    """Validity-preserving symmetries per sample: digit permutation, band/stack permutation, row/column
    permutation inside bands/stacks, and transpose (only for square boxes: 6x6's 2x3 boxes would break)."""
    br, bc = BOXES[size]
    N = len(split)
    inputs, labels = split.inputs.copy(), split.labels.copy()
    for s in range(N):
        bands = rng.permutation(size // br)
        rows = np.concatenate([b * br + rng.permutation(br) for b in bands])
        stacks = rng.permutation(size // bc)
        cols = np.concatenate([t * bc + rng.permutation(bc) for t in stacks])
        idx = (rows[:, None] * size + cols[None, :])
        if br == bc and rng.random() < 0.5:
            idx = idx.T
        idx = idx.reshape(-1)
        digit_map = np.concatenate([[0, 1], 2 + rng.permutation(size)])  # PAD and blank stay
        inputs[s] = digit_map[split.inputs[s, idx]]
        labels[s] = digit_map[split.labels[s, idx]]
    return Split(inputs, labels, split.difficulty.copy())


def is_valid_solution(board: np.ndarray, size: int) -> bool:
    """board: digits 1..n (values, not tokens), shape (n*n,)."""
    br, bc = BOXES[size]
    g = np.asarray(board).reshape(size, size)
    want = set(range(1, size + 1))
    for i in range(size):
        if set(g[i].tolist()) != want or set(g[:, i].tolist()) != want:
            return False
    for r in range(0, size, br):
        for c in range(0, size, bc):
            if set(g[r:r + br, c:c + bc].reshape(-1).tolist()) != want:
                return False
    return True


def load_csv(path: str | Path, size: int = 9, limit: int | None = None) -> Split:
    """Sudoku-Extreme's CSV format: header `source,q,a,rating`; q uses '.' or '0' for blanks.

    DataError names the file and line: wrong length, bad characters, q and a disagreeing on a given, or an answer
    that breaks the rules (a digit twice in a row, column or box).
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"task.csv: {path} is a folder, not a CSV file")
    if not path.exists():
        raise DataError(f"task.csv: {path} does not exist")
    n2 = size * size
    digits = set("123456789"[:size])
    inputs, labels, diff = [], [], []
    try:
        f = path.open(newline="")
    except OSError as e:
        raise DataError(f"task.csv: {path}: {e.strerror}") from None
    with f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
        except (UnicodeDecodeError, csv.Error) as e:
            raise DataError(f"{path}:1: not a text CSV file ({e})") from None
        if header is None or [h.strip() for h in header[:3]] != ["source", "q", "a"]:
            raise DataError(f"{path}:1: expected the header 'source,q,a,rating', got {header}")
        line = 1
        try:
            for line, row in enumerate(reader, start=2):
                if limit is not None and len(inputs) >= limit:
                    break
                if not row:
                    continue
                q, a = check_csv_row(path, line, row, size, n2, digits)
                inputs.append(encode(q))
                labels.append(encode(a))
                diff.append(q.count(0))
        except (UnicodeDecodeError, csv.Error) as e:
            raise DataError(f"{path}:{line + 1}: not a text CSV line ({e})") from None
    if not inputs:
        raise DataError(f"{path}: no puzzles found")
    return Split(np.stack(inputs), np.stack(labels), np.asarray(diff, dtype=np.int64))


def check_csv_row(path: Path, line: int, row: list[str], size: int, n2: int,
                  digits: set[str]) -> tuple[list[int], list[int]]:
    """One CSV row -> (puzzle, answer) as digit lists (0 = blank); DataError naming file:line when it is wrong."""
    where = f"{path}:{line}"
    if len(row) < 3:
        raise DataError(f"{where}: expected columns source,q,a,rating; got {len(row)} columns")
    q, a = row[1].strip(), row[2].strip()
    for name, s in (("q", q), ("a", a)):
        if len(s) != n2:
            raise DataError(f"{where}: {name} has {len(s)} characters; a {size}x{size} board needs {n2}")
    bad = sorted(set(q) - digits - {".", "0"})
    if bad:
        raise DataError(f"{where}: q has bad characters {bad}; allowed: digits 1..{size}, '.' or '0'")
    bad = sorted(set(a) - digits)
    if bad:
        raise DataError(f"{where}: a has bad characters {bad}; allowed: digits 1..{size}")
    qv = [0 if ch in ".0" else int(ch) for ch in q]
    av = [int(ch) for ch in a]
    clash = [i for i in range(n2) if qv[i] and qv[i] != av[i]]
    if clash:
        raise DataError(f"{where}: q and a disagree on the given at cell {clash[0]}")
    if not is_valid_solution(np.asarray(av), size):
        raise DataError(f"{where}: a is not a solved {size}x{size} sudoku (a digit repeats in a row, column "
                        "or box)")
    return qv, av


def check_config(cfg) -> None:
    """task.size and the blank ranges (train and test) this generator can make."""
    if cfg.size not in BOXES:
        raise ValueError(f"task.size={cfg.size} is not allowed for sudoku; use one of {sorted(BOXES)}")
    for rng in (cfg.blanks, cfg.test_blanks or cfg.blanks):
        if rng[0] > rng[1]:
            raise ValueError(f"task.blanks={list(rng)} is not allowed; min must not exceed max")
        for b in rng:
            check_blanks(cfg.size, b)


def generate_split(cfg, which: str, n: int, seed: int) -> Split:
    blanks = cfg.blanks if which == "train" else (cfg.test_blanks or cfg.blanks)
    return generate(cfg.size, n, tuple(blanks), seed)


BLANK = 1  # the blank token (see the module docstring)


@dataclass
class Settings:
    """size: board side (4, 6 or 9). blanks: [min, max] blanks per puzzle; test_blanks: another range for the test
    set. augment: the training batches' symmetries (digit relabelling, transposition, band and stack moves).
    csv / test_csv: Sudoku-Extreme files instead of generated puzzles (relative paths are read against the spec's
    folder; a trial's identity holds their contents); with csv and no test_csv the last n_test of the first
    n_train + n_test puzzles of csv are held out as the test set."""

    size: int = 4
    blanks: tuple[int, int] = (8, 10)
    test_blanks: tuple[int, int] | None = None
    augment: bool = True
    csv: str | None = None
    test_csv: str | None = None


TASK = TaskDef("sudoku", spec=lambda cfg: sudoku_spec(cfg.size), generate=generate_split, check=check_config,
               free_cells=lambda split: split.inputs == BLANK,
               settings=Settings,
               augment=lambda split, cfg, rng: augment(split, cfg.size, rng) if cfg.augment else split,
               load_csv=lambda path, cfg, limit: load_csv(path, cfg.size, limit=limit))
