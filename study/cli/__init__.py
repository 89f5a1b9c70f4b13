"""`loopstudy`: run studies on Ray, run one trial, and read results back as tables, figures and SQL.

`parser` builds the command line, `commands` holds one function per command; `main` is the one error boundary:
every refusal of bad input, from any command, ends as one `loopstudy: ...` line on stderr and the error's exit
code (study.errors: 2 for bad input, 1 for a training that cannot go on).
"""

from __future__ import annotations

import errno
import os
import sys

from study.cli.parser import build_parser
from study.console import eprint


def os_error_line(e: OSError) -> str:
    """One line for a refusal of the operating system or an object store (errno's meaning first)."""
    where = f" ({e.filename})" if getattr(e, "filename", None) else ""
    if e.errno == errno.ENOSPC:
        return (f"no space left on the device{where}. Every file is written whole under a temporary name and "
                "renamed into place, so nothing half-written was left and complete results are as they were; "
                "free some space and run the command again")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write{where}: {e.strerror}; nothing was changed. Give a writable --store (or folder)"
    first = (str(e).splitlines() or [type(e).__name__])[0][:300]
    return f"{e.strerror or first}{where}" if e.strerror else first


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    # key=value overrides may also come after the options (argparse stops collecting positionals there)
    if rest and hasattr(args, "overrides") and all("=" in r and not r.startswith("-") for r in rest):
        args.overrides = [*args.overrides, *rest]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if hasattr(args, "study_pos"):  # STUDY or --study, once
        if args.study_pos and args.study and args.study_pos != args.study:
            parser.error(f"two studies given: {args.study_pos!r} and --study {args.study!r}")
        args.study = args.study_pos or args.study
        if not args.study:
            parser.error(f"{args.command}: give the study (STUDY or --study NAME)")
    from study.errors import LoopstudyError

    try:
        return args.func(args)
    except LoopstudyError as e:  # bad input (2) or a training that cannot go on (1): one line, no traceback
        eprint(f"loopstudy: {e}")
        return e.exit_code
    except FileNotFoundError as e:  # a compaction removed files this read had listed: never a wrong answer
        eprint(f"loopstudy: a results file went away while it was being read ({e}); a `loopstudy compact` "
               "probably ran at the same time: run the command again")
        return 2
    except BrokenPipeError:  # `loopstudy table ... | head`: the reader has what it wanted; stay quiet, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 141
    except OSError as e:  # the disk, the file system or an object store said no: say which, and what it means
        eprint(f"loopstudy: {os_error_line(e)}")
        return 2
    except KeyboardInterrupt:
        eprint("loopstudy: interrupted")
        return 130
