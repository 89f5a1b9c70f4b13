"""Loop diagnostics (methods.md section 7): pure functions of a trajectory of per-update records, so each is
unit-testable on hand-built data: stability between two updates, gamma aligned to the solving update, content
score against wrong cells, residual / eta per update."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from study.config import EvalConfig
from study.rows import DynamicsRow


@dataclass
class Trajectory:
    """Per-update records over the evaluation set: preds (U, N, S), gamma / score (axis -> (U, N)),
    residual and eta (U, N). Update u is index u - 1."""

    preds: np.ndarray
    labels: np.ndarray
    free: np.ndarray  # (N, S) cells to be filled (sudoku blanks; every scored cell elsewhere)
    gamma: dict[str, np.ndarray] = field(default_factory=dict)
    score: dict[str, np.ndarray] = field(default_factory=dict)
    residual: np.ndarray | None = None
    eta: np.ndarray | None = None


def solved_and_wrong(traj: Trajectory) -> tuple[np.ndarray, np.ndarray]:
    """(U, N) solved flags and wrong-cell counts."""
    scored = traj.labels >= 0
    wrong = ((traj.preds != traj.labels[None]) & scored[None]).sum(-1)
    return wrong == 0, wrong


def stability(traj: Trajectory, u1: int, u2: int) -> dict[str, float]:
    """Between updates u1 and u2 (1-based): predictions changed per puzzle (summed over the updates in (u1, u2]),
    change in wrong cells, share of free cells right at u1 that are wrong at least once in (u1, u2], and share of
    puzzles solved at u1 that are unsolved at least once in (u1, u2]."""
    P = traj.preds[u1 - 1: u2]  # updates u1..u2
    solved, wrong = solved_and_wrong(traj)
    changed = (P[1:] != P[:-1]).sum((0, 2)).mean()
    right_u1 = (P[0] == traj.labels) & traj.free
    ever_wrong = ((P[1:] != traj.labels[None]).any(0)) & right_u1
    s1 = solved[u1 - 1]
    lost = (~solved[u1: u2]).any(0) & s1
    return {
        "changed": float(changed),
        "wrong_delta": float((wrong[u2 - 1] - wrong[u1 - 1]).mean()),
        "flipped": float(ever_wrong.sum() / max(right_u1.sum(), 1)),
        "lost": float(lost.sum() / max(s1.sum(), 1)),
        "n": int(len(traj.labels)),
    }


def pct(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if a.size else None


def dynamics_rows(traj: Trajectory, axes: list[str], cfg: EvalConfig) -> list[DynamicsRow]:
    rows: list[DynamicsRow] = []
    solved, wrong = solved_and_wrong(traj)
    U, N = solved.shape
    for axis in axes:
        g, s = traj.gamma.get(axis), traj.score.get(axis)
        for u in range(U):
            prev = traj.preds[u - 1] if u else None
            rows.append(DynamicsRow(
                kind="update", axis=axis, update=u + 1,
                gamma_mean=float(g[u].mean()) if g is not None else None,
                gamma_p10=pct(g[u], 10) if g is not None else None,
                gamma_p90=pct(g[u], 90) if g is not None else None,
                score_median=pct(s[u], 50) if s is not None else None,
                score_p25=pct(s[u], 25) if s is not None else None,
                score_p75=pct(s[u], 75) if s is not None else None,
                changed=float((traj.preds[u] != prev).sum(-1).mean()) if prev is not None else None,
                wrong_cells=float(wrong[u].mean()),
                wrong_delta=float((wrong[u] - wrong[u - 1]).mean()) if u else None,
                solved=float(solved[u].mean()),
                lost=float((solved[u - 1] & ~solved[u]).mean()) if u else None,
                residual_mean=float(np.nanmean(np.where(np.isfinite(traj.residual[u]), traj.residual[u], np.nan)))
                if traj.residual is not None and np.isfinite(traj.residual[u]).any() else None,
                eta_mean=float(traj.eta[u].mean()) if traj.eta is not None else None,
                n=N,
            ))
        if g is not None:
            rows += aligned_rows(g, solved, axis, cfg.align_window)
            rows += score_vs_wrong_rows(s, wrong, axis)
    if cfg.stability and cfg.stability[1] <= U:
        st = stability(traj, *cfg.stability)
        rows.append(DynamicsRow(kind="stability", axis=axes[0], update=cfg.stability[1],
                                from_update=cfg.stability[0], changed=st["changed"],
                                wrong_delta=st["wrong_delta"], flipped=st["flipped"], lost=st["lost"], n=st["n"]))
    return rows


def aligned_rows(gamma: np.ndarray, solved: np.ndarray, axis: str, window: int) -> list[DynamicsRow]:
    """Mean gamma at offsets -window..+window from each puzzle's first solving update (solved from update 2 on)."""
    U, N = solved.shape
    first = np.where(solved.any(0), solved.argmax(0), -1)
    rows = []
    for off in range(-window, window + 1):
        vals = [gamma[f + off, i] for i, f in enumerate(first) if f > 0 and 0 <= f + off < U]
        if vals:
            v = np.asarray(vals)
            rows.append(DynamicsRow(kind="aligned", axis=axis, offset=off, gamma_mean=float(v.mean()),
                                    gamma_p10=pct(v, 10), gamma_p90=pct(v, 90), n=len(vals)))
    return rows


def score_vs_wrong_rows(score: np.ndarray, wrong: np.ndarray, axis: str) -> list[DynamicsRow]:
    rows = []
    s, w = score.reshape(-1), wrong.reshape(-1)
    for k in np.unique(w):
        v = s[w == k]
        rows.append(DynamicsRow(kind="score_vs_wrong", axis=axis, wrong_cells=float(k), score_median=pct(v, 50),
                                score_p25=pct(v, 25), score_p75=pct(v, 75), n=int(v.size)))
    return rows
