"""The Ray Tune trainable: one trial of a study, run by study.trial.run_trial, talking to Tune through one object.

Grid studies hand each trial its resolved config as JSON text; Optuna studies hand the base config plus the
searcher's dotted picks. The trial checks its own files first (O(1): a trial complete in storage reports and
ends), writes its rows to the store itself, and sends Tune only a few numbers: `objective` is the training
batch's cell accuracy while training (exact accuracy is 0 for every trial early on, so ASHA could not rank them
by it) and the spec's final metric at the end (OptunaSearch and ASHA need it in
every report); `step` is the training step, ASHA's time (checkpoint and evaluation reports repeat it, so they
never advance a rung); `final` marks the last report of a trial that completed (one without it was stopped);
`phase` and `progress` feed the driver's status lines. A search with several objectives gets each of them in every
report (None until the last: Tune checks that every report names what the searcher reads; its searcher reads only
the last). With resources.workers > 1 the Tune trial is study.run.workers', which runs the same work (run_work)
on that many Ray Train workers, and they send the same reports.
"""

from __future__ import annotations

import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from study.config import TrialConfig, build_trial, set_dotted, trial_id
from study.errors import ConfigError
from study.metrics import METRICS, depth_report, summary_metrics
from study.run.carried import carried_checkpoint
from study.run.restore import CKPT_FILE, RestoreFromExistingCheckpoint
from study.store import Store
from study.trial.work import WorkItem, work_from_json

EVAL_REPORT_S = 15.0  # a trial reports evaluation progress at most this often


class TuneSession:
    """Everything one trial says to Tune: training logs, evaluation progress, checkpoints and the last report;
    and resuming from Tune's checkpoint after a lost node.

    api: ray.tune in a Tune trial; ray.train in a data-parallel worker (study.run.workers), whose rank-0 reports
    Ray Train hands on to Tune. Ray Train counts every worker's reports alike, so with several workers each one
    reports at the same steps: the others report without a checkpoint, and nobody reports evaluation progress
    (reports paced by the clock would differ in number between workers, and Ray Train would wait on the missing
    ones)."""

    def __init__(self, tid: str, node: str, steps: int, objectives: tuple[str, ...] | list[str] = (), *, api,
                 rank: int = 0, world: int = 1, carried=None):
        self.tid, self.node, self.steps = tid, node, max(1, steps)
        self.carried = carried  # () -> an earlier Tune trial's checkpoint of this sample (study.run.carried)
        self.api, self.rank, self.world = api, rank, world
        self.pending = dict.fromkeys(objectives)  # every objective, None until the final report
        self.last = {"train_exact_acc": 0.0, "train_cell_acc": 0.0, "train_loss": float("nan"), "lr": 0.0, "step": 0}
        self.next_eval_report = time.monotonic() + EVAL_REPORT_S

    def report(self, objective: float, checkpoint=None, **extra) -> None:
        # our trial id as `trial`: Tune fills `trial_id` in every result with its own
        self.api.report({"trial": self.tid, "objective": objective, "node": self.node, "workers": self.world,
                         **self.pending, **self.last, **extra},
                        checkpoint=checkpoint)

    def on_log(self, log) -> None:
        self.last.update(train_exact_acc=log.exact_acc, train_cell_acc=log.cell_acc, train_loss=log.loss,
                         lr=log.lr, step=log.step)
        self.report(log.cell_acc, phase="train", progress=log.step / self.steps)

    def on_eval_progress(self, done: int, total: int) -> None:
        if self.world == 1 and time.monotonic() >= self.next_eval_report:
            self.next_eval_report = time.monotonic() + EVAL_REPORT_S
            self.report(self.last["train_cell_acc"], phase="eval", progress=done / total)

    def checkpoint(self, trainer) -> None:
        if self.rank:  # the replicas are equal: rank 0's checkpoint holds them all
            self.report(self.last["train_cell_acc"])
            return
        with tempfile.TemporaryDirectory() as d:
            trainer.save(Path(d) / CKPT_FILE)
            self.report(self.last["train_cell_acc"], checkpoint=self.api.Checkpoint.from_directory(d))

    def resume(self, trainer) -> None:
        ckpt = self.api.get_checkpoint()
        if ckpt is None and self.carried is not None:
            ckpt = self.carried()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                trainer.load(Path(d) / CKPT_FILE)
            self.last["resumed_step"] = trainer.step  # every later report says where this attempt began

    def hooks(self):
        """What run_trial tells Tune, and how it checkpoints and resumes through Tune."""
        from study.trial.execute import TrialHooks

        return TrialHooks(on_log=self.on_log, checkpoint=self.checkpoint, resume=self.resume,
                          on_eval_progress=self.on_eval_progress)


