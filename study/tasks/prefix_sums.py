"""Prefix sums (Schwarzschild et al. 2021, "easy-to-hard" data): a bit string; the label at each position is the
parity of the bits up to and including it. The Deep Thinking line's smallest test of logical extrapolation and of
overthinking: train on short strings at a fixed depth, test on longer strings at many depths.

Tokens: 0 PAD, 1 bit 0, 2 bit 1; labels use the same tokens (1: even, 2: odd), IGNORE on padding. Training
strings have lengths task.min_length..task.length (padded to task.length at the end); the test set's task.n_test
strings are spread evenly over task.test_lengths, padded to the longest, ordered by length. Difficulty = length.
Generation as easy-to-hard does it: for short lengths distinct integers written in binary (no string twice in a
split), otherwise independent fair bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np

from study.bounds import Bound
from study.tasks.base import IGNORE, Split, TaskDef, TaskSpec

PAD, ZERO = 0, 1  # bit b is token ZERO + b
DISTINCT_UP_TO = 20  # lengths <= this draw distinct integers below 2**length; longer ones draw free bits


def train_lengths(cfg) -> list[int]:
    return list(range(cfg.min_length or cfg.length, cfg.length + 1))


def test_lengths(cfg) -> list[int]:
    return sorted(set(cfg.test_lengths or [cfg.length]))


def spec(cfg) -> TaskSpec:
    longest = max(test_lengths(cfg))
    return TaskSpec("prefix_sums", 3, cfg.length, (cfg.length,), "length", pad=PAD,
                    test_seq_len=longest, test_grid=(longest,))


def strings(length: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n bit strings of one length, (n, length) in {0, 1}."""
    if length <= DISTINCT_UP_TO:
        if n > 2 ** length:
            raise ValueError(f"{n} distinct strings of length {length} asked for; there are only {2 ** length}")
        ints = rng.choice(2 ** length, size=n, replace=False)
        return (ints[:, None] >> np.arange(length - 1, -1, -1)) & 1
    return rng.integers(0, 2, size=(n, length))


def make_split(lengths: list[int], n: int, seed: int, width: int) -> Split:
    """n strings spread evenly over `lengths` (the first lengths get one more when n does not divide)."""
    rng = np.random.default_rng(seed)
    counts = [n // len(lengths) + (i < n % len(lengths)) for i in range(len(lengths))]
    inputs = np.full((n, width), PAD, dtype=np.int64)
    labels = np.full((n, width), IGNORE, dtype=np.int64)
    difficulty = np.empty(n, dtype=np.int64)
    row = 0
    for length, count in zip(lengths, counts):
        bits = strings(length, count, rng)
        inputs[row:row + count, :length] = bits + ZERO
        labels[row:row + count, :length] = np.cumsum(bits, axis=1) % 2 + ZERO
        difficulty[row:row + count] = length
        row += count
    return Split(inputs, labels, difficulty)


def generate(cfg, which: str, n: int, seed: int) -> Split:
    if which == "train":
        return make_split(train_lengths(cfg), n, seed, cfg.length)
    lengths = test_lengths(cfg)
    return make_split(lengths, n, seed, max(lengths))


def check_config(cfg) -> None:
    if cfg.min_length is not None and cfg.min_length > cfg.length:
        raise ValueError(f"task.min_length={cfg.min_length} is not allowed; it must be <= task.length={cfg.length}")
    if cfg.test_lengths is not None and (not cfg.test_lengths or min(cfg.test_lengths) < 1
                                         or max(cfg.test_lengths) > 100_000):
        raise ValueError(f"task.test_lengths={cfg.test_lengths} is not allowed; give lengths in 1..100000")
    for which, lengths, n in (("train", train_lengths(cfg), cfg.n_train), ("test", test_lengths(cfg), cfg.n_test)):
        per = -(-n // len(lengths))
        short = [k for k in lengths if k <= DISTINCT_UP_TO and 2 ** k < per]
        if short:
            raise ValueError(f"task.n_{which}={n} asks for {per} distinct strings of length {short[0]}; there are "
                             f"only {2 ** short[0]}")



@dataclass
class Settings:
    """length: the longest training string; min_length: the shortest (default: length). test_lengths: the test
    strings' lengths (default: length; longer ones test extrapolation)."""

    length: Annotated[int, Bound(ge=1, most=100_000)] = 16
    min_length: Annotated[int | None, Bound(ge=1)] = None
    test_lengths: list[int] | None = None


TASK = TaskDef("prefix_sums", spec=spec, generate=generate, check=check_config,
               settings=Settings)
