"""One trial: build task and model, train, evaluate at depth, write every table's rows to the store.

The same function runs under `loopstudy trial` (no Ray) and inside the Ray Tune trainable (trainable.py). Rows go
straight to storage from here; only a few summary metrics travel back to the caller (and on to Tune).
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

import study
from study.config import TrialConfig, to_dict, trial_id
from study.evaluate import EvalResult, evaluate
from study.metrics import DEFAULT_METRIC, summary_metrics
from study.models.reasoner import build_reasoner
from study.preflight import preflight_trial
from study.store import Store, config_row, now_utc
from study.tasks.loader import load_task
from study.train import Trainer, TrainLog, seed_everything


@functools.cache
def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(study.__file__).parent,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class TrialRecorder:
    """Writes one trial's rows as it goes: the train_curve so far and a `running` trials row at every training log
    (so a trial that an early-stopping scheduler ends, or whose node dies, keeps what it did), then every table and
    a `complete` trials row, that row last (study.rows.STATUSES)."""

    def __init__(self, store: Store | None, study_name: str, cfg: TrialConfig, model, *, node: str | None,
                 spec_hash: str | None):
        self.store, self.study_name, self.tid = store, study_name, trial_id(cfg)
        self.started, self.t0 = now_utc(), time.perf_counter()
        self.fixed = {**config_row(to_dict(cfg)), "params": sum(p.numel() for p in model.parameters()),
                      "started": self.started, "device": device_name(cfg.train.device),
                      "package_version": study.__version__, "git_commit": git_commit(), "node": node,
                      "spec_hash": spec_hash}

    def _trials_row(self, status: str, step: int | None, objective: float | None, **extra) -> None:
        self.store.write("trials", self.study_name, self.tid, [{
            **self.fixed, "status": status, "ended": now_utc() if status != "running" else None,
            "wall_s": time.perf_counter() - self.t0, "step": step, "objective": objective, **extra}])

    def progress(self, history: list[TrainLog]) -> None:
        """After a training log: the curve so far, and where the trial is."""
        if self.store is None or not history:
            return
        self.store.write("train_curve", self.study_name, self.tid, [vars(h) for h in history])
        self._trials_row("running", history[-1].step, history[-1].cell_acc)  # the objective ASHA sees

    def complete(self, history: list[TrainLog], result: EvalResult, metrics: dict[str, float], metric: str) -> None:
        if self.store is None:
            return
        for table, rows in (("train_curve", [vars(h) for h in history]),
                            ("depth_eval", [dataclasses.asdict(r) for r in result.depth]),
                            ("dynamics", [dataclasses.asdict(r) for r in result.dynamics]),
                            ("perturbation", [dataclasses.asdict(r) for r in result.perturbation])):
            self.store.write(table, self.study_name, self.tid, rows)
        # the trials row goes last: status=complete is what marks the trial's results as complete
        self._trials_row("complete", history[-1].step if history else 0, metrics.get(metric), **metrics)


def run_trial(
    cfg: TrialConfig,
    *,
    study_name: str = "adhoc",
    store: Store | None = None,
    on_log: Callable[[TrainLog], None] | None = None,
    checkpoint: Callable[[Trainer], None] | None = None,
    resume: Callable[[Trainer], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_eval_progress: Callable[[int, int], None] | None = None,
    node: str | None = None,
    metric: str = DEFAULT_METRIC,
    spec_hash: str | None = None,
) -> tuple[dict[str, float], EvalResult]:
    """Train and evaluate one configuration; returns (summary metrics, evaluation rows).

    checkpoint(trainer) is called every train.checkpoint_every batches; resume(trainer) may load a checkpoint
    into the fresh trainer before training starts; on_eval_progress(done, total) follows the evaluation's steps.
    With a store, rows are written as the trial goes (TrialRecorder) before on_log sees each log. metric: the
    study's objective (sweep.optuna.metric); spec_hash: the spec version the trial runs under.
    """
    preflight_trial(cfg, store)
    seed_everything(cfg.seed)
    task = load_task(cfg.task)
    spec = task.spec
    model = build_reasoner(cfg.model, spec.vocab, spec.seq_len, spec.grid, spec.puzzles)
    trainer = Trainer(model, task, cfg.train, cfg.seed)
    recorder = TrialRecorder(store, study_name, cfg, model, node=node, spec_hash=spec_hash)
    if resume is not None:
        resume(trainer)
    if on_phase:
        on_phase(f"data: {task.source}")
        on_phase(f"training {recorder.tid}: {recorder.fixed['params']:,} parameters, {cfg.train.steps} steps")

    def logged(log: TrainLog) -> None:
        recorder.progress(trainer.history)
        if on_log is not None:
            on_log(log)

    history = trainer.fit(on_log=logged, checkpoint=checkpoint)
    if on_phase:
        on_phase("evaluating")
    result = evaluate(trainer.eval_model(), task, cfg.eval, cfg.train.device, on_progress=on_eval_progress,
                      dtype=cfg.train.dtype)
    metrics = summary_metrics(result.depth, history[-1].loss if history else None)
    recorder.complete(history, result, metrics, metric)
    return metrics, result


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"
