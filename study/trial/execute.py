"""One trial: build task and model, train, evaluate at depth, write every table's rows to the store.

The same function runs under `loopstudy trial` (no Ray) and inside the Ray Tune trainable (study.run.trainable).
Rows go straight to storage from here; only a few summary metrics travel back to the caller (and on to Tune).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import study
from study.config import TrialConfig, eval_id, to_dict, trial_id
from study.errors import StoreError
from study.evaluate import EvalResult, evaluate
from study.metrics import DEFAULT_METRIC, summary_metrics
from study.models.reasoner import build_reasoner
from study.store import Store, config_row, now_utc
from study.tasks.loader import load_task
from study.trial.data_parallel import DataParallel
from study.trial.heap import keep_freed_memory
from study.trial.preflight import preflight_trial
from study.trial.start import load_start
from study.trial.train import Trainer, TrainLog, seed_everything
from study.trial.weights import StoredWeights, load_weights, save_weights
from study.trial.work import Reading, kept_steps


@dataclass(frozen=True)
class TrialContext:
    """Where a trial's rows go and what it runs under: the store (None: nothing is read or written; see writes),
    the study, the Ray node it runs on, the study's objective (sweep.optuna.metric), the spec version (spec_hash)
    and the data-parallel workers that train and evaluate it (resources.workers)."""

    store: Store | None = None
    study_name: str = "adhoc"
    node: str | None = None
    metric: str = DEFAULT_METRIC
    spec_hash: str | None = None
    workers: int = 1
    writes: bool = True  # False: read the store, never write it (the workers beside rank 0 of a trial)


@dataclass(frozen=True)
class TrialHooks:
    """What the caller hears from a trial and may do to it (Tune's session, or `loopstudy trial`'s lines); each is
    optional. on_log(log) after every training log; checkpoint(trainer) every train.checkpoint_every batches;
    resume(trainer) may load a checkpoint into the fresh trainer before training starts; on_phase(message) at each
    phase; on_eval_progress(done, total) follows the evaluation's steps."""

    on_log: Callable[[TrainLog], None] | None = None
    checkpoint: Callable[[Trainer], None] | None = None
    resume: Callable[[Trainer], None] | None = None
    on_phase: Callable[[str], None] | None = None
    on_eval_progress: Callable[[int, int], None] | None = None

    def say(self, message: str) -> None:
        if self.on_phase is not None:
            self.on_phase(message)


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
    a `complete` trials row, that row last (study.rows.STATUSES). An evaluation of stored weights
    (study.run.plan) is recorded the same way, as a trial of its own (tid, weights_of) with no training."""

    def __init__(self, context: TrialContext, cfg: TrialConfig, model, *, tid: str | None = None,
                 weights_of: str | None = None):
        self.store = context.store if context.writes else None
        self.study_name, self.tid = context.study_name, tid or trial_id(cfg)
        node, spec_hash = context.node, context.spec_hash
        self.cfg = cfg
        self.started, self.t0 = now_utc(), time.perf_counter()
        self.fixed = {**config_row(to_dict(cfg)), "params": sum(p.numel() for p in model.parameters()),
                      "started": self.started, "device": device_name(cfg.train.device),
                      "package_version": study.__version__, "git_commit": git_commit(), "node": node,
                      "spec_hash": spec_hash, "eval_id": eval_id(cfg), "weights_of": weights_of,
                      "workers": context.workers}
        self.kept: dict[int, str] = {}  # training step -> sha256 of the weights kept there
        self.weights: StoredWeights | None = None  # the final weights, once stored

    def _trials_row(self, status: str, step: int | None, objective: float | None, **extra) -> None:
        weights = {"weights_sha256": self.weights.sha256, "weights_bytes": self.weights.bytes} if self.weights else {}
        self.store.write("trials", self.study_name, self.tid, [{
            **self.fixed, "status": status, "ended": now_utc() if status != "running" else None,
            "wall_s": time.perf_counter() - self.t0, "step": step, "objective": objective,
            "checkpoints": json.dumps(self.kept) if self.kept else None, **weights, **extra}])

    def resumed(self, step: int) -> None:
        """After a resume from a checkpoint at `step` (0: none): the weights kept before it, as the earlier
        attempt's row says (their files are in the store)."""
        row = self.store.trial_row(self.study_name, self.tid) if self.store is not None and step else None
        self.kept = {k: v for k, v in kept_steps(row or {}).items() if k <= step}

    def store_weights(self, model, step: int) -> None:
        """Store the final weights the trial is evaluated with (study.trial.weights); its rows will name their hash."""
        if self.store is not None:
            self.weights = save_weights(self.store, self.study_name, self.tid, self.cfg, model.state_dict(), step,
                                        final=True)

    def keep(self, trainer: Trainer) -> None:
        """Store the weights a checkpoint is evaluated with (the EMA copy) at the trainer's step."""
        stored = save_weights(self.store, self.study_name, self.tid, self.cfg, trainer.ema.shadow, trainer.step,
                              final=False)
        self.kept[trainer.step] = stored.sha256

    def progress(self, history: list[TrainLog]) -> None:
        """After a training log: the curve so far, and where the trial is."""
        if self.store is None or not history:
            return
        self.store.write("train_curve", self.study_name, self.tid, [vars(h) for h in history])
        self._trials_row("running", history[-1].step, history[-1].cell_acc)  # the objective ASHA sees

    def complete(self, history: list[TrainLog], result: EvalResult, metrics: dict[str, float], metric: str,
                 step: int) -> None:
        """Every table, then the `complete` trials row; step: the training step of the weights evaluated."""
        if self.store is None:
            return
        for table, rows in (("train_curve", [vars(h) for h in history]),
                            ("depth_eval", [dataclasses.asdict(r) for r in result.depth]),
                            ("dynamics", [dataclasses.asdict(r) for r in result.dynamics]),
                            ("perturbation", [dataclasses.asdict(r) for r in result.perturbation])):
            self.store.write(table, self.study_name, self.tid, rows)
        # the trials row goes last: status=complete is what marks the trial's results as complete
        self._trials_row("complete", step, metrics.get(metric), weights_step=step, **metrics)


