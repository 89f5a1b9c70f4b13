"""One batch's rollout at test time: a single Reasoner.rollout to the deepest target, with every prediction a
RolloutPlan names taken as the rollout passes it (methods.md section 6), never re-run from scratch per depth."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from study.evaluate.compute import RolloutFlops
from study.models.reasoner import LoopState, Reasoner
from study.tasks import Split


def infiloop_axes(model: Reasoner) -> list[str]:
    return [axis for axis in ("outer", "inner") if getattr(getattr(model, f"carry_{axis}", None), "name", "")
            == "infiloop"]


def axis_state(state: LoopState, axis: str):
    return state.outer if axis == "outer" else state.inner


@dataclass
class RolloutPlan:
    """What one evaluation reads along each batch's rollout: step -> depth prediction, the updates whose predictions
    and loop statistics make the trajectory, and the update at which the state is snapshot for perturbation."""

    total_steps: int
    target_steps: dict[int, int]  # step -> depth_layers
    H: int
    last_update: int
    axes: list[str]
    perturb_step: int | None
    perturb_n: int
    readout: str = "last"  # eval.readout: what a depth prediction scores
    pad: int | None = None  # the task's padding token: trailing all-padding columns are not rolled out


class DepthPrediction(NamedTuple):
    """A depth prediction of one batch: per sample the prediction (B, S), whether it had halted, its executed layers,
    its confidence (mean over cells of the top probability: what breaks ties between pooled answers) and its FLOPs
    (study.evaluate.compute; None when not counted); and the batch's wall seconds from the start of its rollout."""

    pred: np.ndarray
    halted: np.ndarray
    eff_layers: np.ndarray
    conf: np.ndarray
    flops: np.ndarray | None = None
    seconds: float | None = None


@dataclass
class BatchRollout:
    """One batch's rollout: a DepthPrediction per target depth, the trajectory parts and the perturbation snapshot."""

    predictions: dict[int, DepthPrediction]
    part: dict[str, np.ndarray]
    snapshot: tuple[LoopState, torch.Tensor, Split] | None


