"""ARC's augmentations (methods.md section 8.5): the 8 dihedral transforms of a grid and the permutations of colours
1..9 (0 fixed); a Version is one of each, applied to a puzzle's grids and inverted on a prediction."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def dihedral(grid: np.ndarray, k: int) -> np.ndarray:
    """Transform k of the 8: k = 0..3 rotate by k quarter turns, 4..7 transpose then rotate by k - 4."""
    return np.rot90(grid if k < 4 else grid.T, k % 4)


def _inverse_table() -> tuple[int, ...]:
    probe = np.arange(6).reshape(2, 3)  # no symmetry: each transform is told apart
    return tuple(next(j for j in range(8) if np.array_equal(dihedral(dihedral(probe, k), j), probe)) for k in range(8))


INVERSE = _inverse_table()


@dataclass(frozen=True)
class Version:
    """One augmented version of a puzzle: dihedral transform k and colour map perm (perm[0] = 0)."""

    k: int
    perm: tuple[int, ...]

    def apply(self, grid: np.ndarray) -> np.ndarray:
        return np.asarray(self.perm)[dihedral(grid, self.k)]

    def invert(self, grid: np.ndarray) -> np.ndarray:
        return dihedral(np.argsort(self.perm)[grid], INVERSE[self.k])


IDENTITY = Version(0, tuple(range(10)))


# -- TRM's dataset builder's names for versions (its identifiers.json) ---------------------------------------------
NAME_SEPARATOR = "|||"  # build_arc_dataset.py: "<puzzle>|||t<transform>|||<colour map as 10 digits>"


def trm_dihedral(grid: np.ndarray, t: int) -> np.ndarray:
    """TRM's transform t: 0..3 rotate by t quarter turns, 4 flip left-right, 5 flip up-down, 6 transpose,
    7 anti-transpose (its dataset/common.py numbering)."""
    if t < 4:
        return np.rot90(grid, t)
    return (np.fliplr(grid), np.flipud(grid), grid.T, np.fliplr(np.rot90(grid, 1)))[t - 4]


def _from_trm_table() -> tuple[int, ...]:
    probe = np.arange(6).reshape(2, 3)
    return tuple(next(k for k in range(8) if np.array_equal(dihedral(probe, k), trm_dihedral(probe, t)))
                 for t in range(8))


FROM_TRM = _from_trm_table()  # TRM's transform t is loopstudy's dihedral FROM_TRM[t]


def from_trm_name(name: str) -> tuple[str, Version]:
    """(puzzle id, version) of a name in TRM's identifiers.json; ValueError for a name not of its form. TRM maps the
    colours, then transforms; the two commute, so the version is loopstudy's transform with TRM's colour map."""
    if NAME_SEPARATOR not in name:
        return name, IDENTITY
    parts = name.split(NAME_SEPARATOR)
    if len(parts) != 3 or not parts[1].startswith("t") or not parts[1][1:].isdigit() or int(parts[1][1:]) > 7 \
            or sorted(parts[2]) != list("0123456789") or parts[2][0] != "0":
        raise ValueError(f"{name!r} is not a name TRM's ARC builder writes (PUZZLE|||tT|||COLOURMAP)")
    return parts[0], Version(FROM_TRM[int(parts[1][1:])], tuple(int(c) for c in parts[2]))


def read_identifiers(path: str) -> tuple[dict[str, list[tuple[int, Version]]], int]:
    """TRM's identifiers.json (row i of a checkpoint's puzzle embedding is the i-th name; row 0 "<blank>"): each
    puzzle's (row, version) in the file's order, and the number of rows. ValueError naming the file and row for a
    file of another form."""
    try:
        names = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"task.identifiers={path!r} cannot be read as JSON ({type(e).__name__})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"task.identifiers={path!r} is not a JSON list of names (the identifiers.json TRM's "
                         "build_arc_dataset.py writes)")
    by_puzzle: dict[str, list[tuple[int, Version]]] = defaultdict(list)
    for row, name in enumerate(names):
        if row == 0 and name == "<blank>":
            continue
        try:
            pid, version = from_trm_name(name)
        except ValueError as e:
            raise ValueError(f"task.identifiers={path!r}, row {row}: {e}") from None
        by_puzzle[pid].append((row, version))
    return by_puzzle, len(names)