def run_trial(cfg: TrialConfig, *, context: TrialContext = TrialContext(), hooks: TrialHooks = TrialHooks(),
              readings: Sequence[Reading] = (), parallel: DataParallel | None = None
              ) -> tuple[dict[str, float], EvalResult | None]:
    """Train and evaluate one configuration; returns (summary metrics, evaluation rows).

    With a store in the context, rows are written as the trial goes (TrialRecorder) before hooks.on_log sees each
    log, and the final weights (every train.keep_checkpoints-th checkpoint's too) are stored (study.trial.weights).
    readings: other evaluations of the same weights (configs differing in eval.* keys only), each stored as its own
    trial. parallel: this worker's place among several that train the trial (study.trial.data_parallel): all
    evaluate their share of the test set, rank 0 gets the result and the others return ({}, None); only rank 0's
    context writes (TrialContext.writes).
    """
    preflight_trial(cfg, context.store)
    keep_freed_memory()
    seed_everything(cfg.seed)
    task = load_task(cfg.task)
    model = build_reasoner(cfg.model, task.spec)
    started_from = load_start(model, cfg, context.store)  # before the trainer copies the weights for its EMA
    trainer = Trainer(model, task, cfg.train, cfg.seed, parallel)
    recorder = TrialRecorder(context, cfg, model)
    recorder.fixed["init_sha256"] = started_from
    if hooks.resume is not None:
        hooks.resume(trainer)
        recorder.resumed(trainer.step)
    hooks.say(f"data: {task.source}")
    hooks.say(f"training {recorder.tid}: {recorder.fixed['params']:,} parameters, {cfg.train.steps} steps")

    def logged(log: TrainLog) -> None:
        recorder.progress(trainer.history)
        if hooks.on_log is not None:
            hooks.on_log(log)

    history = trainer.fit(on_log=logged, checkpoint=keeping(recorder, hooks.checkpoint))
    evaluated = trainer.eval_model()
    recorder.store_weights(evaluated, trainer.step)
    hooks.say("evaluating")
    seed_everything(cfg.seed)
    result = evaluate(evaluated, task, cfg.eval, cfg.train.device, on_progress=hooks.on_eval_progress,
                      dtype=cfg.reading_dtype, parallel=parallel)
    final_loss = history[-1].loss if history else None
    metrics = {}
    if result is not None:  # rank 0 (or the only worker)
        metrics = summary_metrics(result.depth, final_loss)
        recorder.complete(history, result, metrics, context.metric, trainer.step)
    for i, reading in enumerate(readings):
        hooks.say(f"evaluating the same weights another way ({i + 1}/{len(readings)}): trial {reading.tid}")
        record_reading(reading, evaluated, task, context, weights_of=recorder.tid, weights_step=trainer.step,
                       final_loss=final_loss, on_eval_progress=hooks.on_eval_progress, parallel=parallel)
    return metrics, result


