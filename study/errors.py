"""Every error loopstudy raises on purpose, in one hierarchy. Each carries a message that is one line for the user:
what is wrong, where (file, dotted key, study, path) and what to do. The command line (study.cli.main) prints it
as `loopstudy: <message>` and exits with the class's `exit_code`; anything else is a bug and keeps its traceback.
"""


class LoopstudyError(Exception):
    """Base of loopstudy's own errors. exit_code: the command line's exit status for it."""

    exit_code = 2


class ConfigError(LoopstudyError, ValueError):
    """Bad input in a config, spec, override or command argument; the message names the file and dotted key."""


class DataError(LoopstudyError, ValueError):
    """Bad task data (a CSV that breaks its format or the puzzle's rules); the message names file and line."""


class StoreError(LoopstudyError):
    """A problem reading or writing the results store; the message says what and where."""


class AnalysisError(LoopstudyError):
    """Nothing to show (unknown study, empty study, unknown kind): the message says what exists."""


class TrainingError(LoopstudyError, RuntimeError):
    """Training cannot go on (the loss became NaN or infinite): the trial fails with this reason and stores no
    results, rather than storing a NaN loss as if it were a result."""

    exit_code = 1


def first_line(error: BaseException) -> str:
    """An error's message cut to its first line (someone else's error, quoted inside one of loopstudy's)."""
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else "(no message)"
