"""The rows every trial stores, one dataclass per results table: the one definition of each table's columns.

The store builds its Parquet schemas from these fields (study.store.schema); training and evaluation fill them.
Torch-free, so readers of the store never import a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass
class TrainLog:
    """One logged training step (table train_curve)."""

    step: int
    loss: float
    cell_acc: float
    exact_acc: float
    lr: float
    seconds: float


@dataclass
class DepthRow:
    """Accuracy at one test-time depth (table depth_eval); difficulty None: all samples. n, exact_acc and cell_acc
    count the rolled-out samples (for ARC: every augmented version of a test input)."""

    depth_layers: int
    outer_cycles: int
    difficulty: int | None
    n: int
    exact_acc: float
    cell_acc: float
    halted_frac: float
    eff_layers: float
    # test-time cost per sample up to this depth (study.evaluate.compute): FLOPs over the steps each sample ran,
    # and the rollouts' wall seconds over the samples they rolled out (None in rows stored before they were counted)
    flops: float | None = None
    rollout_s: float | None = None
    # ARC (a task with TaskDef.vote; None for the others): answers pooled over augmented versions, ranked by votes
    # (methods.md 8.5); per test input, and per puzzle as the papers count it
    pass_at_1: float | None = None
    pass_at_2: float | None = None
    puzzle_pass_at_1: float | None = None
    puzzle_pass_at_2: float | None = None


@dataclass
class DynamicsRow:
    """Loop dynamics (table dynamics). kind: 'update' (per update), 'stability' (u1 -> u2 summary; update = u2,
    from_update = u1), 'aligned' (gamma around the solving update; offset), 'score_vs_wrong' (score by wrong
    cells)."""

    kind: str
    axis: str
    update: int | None = None
    from_update: int | None = None
    offset: int | None = None
    wrong_cells: float | None = None
    gamma_mean: float | None = None
    gamma_p10: float | None = None
    gamma_p90: float | None = None
    score_median: float | None = None
    score_p25: float | None = None
    score_p75: float | None = None
    changed: float | None = None
    wrong_delta: float | None = None
    flipped: float | None = None
    solved: float | None = None
    lost: float | None = None
    residual_mean: float | None = None
    eta_mean: float | None = None
    n: int = 0


@dataclass
class PerturbationRow:
    """Recovery after a perturbation of relative size eps at an update (table perturbation)."""

    eps: float
    update: int
    updates_after: int
    n_solved: int
    solved_kept: float | None  # None when no puzzle was solved at the perturbed update
    rel_distance: float


# A trial's life as its trials row tells it: `running` while it trains (rewritten at every training log, with the
# train_curve so far), then `complete` (every table written, this row last), `stopped` (an early-stopping scheduler
# ended it: what it did stays) or `failed`. Only complete trials enter tables and figures.
STATUSES = ("running", "stopped", "failed", "complete")


@dataclass
class TrialRecord:
    """What the trials table holds about a run besides its config columns and summary metrics
    (study.metrics.METRICS). step: the last training step it reached; objective: the last value the scheduler and
    searcher saw (training accuracy while it trains, the study's metric once complete). spec_hash: the version of
    the study spec it ran under (study membership)."""

    status: str
    params: int
    started: datetime
    ended: datetime | None
    wall_s: float
    device: str
    package_version: str
    git_commit: str | None
    node: str | None
    step: int | None = None
    objective: float | None = None
    spec_hash: str | None = None
    # Train once, read many (study.run.plan): every row says which evaluation of which weights it is. eval_id:
    # hash of the eval section; weights_of: the trial whose stored weights it read (None: its own training);
    # weights_step: the training step of the weights it read. A trained trial keeps its final weights (sha256,
    # bytes) and, with train.keep_checkpoints, weights along training (checkpoints: JSON {step: sha256}).
    eval_id: str | None = None
    weights_of: str | None = None
    weights_step: int | None = None
    weights_sha256: str | None = None
    weights_bytes: int | None = None
    checkpoints: str | None = None


# table name -> the row dataclass of its measured rows (the trials table is TrialRecord + metrics + config)
ROWS: dict[str, type] = {"train_curve": TrainLog, "depth_eval": DepthRow, "dynamics": DynamicsRow,
                         "perturbation": PerturbationRow}
