"""Tasks (methods.md section 8): sudoku, maze, state tracking. `study.tasks.loader.load_task` builds one."""

from study.tasks.base import IGNORE, DataError, Split, TaskSpec, accuracies

__all__ = ["IGNORE", "DataError", "Split", "TaskSpec", "accuracies"]
