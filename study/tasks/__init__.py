"""Tasks (methods.md section 8), one module each, found by their module-level `TASK` (a TaskDef): sudoku, maze,
state tracking, prefix sums, ARC. Adding a task is adding a module here, with the settings it reads
(study.tasks.settings puts a trial's `task:` section, TaskConfig, together from them). `study.tasks.loader.load_task`
builds one. Torch-free."""

import importlib
import pkgutil

from study.tasks.base import IGNORE, Split, TaskDef, TaskSpec, accuracies
from study.tasks.settings import COMMON_FIELDS, build_task_config


def _discover() -> dict[str, TaskDef]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "loader":  # it reads TASKS itself; every other module without a TASK is passed over
            continue
        task = getattr(importlib.import_module(f"{__name__}.{info.name}"), "TASK", None)
        if isinstance(task, TaskDef):
            found[task.name] = task
    return found


TASKS: dict[str, TaskDef] = _discover()
TaskConfig = build_task_config(TASKS)
TaskName = TaskConfig.__annotations__["name"]  # Literal of every task's name

__all__ = ["COMMON_FIELDS", "IGNORE", "TASKS", "Split", "TaskConfig", "TaskDef", "TaskName", "TaskSpec",
           "accuracies"]
