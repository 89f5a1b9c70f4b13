"""Trials trained by several data-parallel workers (resources.workers > 1): the Tune trial function is
fit_on_workers (study.run.tuner.trial_function), which runs a Ray Train TorchTrainer and waits on it, the pattern
Ray 2.60 documents for Tune + Train.

The Tune trial holds no CPU or GPU of its own (study.run.tuner.trial_resources); each worker gets the spec's
resources.cpu and resources.gpu, and Ray Train sets up the process group (gloo on CPU, NCCL on GPUs). Every
worker runs the trial's work (study.run.trainable.run_work) with its place among the workers
(study.trial.data_parallel): all train and evaluate a share of the test set, rank 0 also writes the rows and
checkpoints. Rank 0's reports reach Tune through TuneReportCallback, so the driver and Tune's scheduler and
searcher see one trial.

Failures: a trial whose worker group lost a worker (a node died) fails, and Tune retries it, up to
sweep.max_failures times: the new TorchTrainer, run under the same name and storage
(study.store.layout.train_runs_dir), resumes from the trial's last checkpoint. Ray Train itself restarts no worker
group: when Tune stops a trial, the GCS kills its workers before its controller, and a controller allowed to retry
then reserves a placement group for a new group as it exits, which Ray never releases (study.run.leftovers). A trial
that only reads stored weights (loopstudy evaluate) splits each reading's test set over its workers the same way.
"""

from __future__ import annotations

from typing import Any

from study.config import trial_id
from study.run.restore import RestoreFromExistingCheckpoint
from study.run.trainable import run_work, trial_work
from study.store.layout import train_runs_dir


def fit_on_workers(config: dict[str, Any]) -> None:
    """The Tune trial: its work (study.run.trainable.run_work) on resources.workers Ray Train workers."""
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    _, work = trial_work(config)
    workers = config["workers"]
    gpu = config.get("gpu", 0.0)
    per_worker = {"CPU": config.get("cpu", 1.0), **({"GPU": gpu} if gpu else {})}
    name = trial_id(work.train) if work.train is not None else work.readings[0].tid  # stable over retries
    trainer = TorchTrainer(
        worker_loop, train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=gpu > 0, resources_per_worker=per_worker),
        run_config=ray.train.RunConfig(
            name=name, storage_path=train_runs_dir(config["store"], config["study"]),
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=0),  # Tune retries (see the module docstring)
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2)))
    trainer.fit()


fit_on_workers.__mixins__ = (RestoreFromExistingCheckpoint,)  # Tune's restore, from a checkpoint that exists


def worker_loop(config: dict[str, Any]) -> None:
    """One worker of a trial (see the module docstring)."""
    import ray.train

    from study.trial.data_parallel import DataParallel

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    run_work(config, api=ray.train, parallel=DataParallel(rank, world) if world > 1 else None)
