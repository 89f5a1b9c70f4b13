"""A trial's `task:` section (TaskConfig), put together from what each task declares about itself.

Every task module declares the settings it reads as a small dataclass (`TaskDef.settings`): their types, defaults
and allowed ranges (study.bounds) live with the task. Every task reads the common ones below. TaskConfig holds
them all in one flat section, `task.<key>`, so that a trial's identity and the trials table's `task.*` columns do
not depend on which task declared a key: a key that two tasks read (sudoku's and maze's `size`) is declared by
both, identically (a disagreement is a programming error, raised at import). Setting an optional key (default
None) for a task that does not read it is refused, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic.dataclasses import dataclass as pdataclass

from study.bounds import Bound, check_bounds
from study.tasks.base import TaskDef


@dataclass
class CommonSettings:
    """name: the task (one module in study/tasks/). n_train / n_test: training and test samples (ARC: puzzles of
    the training and evaluation sets). data_seed: fixes the data for every trial seed (the trial seed drives init
    and order). cache_dir: where generated splits are cached (default: this machine's cache)."""

    name: str = "sudoku"
    n_train: Annotated[int, Bound(ge=1, most=10_000_000)] = 2000
    n_test: Annotated[int, Bound(ge=1, most=1_000_000)] = 256
    data_seed: int = 0
    cache_dir: str | None = None


COMMON_FIELDS = tuple(f.name for f in dataclasses.fields(CommonSettings))  # every task reads these


def declared(cls: type) -> dict[str, tuple[Any, Any]]:
    """{field: (annotation, default)} of a settings dataclass, annotations resolved with their Bounds."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: (hints[f.name], f.default) for f in dataclasses.fields(cls)}


def merged_fields(tasks: dict[str, TaskDef]) -> dict[str, tuple[Any, Any]]:
    """The common fields, then every task's own, each once; `name` allows the tasks found."""
    out = declared(CommonSettings)
    out["name"] = (Literal[tuple(tasks)], out["name"][1])
    owner: dict[str, str] = {}
    for task in tasks.values():
        for key, (tp, default) in (declared(task.settings) if task.settings is not None else {}).items():
            if key in COMMON_FIELDS:
                raise TypeError(f"task {task.name}: task.{key} is a common setting; do not declare it again")
            if key in owner and out[key] != (tp, default):
                raise TypeError(f"task.{key} is declared differently by {owner[key]} ({out[key]}) and by "
                                f"{task.name} ({(tp, default)}); a shared key must mean one thing")
            out[key], owner[key] = (tp, default), owner.get(key, task.name)
    return out


def build_task_config(tasks: dict[str, TaskDef]) -> type:
    """The TaskConfig class (a pydantic dataclass forbidding unknown keys) over the tasks found."""
    fields = merged_fields(tasks)
    optional = tuple(k for k, (_, default) in fields.items() if default is None)

    def __post_init__(self) -> None:
        task = tasks[self.name]
        for key in optional:  # set for a task that does not read it: refused, never silently ignored
            if getattr(self, key) is not None and key not in task.reads and key not in COMMON_FIELDS:
                readers = [t for t, d in tasks.items() if key in d.reads]
                raise ValueError(f"task.{key} is for {', '.join(readers)}; task.name is {self.name!r}")
        check_bounds("task", self)
        task.check(self)
        check_data_paths(self, tasks)

    doc = "\n\n".join([CommonSettings.__doc__, *(f"{t}: {d.settings.__doc__}" for t, d in tasks.items()
                                                   if d.settings is not None)])
    namespace = {"__annotations__": {k: tp for k, (tp, _) in fields.items()},
                 **{k: default for k, (_, default) in fields.items()},
                 "__post_init__": __post_init__, "__doc__": doc, "__module__": "study.tasks",
                 "__qualname__": "TaskConfig"}
    return pdataclass(config={"extra": "forbid"})(type("TaskConfig", (), namespace))


def check_data_paths(cfg: Any, tasks: dict[str, TaskDef]) -> None:
    """task.csv / task.test_csv: only for a task that reads CSV files, and each an existing file."""
    for key in ("csv", "test_csv"):
        path = getattr(cfg, key, None)
        if path is None:
            continue
        if not tasks[cfg.name].reads_csv:
            readers = [t for t, d in tasks.items() if d.reads_csv]
            raise ValueError(f"task.{key} is for {', '.join(readers)} (Sudoku-Extreme's CSV format); task.name "
                             f"is {cfg.name!r}")
        if not os.path.isfile(path):
            what = "is a folder, not a file" if os.path.isdir(path) else "does not exist"
            raise ValueError(f"task.{key}={path!r} {what}")
    if getattr(cfg, "test_csv", None) and not cfg.csv:
        raise ValueError("task.test_csv needs task.csv (the training puzzles) as well")