class _StepRecorder:
    """Called by Reasoner.rollout after every step: takes the predictions the plan names at that step."""

    def __init__(self, model: Reasoner, batch: Split, tokens: torch.Tensor, plan: RolloutPlan, width: int,
                 on_step: Callable[[int], None] | None, flops: RolloutFlops | None):
        self.model, self.batch, self.tokens, self.plan, self.width, self.on_step, self.flops = \
            model, batch, tokens, plan, width, on_step, flops
        self.started = time.perf_counter()
        self.real = (tokens != plan.pad) if plan.pad is not None else torch.ones_like(tokens, dtype=torch.bool)
        self.best_conf = torch.full((len(batch),), -1.0, device=tokens.device)
        self.best_pred = torch.zeros_like(tokens)
        self.predictions: dict[int, DepthPrediction] = {}
        self.part: dict[str, list] = {"preds": [], "residual": [], "eta": [],
                                      **{f"{k}_{a}": [] for a in plan.axes for k in ("gamma", "score")}}
        self.snapshot: tuple | None = None
        self.step = 0

    def full(self, pred: np.ndarray) -> np.ndarray:
        """Predictions back at the batch's full width (cut padding columns are never scored)."""
        return pred if pred.shape[1] == self.width else np.pad(pred, ((0, 0), (0, self.width - pred.shape[1])))

    def __call__(self, state: LoopState) -> None:
        plan = self.plan
        self.step += 1
        if self.on_step is not None:
            self.on_step(self.step)
        target = self.step in plan.target_steps
        traced = self.step % plan.H == 0 and self.step // plan.H <= plan.last_update
        # once per step, for every prediction below (none on steps nothing reads)
        logits = self.model.logits(state) if target or traced or plan.readout == "max_conf" else None
        if plan.readout == "max_conf":
            self.track_confidence(logits)
        if target:
            # (a copy: on the CPU .numpy() shares memory, and best_pred changes in place afterwards)
            pred = self.best_pred.clone() if plan.readout == "max_conf" else logits.argmax(-1)
            conf = self.best_conf.clone() if plan.readout == "max_conf" else self.confidence(logits)
            # int16 (every vocab fits): a prediction per depth of every test row is held until the table is built
            eff = state.halt.eff_layers.cpu().numpy()
            flops = self.flops.per_sample(self.tokens, eff // self.model.layers_per_step) if self.flops else None
            self.predictions[plan.target_steps[self.step]] = DepthPrediction(
                self.full(pred.to(torch.int16).cpu().numpy()), state.halt.halted.cpu().numpy(),
                eff.astype(np.float32), conf.float().cpu().numpy(), flops, time.perf_counter() - self.started)
        if traced:
            self.trace(state, logits)
        if plan.perturb_step is not None and self.step == plan.perturb_step:
            k = min(plan.perturb_n, len(self.batch))
            x = self.model.embed(self.tokens)  # the rollout's input injection, recomputed (deterministic)
            self.snapshot = (state.map(lambda t: t[:k].clone()), x[:k], self.batch.take(slice(0, k)))

    def track_confidence(self, logits: torch.Tensor) -> None:
        """eval.readout max_conf: per sample, the prediction of the most confident step so far."""
        probs = logits.float().softmax(-1)
        conf = self.confidence(logits, probs)
        better = conf > self.best_conf  # strictly: the earliest of equally confident steps
        self.best_conf.copy_(torch.where(better, conf, self.best_conf))
        self.best_pred.copy_(torch.where(better[:, None], probs.argmax(-1), self.best_pred))

    def confidence(self, logits: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
        """Per sample: the mean over its cells (padding left out) of the top probability."""
        probs = logits.float().softmax(-1) if probs is None else probs
        return (probs.amax(-1) * self.real).sum(1) / self.real.sum(1).clamp_min(1)

    def trace(self, state: LoopState, logits: torch.Tensor) -> None:
        """The per-update trajectory the diagnostics read: predictions, residual, eta, InfiLoop's gamma / score."""
        self.part["preds"].append(self.full(logits.argmax(-1).to(torch.int16).cpu().numpy()))
        self.part["residual"].append(state.halt.residual.float().cpu().numpy())  # float: bf16 has no numpy
        self.part["eta"].append(state.halt.eta.float().cpu().numpy())
        for a in self.plan.axes:
            aux = axis_state(state, a).aux
            self.part[f"gamma_{a}"].append(aux["gamma"].float().mean((1, 2)).cpu().numpy())
            self.part[f"score_{a}"].append(aux["score"].float().flatten(1).median(1).values.cpu().numpy())


def rollout_batch(model: Reasoner, batch: Split, plan: RolloutPlan, device: str,
                  on_step: Callable[[int], None] | None = None, flops: RolloutFlops | None = None) -> BatchRollout:
    """Roll one batch out to plan.total_steps (Reasoner.rollout) and take every prediction the plan asks for.

    Columns that are padding in every sample (a batch of short strings in a test set padded to its longest) are
    cut before the rollout, so a model without positions sees each string as it would alone; predictions come
    back at full width (padding is never scored). With readout max_conf each prediction is, per sample, the
    prediction of the most confident step so far; the trajectory (the dynamics) keeps every step's own. With
    `flops`, every depth prediction carries each sample's FLOPs up to it.
    """
    width = batch.inputs.shape[1]
    if plan.pad is not None:
        cut = max(1, int(input_widths(batch.inputs, plan.pad).max()))
        batch = Split(batch.inputs[:, :cut], batch.labels[:, :cut], batch.difficulty)
    tokens = torch.as_tensor(batch.inputs, device=device)
    if flops is not None:
        flops.counts(tokens)  # counted before the clock starts
    recorder = _StepRecorder(model, batch, tokens, plan, width, on_step, flops)
    model.rollout(tokens, plan.total_steps, on_step=recorder)
    return BatchRollout(recorder.predictions, {k: np.stack(v, 0) for k, v in recorder.part.items() if v},
                         recorder.snapshot)


def input_widths(inputs: np.ndarray, pad: int) -> np.ndarray:
    """Per sample, the columns up to its last token that is not padding (0 for an all-padding row)."""
    used = inputs != pad
    return np.where(used.any(1), used.shape[1] - np.argmax(used[:, ::-1], axis=1), 0)


def batch_slices(data: Split, batch_size: int, pad: int | None) -> list[slice]:
    """Consecutive batches of at most batch_size samples. For a padded task a batch never spans two input widths
    (a test set ordered by length): with the trailing padding cut, every string is then read at its own length,
    as it would be alone, never beside padding it did not see in training."""
    if pad is None:
        return [slice(s, min(s + batch_size, len(data))) for s in range(0, len(data), batch_size)]
    cuts = [0, *(np.flatnonzero(np.diff(input_widths(data.inputs, pad))) + 1).tolist(), len(data)]
    return [slice(s, min(s + batch_size, hi)) for lo, hi in zip(cuts, cuts[1:]) for s in range(lo, hi, batch_size)]