def keeping(recorder: TrialRecorder, checkpoint: Callable[[Trainer], None] | None
            ) -> Callable[[Trainer], None] | None:
    """The trainer's checkpoint callback: the caller's (Tune's), and with a store and train.keep_checkpoints, the
    weights of every keep_checkpoints-th checkpoint kept (by batch count, so a resumed trial keeps the same ones)."""
    train = recorder.cfg.train
    every = train.checkpoint_every * train.keep_checkpoints if recorder.store is not None else 0
    if not every:
        return checkpoint

    def checkpointed(trainer: Trainer) -> None:
        if trainer.batches % every == 0:
            recorder.keep(trainer)
        if checkpoint is not None:
            checkpoint(trainer)

    return checkpointed


def record_reading(reading: Reading, model, task, context: TrialContext, *, weights_of: str, weights_step: int,
                   final_loss: float | None, on_eval_progress: Callable[[int, int], None] | None = None,
                   parallel: DataParallel | None = None) -> dict[str, float]:
    """Evaluate `model` (the weights of trial `weights_of` at training step `weights_step`) under the reading's
    config and store the rows as the reading's own trial; returns its summary metrics ({} on a worker beside
    rank 0, whose share of the test set went to rank 0)."""
    cfg = reading.cfg
    recorder = TrialRecorder(context, cfg, model, tid=reading.tid, weights_of=weights_of)
    seed_everything(cfg.seed)
    result = evaluate(model, task, cfg.eval, cfg.train.device, on_progress=on_eval_progress,
                      dtype=cfg.reading_dtype, parallel=parallel)
    if result is None:
        return {}
    metrics = summary_metrics(result.depth, final_loss)
    recorder.complete([], result, metrics, context.metric, weights_step)
    return metrics


def evaluate_stored(weights_of: str, readings: Sequence[Reading], *, context: TrialContext,
                    hooks: TrialHooks = TrialHooks(), parallel: DataParallel | None = None) -> list[dict[str, float]]:
    """Read trial `weights_of`'s stored weights (final, or kept at a reading's step) under each reading's config,
    each stored as its own trial; readings already complete in the store are skipped. Returns their metrics.
    parallel: several workers share each reading's test set (see run_trial)."""
    store, study_name = context.store, context.study_name
    row = store.trial_row(study_name, weights_of)
    if row is None or row.get("status") != "complete":
        raise StoreError(f"trial {weights_of} of study {study_name} is not complete in {store.uri}: there are no "
                         "trained weights to evaluate")
    todo = sorted((r for r in readings if not store.is_complete(study_name, r.tid)),
                  key=lambda r: (r.step is not None, r.step or 0))  # each set of weights loaded once
    if not todo:
        return []
    cfg = todo[0].cfg
    preflight_trial(cfg, store)
    keep_freed_memory()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    task = load_task(cfg.task)
    kept = kept_steps(row)
    out, bad, loaded_step, model = [], {}, object(), None  # one set of weights in memory at a time (by step)
    for i, reading in enumerate(todo):
        step = reading.step
        if step in bad:
            continue
        if step != loaded_step:
            try:
                sha = row.get("weights_sha256") if step is None else kept.get(step)
                if sha is None:
                    raise StoreError(no_weights(weights_of, step, kept))
                weights = load_weights(store, study_name, weights_of, sha, step)
                model, loaded_step = build_reasoner(cfg.model, task.spec), step
                model.load_state_dict(weights)
                model.eval()
            except StoreError as e:  # one bad file costs the readings of those weights, not the others
                bad[step] = str(e)
                continue
        hooks.say(f"evaluating trial {weights_of}'s weights{'' if step is None else f' at step {step}'} "
                  f"({i + 1}/{len(todo)}): trial {reading.tid}")
        out.append(record_reading(reading, model, task, context, weights_of=weights_of,
                                  weights_step=row["step"] if step is None else step,
                                  final_loss=row.get("final_train_loss"), on_eval_progress=hooks.on_eval_progress,
                                  parallel=parallel))
    if bad:
        missed = sum(r.step in bad for r in todo)
        raise StoreError(f"{missed} reading(s) not taken, their weights could not be read; the other {len(out)} "
                         f"stored. {'; '.join(bad.values())}")
    return out


def no_weights(tid: str, step: int | None, kept: dict[int, str]) -> str:
    """Why trial `tid` has no stored weights to read (at `step`)."""
    if step is None:
        return (f"trial {tid} stored no weights (it ran before loopstudy kept them): it cannot be evaluated again; "
                "run it again (a new study, or remove its rows) to train it with its weights kept")
    where = f"it kept steps {', '.join(map(str, sorted(kept)))}" if kept else \
        "it kept none (train.keep_checkpoints was 0)"
    return f"trial {tid} kept no weights at training step {step}: {where}"


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"
