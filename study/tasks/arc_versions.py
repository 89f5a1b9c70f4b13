"""ARC's augmentations (methods.md section 8.5): the 8 dihedral transforms of a grid and the permutations of colours
1..9 (0 fixed); a Version is one of each, applied to a puzzle's grids and inverted on a prediction."""

from __future__ import annotations

from dataclasses import dataclass

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
