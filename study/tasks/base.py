"""What every task provides (methods.md section 8): token arrays, a difficulty per sample, accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE = -100  # label value for positions that carry no target (padding)


class DataError(ValueError):
    """Bad task data (a CSV that breaks its format or the puzzle's rules); the message names file and line."""


@dataclass
class Split:
    """One set of samples: inputs and labels (N, S) int64, difficulty (N,) int64."""

    inputs: np.ndarray
    labels: np.ndarray
    difficulty: np.ndarray

    def __len__(self) -> int:
        return len(self.inputs)

    def take(self, idx: np.ndarray | slice) -> Split:
        return Split(self.inputs[idx], self.labels[idx], self.difficulty[idx])


@dataclass(frozen=True)
class TaskSpec:
    """The shape a task gives the model: vocab size, sequence length and token grid for the conv."""

    name: str
    vocab: int
    seq_len: int
    grid: tuple[int, ...]
    difficulty_name: str  # what `difficulty` counts: blanks, path length, sequence length


def accuracies(pred: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: (exact: every scored cell right, cell: share of scored cells right)."""
    scored = labels != IGNORE
    right = (pred == labels) & scored
    n_scored = np.maximum(scored.sum(1), 1)
    return (right.sum(1) == scored.sum(1)), right.sum(1) / n_scored
