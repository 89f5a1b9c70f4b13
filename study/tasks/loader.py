"""Loading a task: `load_task(cfg) -> Task` with a spec, train/test splits and augmentation.

Generated splits are cached on disk keyed by their generator settings (written atomically: a temporary name,
then rename), so every trial of a study that shares the task settings shares one copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from study.config import TaskConfig
from study.tasks import maze, state_tracking, sudoku
from study.tasks.base import Split, TaskSpec


@dataclass
class Task:
    spec: TaskSpec
    train: Split
    test: Split
    cfg: TaskConfig

    def augment(self, batch: Split, rng: np.random.Generator) -> Split:
        """Training augmentation (sudoku symmetries); identity for the other tasks."""
        if self.cfg.name == "sudoku" and self.cfg.augment:
            return sudoku.augment(batch, self.cfg.size, rng)
        return batch


def default_cache_dir() -> Path:
    return Path(os.environ.get("LOOPSTUDY_CACHE", Path.home() / ".cache" / "loopstudy")) / "datasets"


def cached(key: dict, make, cache_dir: Path) -> Split:
    """Load the split for `key` from the cache, or make it and write it atomically."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir / f"{key['name']}-{digest}.npz"
    if path.exists():
        try:
            with np.load(path) as f:
                return Split(f["inputs"], f["labels"], f["difficulty"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # unreadable (should not happen with atomic writes): make it again
    split = make()
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, inputs=split.inputs, labels=split.labels, difficulty=split.difficulty)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return split


def generate_split(cfg: TaskConfig, which: str) -> Split:
    n = cfg.n_train if which == "train" else cfg.n_test
    seed = cfg.data_seed * 2 + (0 if which == "train" else 1)  # train and test never share a puzzle stream
    if cfg.name == "sudoku":
        blanks = cfg.blanks if which == "train" else (cfg.test_blanks or cfg.blanks)
        return sudoku.generate(cfg.size, n, tuple(blanks), seed)
    if cfg.name == "maze":
        return maze.generate(cfg.size, n, cfg.min_path, seed, cfg.loop_frac)
    return state_tracking.generate(cfg.group, cfg.length, n, seed)


def task_spec(cfg: TaskConfig) -> TaskSpec:
    if cfg.name == "sudoku":
        return sudoku.sudoku_spec(cfg.size)
    if cfg.name == "maze":
        return maze.maze_spec(cfg.size)
    return state_tracking.state_spec(cfg.group, cfg.length)


def load_task(cfg: TaskConfig) -> Task:
    """The task's spec and splits: from the CSV files when given, else generated (cached)."""
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    splits = {}
    for which, csv_path in (("train", cfg.csv), ("test", cfg.test_csv)):
        if csv_path:
            limit = cfg.n_train if which == "train" else cfg.n_test
            splits[which] = sudoku.load_csv(csv_path, cfg.size, limit=limit)
        else:
            settings = {k: v for k, v in asdict(cfg).items() if k not in ("cache_dir", "augment", "csv", "test_csv")}
            key = {**settings, "split": which, "version": 1}
            splits[which] = cached(key, lambda w=which: generate_split(cfg, w), cache_dir)
    return Task(task_spec(cfg), splits["train"], splits["test"], cfg)
