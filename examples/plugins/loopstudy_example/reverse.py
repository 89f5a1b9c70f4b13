"""The reverse task: a string of digits, to be written back reversed. Variable length: training strings have
task.min_length..task.length digits (padded at the end), the test strings task.length. Difficulty = length.

Tokens: 0 pad, 1..10 the digits 0..9; labels the same tokens, IGNORE on padding.
"""

from dataclasses import dataclass
from typing import Annotated

import numpy as np

from study.bounds import Bound
from study.tasks.base import IGNORE, Split, TaskDef, TaskSpec

PAD = 0


@dataclass
class Settings:
    """length: the longest string (the test strings' length); min_length: the shortest training string (default:
    length). Declared as prefix_sums declares them: a key two tasks read means one thing."""

    length: Annotated[int, Bound(ge=1, most=100_000)] = 16
    min_length: Annotated[int | None, Bound(ge=1)] = None


def spec(cfg) -> TaskSpec:
    return TaskSpec("reverse", 11, cfg.length, (cfg.length,), "length", pad=PAD)


def generate(cfg, which: str, n: int, seed: int) -> Split:
    rng = np.random.default_rng(seed + (0 if which == "train" else 1))
    shortest = (cfg.min_length or cfg.length) if which == "train" else cfg.length
    lengths = rng.integers(shortest, cfg.length + 1, size=n)
    inputs = np.full((n, cfg.length), PAD, dtype=np.int64)
    labels = np.full((n, cfg.length), IGNORE, dtype=np.int64)
    for i, k in enumerate(lengths):
        digits = rng.integers(1, 11, size=k)
        inputs[i, :k], labels[i, :k] = digits, digits[::-1]
    return Split(inputs, labels, lengths.astype(np.int64))


def check(cfg) -> None:
    if cfg.min_length is not None and cfg.min_length > cfg.length:
        raise ValueError(f"task.min_length={cfg.min_length} is not allowed; it must be <= task.length={cfg.length}")


TASK = TaskDef("reverse", spec=spec, generate=generate, check=check, settings=Settings)
