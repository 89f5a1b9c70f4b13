"""Mazes N x N with loops; the label marks a BFS shortest path from start to goal (Maze-Hard style).

Tokens: 0 PAD, 1 wall, 2 open, 3 start, 4 goal, 5 path (labels only). Difficulty = shortest-path length in cells
(start and goal included); `min_path` is the difficulty knob (Maze-Hard: 30x30, paths of 110+ cells). task.test_size
makes the test mazes larger than the training ones (Deep Thinking's extrapolation: train 9x9, test 13x13 and up);
the difficulty is then the side.
Generation: a random depth-first maze on the odd lattice, then `loop_frac` of the remaining inner walls between
two open cells are knocked out, so there are loops and several routes (the label is BFS's path, a shortest one).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Annotated

import numpy as np

from study.bounds import Bound
from study.tasks.base import Split, TaskDef, TaskSpec

WALL, OPEN, START, GOAL, PATH = 1, 2, 3, 4, 5


def maze_spec(size: int, test_size: int | None = None) -> TaskSpec:
    """Training mazes of side `size`; test mazes of side `test_size` (extrapolation) when given."""
    t = test_size or size
    return TaskSpec("maze", 6, size * size, (size, size), "size" if test_size else "path_length",
                    test_seq_len=t * t, test_grid=(t, t))


def max_path(size: int) -> int:
    """A generous upper bound on the reachable shortest-path length, used to refuse impossible knobs."""
    return (size * size) // 2


def carve(size: int, rng: np.random.Generator, loop_frac: float) -> np.ndarray:
    g = np.full((size, size), WALL, dtype=np.int64)
    cells = [(r, c) for r in range(1, size - 1, 2) for c in range(1, size - 1, 2)]
    start = cells[int(rng.integers(len(cells)))]
    g[start] = OPEN
    stack = [start]
    while stack:
        r, c = stack[-1]
        nbrs = [(r + dr, c + dc, dr, dc) for dr, dc in ((2, 0), (-2, 0), (0, 2), (0, -2))
                if 0 < r + dr < size - 1 and 0 < c + dc < size - 1 and g[r + dr, c + dc] == WALL]
        if not nbrs:
            stack.pop()
            continue
        nr, nc, dr, dc = nbrs[int(rng.integers(len(nbrs)))]
        g[r + dr // 2, c + dc // 2] = OPEN
        g[nr, nc] = OPEN
        stack.append((nr, nc))
    # knock out walls that separate two open cells in a line: creates loops
    walls = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1) if g[r, c] == WALL and (
        (g[r - 1, c] == OPEN and g[r + 1, c] == OPEN) or (g[r, c - 1] == OPEN and g[r, c + 1] == OPEN))]
    for i in rng.permutation(len(walls))[: int(loop_frac * len(walls))]:
        g[walls[i]] = OPEN
    return g


def bfs(g: np.ndarray, src: tuple[int, int]) -> tuple[np.ndarray, dict]:
    size = g.shape[0]
    dist = np.full(g.shape, -1, dtype=np.int64)
    parent: dict[tuple[int, int], tuple[int, int]] = {}
    dist[src] = 0
    q = deque([src])
    while q:
        r, c = q.popleft()
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and g[nr, nc] != WALL and dist[nr, nc] < 0:
                dist[nr, nc] = dist[r, c] + 1
                parent[(nr, nc)] = (r, c)
                q.append((nr, nc))
    return dist, parent


def generate_maze(size: int, min_path: int, rng: np.random.Generator, loop_frac: float = 0.1,
                  attempts: int = 500) -> tuple[np.ndarray, np.ndarray, int]:
    """(input grid, label grid, path length) with a shortest path of at least min_path cells."""
    for _ in range(attempts):
        g = carve(size, rng, loop_frac)
        open_cells = np.argwhere(g == OPEN)
        a = tuple(open_cells[int(rng.integers(len(open_cells)))])
        dist, _ = bfs(g, a)
        b = tuple(np.unravel_index(int(dist.argmax()), dist.shape))  # farthest cell from a
        dist_b, parent = bfs(g, b)
        candidates = np.argwhere(dist_b + 1 >= min_path)
        if len(candidates) == 0:
            continue
        s = tuple(candidates[int(rng.integers(len(candidates)))])
        path = [s]
        while path[-1] != b:
            path.append(parent[path[-1]])
        inp = g.copy()
        inp[s], inp[b] = START, GOAL
        lab = inp.copy()
        for cell in path[1:-1]:
            lab[cell] = PATH
        return inp.reshape(-1), lab.reshape(-1), len(path)
    raise RuntimeError(f"no {size}x{size} maze with a path of {min_path}+ cells in {attempts} attempts")


def generate(size: int, n: int, min_path: int, seed: int, loop_frac: float = 0.1) -> Split:
    if size < 5:
        raise ValueError(f"task.size={size} is not allowed for maze; it must be >= 5")
    if not 2 <= min_path <= max_path(size):
        raise ValueError(f"task.min_path={min_path} cannot be reached on a {size}x{size} maze; "
                         f"allowed: 2..{max_path(size)}")
    rng = np.random.default_rng(seed)
    rows = [generate_maze(size, min_path, rng, loop_frac) for _ in range(n)]
    return Split(np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows]),
                 np.asarray([r[2] for r in rows], dtype=np.int64))


def check_config(cfg) -> None:
    for key, size in (("size", cfg.size), ("test_size", cfg.test_size or cfg.size)):
        if size < 5:
            raise ValueError(f"task.{key}={size} is not allowed for maze; it must be >= 5")
    # the smaller side bounds the path length both splits must reach
    side = min(cfg.size, cfg.test_size or cfg.size)
    if not 2 <= cfg.min_path <= max_path(side):
        raise ValueError(f"task.min_path={cfg.min_path} cannot be reached on a {side}x{side} maze; allowed: "
                         f"2..{max_path(side)}")


def generate_split(cfg, which: str, n: int, seed: int) -> Split:
    """A split of side `size` (train) or `test_size` (test). With test_size set (an extrapolation study) the
    difficulty column is the maze's side, as Deep Thinking reports mazes, instead of the path length."""
    size = cfg.size if which == "train" else (cfg.test_size or cfg.size)
    split = generate(size, n, cfg.min_path, seed, cfg.loop_frac)
    if cfg.test_size:
        split.difficulty = np.full(n, size, dtype=np.int64)
    return split



@dataclass
class Settings:
    """size: the maze's side; test_size: a side for the test set (extrapolation: train small, test larger).
    min_path: the shortest start-to-goal path a maze may have. loop_frac: the share of walls knocked down after the
    maze is carved (0: a perfect maze, one path)."""

    size: int = 4
    min_path: int = 10
    loop_frac: Annotated[float, Bound(ge=0, le=1)] = 0.1
    test_size: Annotated[int | None, Bound(ge=1, most=1_000)] = None


TASK = TaskDef("maze", spec=lambda cfg: maze_spec(cfg.size, cfg.test_size), check=check_config,
               generate=generate_split, settings=Settings)
