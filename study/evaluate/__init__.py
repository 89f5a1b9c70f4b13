"""Evaluation at test-time depth (methods.md sections 6-7): `evaluate(model, task, cfg) -> EvalResult`.

One rollout per batch to the deepest target, with a prediction each time the rollout passes a target depth
(`rollout`); per update along the way, the records the diagnostics read (`diagnostics`); and the perturbation test
from a snapshot of the first batch (`perturbation`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from study.config import EvalConfig
from study.evaluate.compute import RolloutFlops
from study.evaluate.diagnostics import Trajectory, dynamics_rows, stability
from study.evaluate.perturbation import perturbation_rows
from study.evaluate.rollout import (
    BatchRollout,
    DepthPrediction,
    RolloutPlan,
    batch_slices,
    infiloop_axes,
    rollout_batch,
)
from study.models.precision import reading_model
from study.models.reasoner import Reasoner, build_reasoner
from study.rows import DepthRow, DynamicsRow, PerturbationRow
from study.tasks import TASKS, Split, accuracies
from study.tasks.loader import Task

__all__ = ["BatchRollout", "DepthRow", "DynamicsRow", "EvalResult", "PerturbationRow", "DepthPrediction", "RolloutPlan",
           "Trajectory", "batch_slices", "dynamics_rows", "evaluate", "rollout_batch", "stability"]


class Workers(Protocol):
    """A worker's place among several that share an evaluation (study.trial.data_parallel.DataParallel is one)."""

    rank: int
    world: int

    def gather(self, obj: Any) -> list[Any] | None:
        """Every worker's obj in rank order on rank 0; None on the others."""


@dataclass
class EvalResult:
    depth: list[DepthRow]
    dynamics: list[DynamicsRow]
    perturbation: list[PerturbationRow]


def evaluated_model(model: Reasoner, task: Task, cfg: EvalConfig, device: str) -> Reasoner:
    """The model the evaluation runs: the trained weights under eval's cycle counts / halting (a new module only
    when they differ), on `device`."""
    mcfg = cfg.model_config(model.cfg)
    if mcfg != model.cfg:
        spec = task.spec
        evm = build_reasoner(mcfg, spec)
        evm.load_state_dict(model.state_dict())
        model = evm
    return model.to(device).eval()


def compiled(model: Reasoner, device: str) -> Reasoner:
    """The model with its step compiled (eval.compile), on a shallow copy, so the caller's model keeps its own."""
    model = copy.copy(model)
    model.step = torch.compile(model.step, mode="reduce-overhead" if device.startswith("cuda") else None)
    return model