def trial_work(config: dict[str, Any]) -> tuple[TrialConfig, WorkItem]:
    """(the config that names the trial, what it does) from Tune's config: a grid item (JSON text: a config plus
    the work's keys, study.run.plan.WorkItem.to_json) or the base dict plus Optuna's dotted picks."""
    data = json.loads(config["trial"]) if isinstance(config["trial"], str) else copy.deepcopy(config["trial"])
    for key, value in config.get("searched", {}).items():
        set_dotted(data, key, value)
    source = f"study {config['study']}"
    data, trains, weights_of, readings = work_from_json(data, source)
    cfg = build_trial(data, source)
    for c in [cfg, *(r.cfg for r in readings)]:
        if not c.train.threads:
            c.train.threads = config.get("threads", 1)
    return cfg, WorkItem(cfg if trains else None, weights_of, readings)


def trial_config(config: dict[str, Any]) -> TrialConfig:
    """The trial's resolved config from Tune's (see trial_work)."""
    return trial_work(config)[0]


class SampleTrial:
    """A sample's loopstudy trial id from Tune's config of it ({"searched": {dotted key: value}}), built the one
    way a trial builds its config (None: a config that does not build). Picklable: Tune saves the searcher."""

    def __init__(self, study):
        self.name, self.base = study.name, {**study.spec.base(), "seed": study.spec.sweep.seeds[0]}

    def __call__(self, config: dict[str, Any]) -> str | None:
        try:
            return trial_id(trial_config({"study": self.name, "trial": self.base,
                                          "searched": config.get("searched", {})}))
        except ConfigError:
            return None


def stored_metrics(store: Store, study: str, tid: str) -> dict[str, float]:
    """A complete trial's metrics as stored; one that its trials row lacks (a trial stored before the metric
    joined the registry) is computed from its stored depth rows, as it was when the trial ran."""
    import polars as pl

    row = store.trial_row(study, tid) or {}
    out = {k: row[k] for k in METRICS if row.get(k) is not None}
    if {k for k, m in METRICS.items() if m.every_task} - set(out):
        depth = store.scan("depth_eval", study, skip_bad=True).filter(pl.col("trial_id") == tid).collect()
        out = {**summary_metrics(depth.to_dicts(), row.get("final_train_loss")), **out}
    return out


def trainable(config: dict[str, Any]) -> None:
    """One Tune trial: train a config and read its weights each way the study asks, or read stored weights only
    (study.run.plan). config: trial (and searched), store, study, metric, threads, spec_hash (and workers, each
    one's cpu and gpu, read by study.run.workers)."""
    run_work(config)


trainable.__mixins__ = (RestoreFromExistingCheckpoint,)  # Tune's restore, from a checkpoint that exists


def run_work(config: dict[str, Any], *, api=None, parallel=None) -> None:
    """What one trial does (see trainable), in the Tune trial itself or in each data-parallel worker (api:
    ray.train; parallel: the worker's study.trial.data_parallel.DataParallel): all train and evaluate their share,
    rank 0 writes."""
    import ray
    from ray import tune

    from study.trial.execute import TrialContext, TrialHooks, evaluate_stored, run_trial

    cfg, work = trial_work(config)
    store = Store(config["store"])
    study_name, metric = config["study"], config["metric"]
    node = ray.get_runtime_context().get_node_id()
    rank, world = (parallel.rank, parallel.world) if parallel is not None else (0, 1)
    context = TrialContext(store, study_name, node, metric, config.get("spec_hash"), workers=world,
                           writes=rank == 0)

    def tune_session(tid: str, steps: int) -> TuneSession:
        searched = config.get("searched")  # a sample an interruption cut short continues from its checkpoint
        carried = ((lambda: carried_checkpoint(config["store"], study_name, searched))
                   if searched and searched in config.get("continues", []) else None)
        return TuneSession(tid, node, steps, config.get("objectives", []), api=api or tune, rank=rank, world=world,
                           carried=carried)

    def read_stored(weights_of: str, reported: str, session: TuneSession, **extra) -> None:
        """Take the readings of stored weights (every worker: each reads its share), then the last report: trial
        `reported`'s stored metrics."""
        evaluate_stored(weights_of, work.readings, context=context,
                        hooks=TrialHooks(on_eval_progress=session.on_eval_progress), parallel=parallel)
        if rank:  # a worker beside rank 0: its last report mirrors rank 0's, which Tune hears
            session.report(0.0, final=1)
            return
        stored = stored_metrics(store, study_name, reported)
        session.report(stored[metric], final=1, **extra, **stored)

    if work.train is None:  # every reading is of weights stored by an earlier trial
        read_stored(work.weights_of, work.readings[0].tid, tune_session(work.readings[0].tid, 1))
        return
    tid = trial_id(cfg)
    session = tune_session(tid, cfg.train.steps)
    if store.is_complete(study_name, tid):  # e.g. two Optuna samples that resolve to the same config
        # (trained by an earlier attempt: the readings it did not finish, if any)
        read_stored(tid, tid, session, skipped=1)
        return
    metrics, result = run_trial(cfg, context=context, hooks=session.hooks(), readings=work.readings,
                                parallel=parallel)
    if result is None:  # a worker beside rank 0: its last report mirrors rank 0's, which Tune hears
        session.report(0.0, final=1)
        return
    # the depth curve rides along for the trackers (study/run/tracking.py); the store has every row
    session.report(metrics[metric], final=1, **metrics, **depth_report(result.depth))
