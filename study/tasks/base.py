"""What every task provides (methods.md section 8): token arrays, a difficulty per sample, accuracy."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# A trial's task section, as the functions below receive it: study.tasks.TaskConfig, which is put together from the
# tasks' own settings when the package is imported (study.tasks.settings), so it has no static name here.
TaskConfig = Any
IGNORE = -100  # label value for positions that carry no target (padding)


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
    difficulty_name: str = "difficulty"  # what `difficulty` counts: blanks, path length, sequence length
    pad: int | None = None  # the padding token of variable-length tasks (trailing padding is trimmed at test)
    test_seq_len: int | None = None  # the test set's length and grid where they differ from training's
    test_grid: tuple[int, ...] | None = None
    puzzles: int = 0  # puzzle ids (ARC): the sequence's last column is the id, read from a learned embedding

    @property
    def test_shape_differs(self) -> bool:
        """Whether the test inputs are longer than training's, or laid out on another grid."""
        return ((self.test_seq_len or self.seq_len) > self.seq_len
                or (len(self.grid) > 1 and (self.test_grid or self.grid) != self.grid))


def accuracies(pred: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: (exact: every scored cell right, cell: share of scored cells right)."""
    scored = labels != IGNORE
    right = (pred == labels) & scored
    n_scored = np.maximum(scored.sum(1), 1)
    return (right.sum(1) == scored.sum(1)), right.sum(1) / n_scored


@dataclass(frozen=True)
class TaskDef:
    """What a task module registers (as a module-level `TASK`): adding a task is one new module in study/tasks/.

    check(cfg) raises ValueError naming `task.<key>` for settings the task cannot take; generate(cfg, which, n,
    seed) makes the 'train' or 'test' split; augment(split, cfg, rng) is the training augmentation (None: none);
    reads_csv: task.csv / task.test_csv apply (load_csv(path, cfg, limit) reads them). free_cells(split): (N, S)
    the cells a solver must fill, for the stability diagnostics (default: every scored cell; sudoku: the blanks).
    settings: a dataclass of the task's own settings (types, defaults, Bounds; its docstring says what each means),
    read beside the common ones (study.tasks.settings); its field names are `reads`, the one statement that
    TaskConfig's refusals and the sweep checks (study.config.usage) use. vote(cfg, preds, conf,
    difficulty): a task scored per pooled answer rather than per sample (ARC): {difficulty or None: {column: value}}
    for the depth rows' VOTE_COLUMNS.
    """

    name: str
    spec: Callable[[TaskConfig], TaskSpec]
    generate: Callable[[TaskConfig, str, int, int], Split]
    check: Callable[[TaskConfig], None] = lambda cfg: None
    augment: Callable[[Split, TaskConfig, np.random.Generator], Split] | None = None
    load_csv: Callable[[str, TaskConfig, int | None], Split] | None = None
    free_cells: Callable[[Split], np.ndarray] = lambda split: split.labels != IGNORE
    settings: type | None = None
    vote: Callable[[TaskConfig, np.ndarray, np.ndarray, np.ndarray], dict] | None = None

    @property
    def reads(self) -> tuple[str, ...]:
        """The task's own TaskConfig fields (beside the common ones)."""
        return tuple(f.name for f in dataclasses.fields(self.settings)) if self.settings else ()

    @property
    def reads_csv(self) -> bool:
        return self.load_csv is not None