def make_plan(model: Reasoner, cfg: EvalConfig, pad: int | None) -> RolloutPlan:
    """What every batch's rollout reads: each target depth's step, the updates the dynamics trace (at least one,
    and through eval.stability's u2), the perturbation snapshot's step."""
    mcfg = model.cfg
    target_steps = {mcfg.steps_for_depth(d): d for d in cfg.resolved_depths(mcfg)}
    H = mcfg.H
    last_update = max(1, max(target_steps) // H, cfg.stability[1] if cfg.stability else 0)
    return RolloutPlan(total_steps=max(max(target_steps), last_update * H), target_steps=target_steps, H=H,
                       last_update=last_update, axes=infiloop_axes(model),
                       perturb_step=cfg.perturb_update * H if cfg.perturb_update else None, perturb_n=cfg.perturb_n,
                       readout=cfg.readout, pad=pad)


@torch.no_grad()
def evaluate(model: Reasoner, task: Task, cfg: EvalConfig, device: str = "cpu",
             on_progress: Callable[[int, int], None] | None = None, dtype: str = "fp32",
             parallel: Workers | None = None) -> EvalResult | None:
    """Predictions at every target depth from one rollout per batch, plus the diagnostics.

    on_progress(done, total) is called after every step, counting steps over all batches (a rollout to 24,960
    layers is minutes on a CPU: callers turn this into progress reports). dtype 'bf16' runs the rollouts in bf16
    as TRM runs its forward (study.models.precision; the trial's eval.dtype, by default its train.dtype).
    parallel (several workers, study.trial.data_parallel): this worker rolls out every world-th batch, and rank 0
    gathers the others' and returns the result one worker would (the same batches, merged in order; only wall
    seconds differ); the other workers return None.
    """
    model = reading_model(evaluated_model(model, task, cfg, device), device, dtype)
    flops = RolloutFlops(model)  # counted on the eager model: the flop counter does not trace a compiled step
    if cfg.compile:
        model = compiled(model, device)
    plan = make_plan(model, cfg, task.spec.pad)
    data = task.test if cfg.n_test is None else task.test.take(slice(0, cfg.n_test))
    batches = batch_slices(data, cfg.batch_size, task.spec.pad)
    mine = range(parallel.rank, len(batches), parallel.world) if parallel is not None else range(len(batches))
    later = dataclasses.replace(plan, perturb_step=None)  # the perturbation test uses the first batch only
    got: list[BatchRollout] = []
    for i, b in enumerate(mine):
        def progress(step: int, i: int = i) -> None:
            on_progress(i * plan.total_steps + step, len(mine) * plan.total_steps)

        got.append(rollout_batch(model, data.take(batches[b]), plan if b == 0 else later, device,
                                 progress if on_progress is not None else None, flops))
    if parallel is not None:
        shares = parallel.gather(got)  # batch 0 (its snapshot holds tensors) is rank 0's own
        if shares is None:
            return None
        got = [shares[b % parallel.world][b // parallel.world] for b in range(len(batches))]
    vote = TASKS[task.cfg.name].vote
    depth_rows = depth_table({d: [g.predictions[d] for g in got] for d in plan.target_steps.values()}, data,
                             plan.target_steps,
                             (lambda pred, conf: vote(task.cfg, pred, conf, data.difficulty)) if vote else None)
    traj = trajectory([g.part for g in got], data, TASKS[task.cfg.name].free_cells(data), plan.axes)
    dynamics = dynamics_rows(traj, plan.axes or ["none"], cfg)
    perturbation = []
    if got[0].snapshot is not None:
        perturbation = perturbation_rows(model, *got[0].snapshot, cfg)
    return EvalResult(depth_rows, dynamics, perturbation)


def trajectory(parts: list[dict[str, np.ndarray]], data: Split, free: np.ndarray, axes: list[str]) -> Trajectory:
    """The batches' per-update records joined over the evaluation set."""
    def joined(key: str) -> np.ndarray:
        return np.concatenate([p[key] for p in parts], 1)

    return Trajectory(preds=joined("preds"), labels=data.labels, free=free,
                      gamma={a: joined(f"gamma_{a}") for a in axes}, score={a: joined(f"score_{a}") for a in axes},
                      residual=joined("residual"), eta=joined("eta"))


def depth_table(predictions: dict[int, list[DepthPrediction]], data: Split, target_steps: dict[int, int],
                score: Callable[[np.ndarray, np.ndarray], dict] | None = None) -> list[DepthRow]:
    """One row per depth for all samples and one per difficulty: accuracy, halted share, executed layers, FLOPs per
    sample and the rollouts' wall seconds per sample up to the depth (every batch's time over every sample: a batch
    is timed as a whole, so a difficulty's row has the set's figure); with a task that pools answers
    (TaskDef.vote), `score(pred, conf)` adds its pass@k columns to each row."""
    rows = []
    steps_of = {d: s for s, d in target_steps.items()}
    for depth, parts in predictions.items():
        pred = np.concatenate([p.pred for p in parts])
        halted = np.concatenate([p.halted for p in parts])
        eff = np.concatenate([p.eff_layers for p in parts])
        flops = np.concatenate([p.flops for p in parts]) if all(p.flops is not None for p in parts) else None
        seconds = [p.seconds for p in parts]
        rollout_s = sum(seconds) / len(pred) if None not in seconds else None
        pooled = score(pred, np.concatenate([p.conf for p in parts])) if score else {}
        exact, cell = accuracies(pred, data.labels)
        cycles = steps_of[depth]  # outer cycles (nested) or iterations (flat)
        groups = [(None, np.ones(len(pred), bool))]
        groups += [(int(d), data.difficulty == d) for d in np.unique(data.difficulty)]
        for diff, m in groups:
            rows.append(DepthRow(depth, cycles, diff, int(m.sum()), float(exact[m].mean()), float(cell[m].mean()),
                                 float(halted[m].mean()), float(eff[m].mean()),
                                 flops=float(flops[m].mean()) if flops is not None else None, rollout_s=rollout_s,
                                 **pooled.get(diff, {})))
    return rows
