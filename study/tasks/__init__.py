"""Tasks (methods.md section 8), one module each, found by their module-level `TASK` (a TaskDef): sudoku, maze,
state tracking. Adding a task is adding a module here. `study.tasks.loader.load_task` builds one."""

import importlib
import pkgutil

from study.tasks.base import COMMON_FIELDS, IGNORE, Split, TaskDef, TaskSpec, accuracies


def _discover() -> dict[str, TaskDef]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in ("base", "loader"):
            continue
        task = getattr(importlib.import_module(f"{__name__}.{info.name}"), "TASK", None)
        if isinstance(task, TaskDef):
            found[task.name] = task
    return found


TASKS: dict[str, TaskDef] = _discover()

__all__ = ["COMMON_FIELDS", "IGNORE", "TASKS", "Split", "TaskDef", "TaskSpec", "accuracies"]
