"""Loading a task: `load_task(cfg) -> Task` with a spec, train/test splits and augmentation.

Generated splits are cached on disk keyed by their generator settings (written atomically: a temporary name,
then rename), so every trial of a study that shares the task settings shares one copy.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from study.errors import DataError
from study.paths import atomic_target, machine_cache
from study.tasks import TASKS, TaskConfig
from study.tasks.base import Split, TaskSpec


@dataclass
class Task:
    spec: TaskSpec
    train: Split
    test: Split
    cfg: TaskConfig
    source: str = "generated"  # where the splits came from, in words (printed when a trial starts)

    def augment(self, batch: Split, rng: np.random.Generator) -> Split:
        """The task's training augmentation (sudoku symmetries); identity for tasks without one."""
        aug = TASKS[self.cfg.name].augment
        return aug(batch, self.cfg, rng) if aug else batch


def default_cache_dir() -> Path:
    """Where generated datasets are cached on this machine (study.paths.machine_cache)."""
    return machine_cache() / "datasets"


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
    with atomic_target(str(path.resolve())) as tmp, open(tmp, "wb") as f:
        np.savez(f, inputs=split.inputs, labels=split.labels, difficulty=split.difficulty)
    return split


def generate_split(cfg: TaskConfig, which: str) -> Split:
    n = cfg.n_train if which == "train" else cfg.n_test
    seed = cfg.data_seed * 2 + (0 if which == "train" else 1)  # train and test never share a puzzle stream
    return TASKS[cfg.name].generate(cfg, which, n, seed)


def load_csv_splits(cfg: TaskConfig) -> tuple[Split, Split, str]:
    """(train, test, source in words) from task.csv and task.test_csv. Without test_csv, the test set is held out
    of task.csv: the last n_test of its first n_train + n_test puzzles (never the generator's puzzles, which come
    from another distribution). DataError when there is nothing left to train on."""
    read = TASKS[cfg.name].load_csv
    if cfg.test_csv:
        train = read(cfg.csv, cfg, cfg.n_train)
        test = read(cfg.test_csv, cfg, cfg.n_test)
        return train, test, f"train: {len(train)} puzzles of {cfg.csv}; test: {len(test)} of {cfg.test_csv}"
    rows = read(cfg.csv, cfg, cfg.n_train + cfg.n_test)
    if len(rows) <= cfg.n_test:
        raise DataError(f"task.csv: {cfg.csv} has {len(rows)} puzzles; holding out task.n_test={cfg.n_test} of them "
                        "for testing leaves none to train on. Set task.test_csv or lower task.n_test.")
    cut = len(rows) - cfg.n_test
    train, test = rows.take(slice(0, cut)), rows.take(slice(cut, None))
    return train, test, (f"train: {len(train)} puzzles of {cfg.csv}; test: the next {len(test)} held out of the same "
                         "file (task.test_csv not set)")


def load_task(cfg: TaskConfig) -> Task:
    """The task's spec and splits: from the CSV files when given, else generated (cached)."""
    if cfg.csv:
        train, test, source = load_csv_splits(cfg)
        return Task(TASKS[cfg.name].spec(cfg), train, test, cfg, source)
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    splits = {}
    for which in ("train", "test"):
        settings = {k: v for k, v in asdict(cfg).items() if k not in ("cache_dir", "augment", "csv", "test_csv")}
        if settings.get("identifiers"):  # ARC's versions file enters by content: an edited file makes other splits
            settings["identifiers"] = hashlib.sha256(Path(settings["identifiers"]).read_bytes()).hexdigest()
        key = {**settings, "split": which, "version": 1}
        splits[which] = cached(key, lambda w=which: generate_split(cfg, w), cache_dir)
    return Task(TASKS[cfg.name].spec(cfg), splits["train"], splits["test"], cfg)


def check_data_files(tasks: list[TaskConfig]) -> None:
    """Read every distinct task CSV the task sections name, as a trial would, so bad data (a broken row, an answer that
    breaks the rules, too few puzzles to hold out a test set) is refused before any trial starts: DataError
    naming file and line."""
    seen = set()
    for t in tasks:
        key = (t.csv, t.test_csv, t.size, t.n_train, t.n_test)
        if t.csv and key not in seen:
            seen.add(key)
            load_csv_splits(t)
