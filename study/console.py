"""Where loopstudy's own lines go: stderr, flushed at once (a study's progress must show while Ray works)."""

from __future__ import annotations

import sys


def eprint(*args: object) -> None:
    """Print one of loopstudy's status lines to stderr (stdout carries tables and paths only)."""
    print(*args, file=sys.stderr, flush=True)
