"""Benchmark: generate N 9x9 sudokus with exactly 54 blanks and a unique solution, on one core.

Target (issue): 1,000 puzzles in under 2 minutes. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import time

from study.tasks import sudoku


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--blanks", type=int, default=54)
    args = p.parse_args()
    t0 = time.perf_counter()
    split = sudoku.generate(9, args.n, (args.blanks, args.blanks), seed=0)
    dt = time.perf_counter() - t0
    assert (split.difficulty == args.blanks).all()
    print(json.dumps({"bench": "sudoku_gen", "n": args.n, "blanks": args.blanks, "seconds": dt,
                      "puzzles_per_s": args.n / dt, "target_seconds": 120}))


if __name__ == "__main__":
    main()
