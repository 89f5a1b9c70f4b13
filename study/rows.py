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

    step: int  # optimizer steps so far
    loss: float  # mean training loss over the batch's updates
    cell_acc: float  # the training batch's cell accuracy
    exact_acc: float  # the training batch's exact accuracy
    lr: float  # learning rate at the last step
    seconds: float  # wall seconds of the batch


@dataclass
class DepthRow:
    """Accuracy at one test-time depth (table depth_eval); difficulty None: all samples. n, exact_acc and cell_acc
    count the rolled-out samples (for ARC: every augmented version of a test input)."""

    depth_layers: int  # executed layers of the reading (its test-time depth)
    outer_cycles: int  # outer cycles (nested) or iterations (flat) at that depth
    difficulty: int | None  # null: every sample; else one difficulty (blanks, path length, string length)
    n: int  # samples read
    exact_acc: float  # share of samples with every cell right
    cell_acc: float  # share of scored cells right
    halted_frac: float  # share of samples that had halted by then
    eff_layers: float  # mean layers each sample actually executed
    # test-time cost per sample up to this depth (study.evaluate.compute): FLOPs over the steps each sample ran,
    # and the rollouts' wall seconds over the samples they rolled out (None in rows stored before they were counted)
    flops: float | None = None
    rollout_s: float | None = None  # (see flops above)
    # ARC (a task with TaskDef.vote; None for the others): answers pooled over augmented versions, ranked by votes
    # (methods.md 8.5); per test input, and per puzzle as the papers count it
    pass_at_1: float | None = None
    pass_at_2: float | None = None  # ARC: per test input, one of the top two right
    puzzle_pass_at_1: float | None = None  # ARC: per puzzle (every test input), as the papers count
    puzzle_pass_at_2: float | None = None  # ARC: pass@2 per puzzle, the papers' headline


# DepthRow's wall-clock columns: they differ from run to run, so two readings of one model compare without them
DEPTH_WALL_CLOCK = ("rollout_s",)


@dataclass
class DynamicsRow:
    """Loop dynamics (table dynamics). kind: 'update' (per update), 'stability' (u1 -> u2 summary; update = u2,
    from_update = u1), 'aligned' (gamma around the solving update; offset), 'score_vs_wrong' (score by wrong
    cells)."""

    kind: str  # update, stability, aligned or score_vs_wrong
    axis: str  # outer, inner (or none)
    update: int | None = None  # the update (deep-supervision step) the row is about
    from_update: int | None = None  # stability: the earlier update u1
    offset: int | None = None  # aligned: updates relative to the solving update
    wrong_cells: float | None = None  # score_vs_wrong: wrong cells
    gamma_mean: float | None = None  # InfiLoop's step size gamma_t, mean
    gamma_p10: float | None = None  # gamma_t, 10th percentile
    gamma_p90: float | None = None  # gamma_t, 90th percentile
    score_median: float | None = None  # InfiLoop's content score s_t, median
    score_p25: float | None = None  # s_t, 25th percentile
    score_p75: float | None = None  # s_t, 75th percentile
    changed: float | None = None  # stability: share of predictions changed from u1 to u2
    wrong_delta: float | None = None  # stability: change in wrong cells
    flipped: float | None = None  # stability: cells that changed
    solved: float | None = None  # share of samples solved at the update
    lost: float | None = None  # stability: share solved at u1 and not at u2
    residual_mean: float | None = None  # mean relative fixed-point residual
    eta_mean: float | None = None  # FPOpt's mean damping eta
    n: int = 0  # samples behind the row


@dataclass
class PerturbationRow:
    """Recovery after a perturbation of relative size eps at an update (table perturbation)."""

    eps: float  # the perturbation's size relative to the state
    update: int  # the update at which the state was perturbed
    updates_after: int  # updates run since the perturbation
    n_solved: int  # samples solved at the perturbed update
    solved_kept: float | None  # None when no puzzle was solved at the perturbed update
    rel_distance: float  # distance to the unperturbed rollout's state, relative to its norm


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

    status: str  # running, stopped, failed or complete
    params: int  # the model's parameter count
    started: datetime  # when the trial started (UTC)
    ended: datetime | None  # when it ended (UTC)
    wall_s: float  # wall seconds from start to end
    device: str  # where it trained (cpu, cuda:0, ...)
    package_version: str  # loopstudy's version
    git_commit: str | None  # the code's commit, when known
    node: str | None  # the Ray node it ran on
    step: int | None = None
    objective: float | None = None
    spec_hash: str | None = None
    # Train once, read many (study.run.plan): every row says which evaluation of which weights it is. eval_id:
    # hash of the eval section; weights_of: the trial whose stored weights it read (None: its own training);
    # weights_step: the training step of the weights it read. A trained trial keeps its final weights (sha256,
    # bytes) and, with train.keep_checkpoints, weights along training (checkpoints: JSON {step: sha256}).
    eval_id: str | None = None
    weights_of: str | None = None  # the trial whose stored weights this reading read (null: its own training)
    weights_step: int | None = None  # the training step of the weights read
    weights_sha256: str | None = None  # sha256 of the stored final weights
    weights_bytes: int | None = None  # size of the stored final weights
    checkpoints: str | None = None  # weights kept along training: JSON {step: sha256}
    workers: int | None = None  # data-parallel workers that trained it (resources.workers; a reading: 1)
    init_sha256: str | None = None  # sha256 of the weights model.init_from started it from


# table name -> the row dataclass of its measured rows (the trials table is TrialRecord + metrics + config)
ROWS: dict[str, type] = {"train_curve": TrainLog, "depth_eval": DepthRow, "dynamics": DynamicsRow,
                         "perturbation": PerturbationRow}
