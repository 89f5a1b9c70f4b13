"""State tracking on S5 / A5 (FPRM): a word of group elements; label = the running product at each position.

Elements are permutations of 5 points, indexed in lexicographic order of S5 (A5: the even ones, re-indexed).
Tokens: 0 PAD, 1 + element index. Running product p_t = g_t o p_{t-1} (apply p_{t-1} first), p_1 = g_1.
Difficulty = word length (every sample in a set has the same).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np

from study.bounds import Bound
from study.tasks.base import Split, TaskDef, TaskSpec

GROUPS = ("S5", "A5")


def parity(p: tuple[int, ...]) -> int:
    return sum(1 for i in range(len(p)) for j in range(i + 1, len(p)) if p[i] > p[j]) % 2


def elements(group: str) -> list[tuple[int, ...]]:
    if group not in GROUPS:
        raise ValueError(f"task.group={group!r} is not allowed; use one of {GROUPS}")
    perms = list(itertools.permutations(range(5)))
    return perms if group == "S5" else [p for p in perms if parity(p) == 0]


def compose(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """(a o b)(i) = a(b(i))."""
    return tuple(a[b[i]] for i in range(len(b)))


def state_spec(group: str, length: int) -> TaskSpec:
    return TaskSpec("state_tracking", 1 + len(elements(group)), length, (length,), "length")


def generate(group: str, length: int, n: int, seed: int) -> Split:
    if length < 1:
        raise ValueError(f"task.length={length} is not allowed; it must be >= 1")
    elems = elements(group)
    index = {p: i for i, p in enumerate(elems)}
    # product table: table[a, b] = index(a o b)
    table = np.array([[index[compose(a, b)] for b in elems] for a in elems], dtype=np.int64)
    rng = np.random.default_rng(seed)
    words = rng.integers(0, len(elems), size=(n, length))
    prods = np.empty_like(words)
    prods[:, 0] = words[:, 0]
    for t in range(1, length):
        prods[:, t] = table[words[:, t], prods[:, t - 1]]
    return Split(words + 1, prods + 1, np.full(n, length, dtype=np.int64))



@dataclass
class Settings:
    """group: the permutation group whose products are tracked (S5, or its even half A5). length: the sequence
    length."""

    group: Literal["S5", "A5"] = "A5"
    length: Annotated[int, Bound(ge=1, most=100_000)] = 16


TASK = TaskDef("state_tracking", spec=lambda cfg: state_spec(cfg.group, cfg.length),
               generate=lambda cfg, which, n, seed: generate(cfg.group, cfg.length, n, seed),
               settings=Settings)
