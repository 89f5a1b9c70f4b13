"""Tasks (methods.md section 8): sudoku, maze, state tracking, prefix sums, ARC, and any installed plugin's. Each
registers a TaskDef (study.tasks.base states the contract) by entry point in the group `loopstudy.tasks`
(study.plugins), the built-ins in loopstudy's own pyproject.toml, one module each here, with the settings it reads
(study.tasks.settings puts a trial's `task:` section, TaskConfig, together from them). `study.tasks.loader.load_task`
builds one. Torch-free."""

from study.plugins import discover, set_aside_clashes
from study.tasks.base import IGNORE, Split, TaskDef, TaskSpec, accuracies
from study.tasks.settings import COMMON_FIELDS, build_task_config, declared

FOUND = discover("tasks", TaskDef)
set_aside_clashes(FOUND, lambda t: declared(t.settings) if t.settings else {}, set(COMMON_FIELDS), "task.")
TASKS: dict[str, TaskDef] = FOUND.parts
if "sudoku" not in TASKS:  # the default must exist: loopstudy's own metadata is missing or stale
    raise ImportError("the built-in tasks are not registered: loopstudy is not installed in this environment "
                      "(pip install -e . from the repository, which registers them by entry point)")
TaskConfig = build_task_config(TASKS)
TaskName = TaskConfig.__annotations__["name"]  # Literal of every task's name

__all__ = ["COMMON_FIELDS", "FOUND", "IGNORE", "TASKS", "Split", "TaskConfig", "TaskDef", "TaskName", "TaskSpec",
           "accuracies"]
