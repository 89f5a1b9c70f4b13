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
from study.metrics import summary_metrics
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
) -> tuple[dict[str, float], EvalResult]:
    """Train and evaluate one configuration; returns (summary metrics, evaluation rows).

    checkpoint(trainer) is called every train.checkpoint_every batches; resume(trainer) may load a checkpoint
    into the fresh trainer before training starts; on_eval_progress(done, total) follows the evaluation's steps.
    """
    preflight_trial(cfg, store)
    tid = trial_id(cfg)
    started = now_utc()
    t0 = time.perf_counter()
    seed_everything(cfg.seed)
    task = load_task(cfg.task)
    spec = task.spec
    model = build_reasoner(cfg.model, spec.vocab, spec.seq_len, spec.grid)
    trainer = Trainer(model, task, cfg.train, cfg.seed)
    if resume is not None:
        resume(trainer)
    if on_phase:
        on_phase(f"data: {task.source}")
        on_phase(f"training {tid}: {sum(p.numel() for p in model.parameters()):,} parameters, "
                 f"{cfg.train.steps} steps")
    history = trainer.fit(on_log=on_log, checkpoint=checkpoint)
    if on_phase:
        on_phase("evaluating")
    result = evaluate(trainer.eval_model(), task, cfg.eval, cfg.train.device, on_progress=on_eval_progress,
                      dtype=cfg.train.dtype)
    metrics = summary_metrics(result.depth, history[-1].loss if history else None)
    if store is not None:
        store.write("train_curve", study_name, tid, [vars(h) for h in history])
        store.write("depth_eval", study_name, tid, [dataclasses.asdict(r) for r in result.depth])
        store.write("dynamics", study_name, tid, [dataclasses.asdict(r) for r in result.dynamics])
        store.write("perturbation", study_name, tid, [dataclasses.asdict(r) for r in result.perturbation])
        # the trials row goes last: its status=complete is what marks the trial's results as complete
        store.write("trials", study_name, tid, [{
            **config_row(to_dict(cfg)), "status": "complete",
            "params": sum(p.numel() for p in model.parameters()), "started": started, "ended": now_utc(),
            "wall_s": time.perf_counter() - t0, "device": device_name(cfg.train.device),
            "package_version": study.__version__, "git_commit": git_commit(), "node": node,
            **metrics,
        }])
    return metrics, result


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"
