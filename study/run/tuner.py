"""The Tuner a driver runs: Tune's param space (the pending grid work, or the Optuna space on the base config),
the searcher and scheduler the spec asks for, the progress callback and the trackers; `fit` runs it."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

from study.metrics import DEFAULT_METRIC
from study.paths import is_uri, machine_cache
from study.run.leftovers import release_leftover_placement_groups
from study.run.naming import swept_keys
from study.run.optuna_storage import OptunaStudy
from study.run.session import is_embedded
from study.spec import Study
from study.store.layout import evaluate_tune_dir, tracking_dir, tune_dir
from study.trial.work import WorkItem

LOW_DISK_BYTES = 64 << 20  # below this, an error reading back Tune's state files is the disk being full


def param_space(study: Study, root: str, work: list[WorkItem], threads: int,
                search: OptunaStudy | None = None) -> dict[str, Any]:
    """Tune's param space: what every trial gets, plus the pending work (grid) or the Optuna space on the base
    (and the picks of the samples an interruption cut short, whose trials continue: study.run.carried). Built again
    by resume_study: Tune's saved state does not keep the param space."""
    from ray import tune

    spec, sweep = study.spec, study.spec.sweep
    res = spec.resources
    common = {"store": root, "study": spec.name, "threads": threads, "spec_hash": study.spec_hash,
              "workers": res.workers, "cpu": res.cpu, "gpu": res.gpu,
              "metric": sweep.optuna.metrics[0] if sweep.optuna else DEFAULT_METRIC,
              "objectives": sweep.optuna.metrics if sweep.optuna and sweep.optuna.multi else []}
    if sweep.optuna is not None:
        space = {}
        for key, p in sweep.optuna.space.items():
            space[key] = {"uniform": lambda p=p: tune.uniform(p.low, p.high),
                          "loguniform": lambda p=p: tune.loguniform(p.low, p.high),
                          "int": lambda p=p: tune.randint(int(p.low), int(p.high) + 1),
                          "choice": lambda p=p: tune.choice(p.values)}[p.type]()
        return {**common, "trial": {**spec.base(), "seed": sweep.seeds[0]}, "searched": space,
                "continues": list(search.continued) if search is not None else []}
    # Configs go into the grid as JSON text: Tune deep-copies the whole param space for every variant, and a string
    # copies for free where a nested dict is walked: dicts cost O(N^2) (51 s of driver time before the first of 400
    # trials started). Handing configs over by id through tune.with_parameters was no better: each trial then
    # fetched all N configs (per-trial time doubled at N = 1,000).
    return {**common, "trial": tune.grid_search([w.to_json() for w in work])}


def trial_function(study: Study):
    """The Tune trial: study.run.trainable's, or with resources.workers > 1 study.run.workers', which runs the same
    work on that many Ray Train workers. (torch: imported when a driver builds its Tuner, not before.)"""
    if study.spec.resources.workers > 1:
        from study.run.workers import fit_on_workers

        return fit_on_workers
    from study.run.trainable import trainable

    return trainable


def trial_resources(study: Study) -> dict[str, float]:
    """What one Tune trial holds: the spec's resources; with resources.workers > 1 its workers hold them and the
    trial only waits on its Ray Train run (study.run.workers), so it holds no CPU (a CPU share would keep a worker
    off that node) and, as Ray wants something in a bundle, a MiB of memory."""
    res = study.spec.resources
    return {"cpu": res.cpu, "gpu": res.gpu} if res.workers == 1 else {"cpu": 0, "gpu": 0, "memory": 1 << 20}


def reuse_actors(study: Study) -> bool:
    """Whether Tune may run the next trial in a finished trial's process (a fresh process costs seconds). Not with
    resources.workers > 1: a trial's Ray Train run belongs to its process, and a process kept for reuse keeps a
    stopped trial's run (ASHA, or the end of a search) training on, holding its workers' CPUs, so the next trial
    never gets them. Ended with its process, the run ends too."""
    return study.spec.resources.workers == 1


def build_tuner(study: Study, root: str, work: list[WorkItem], threads: int, search: OptunaStudy | None = None,
                evaluate: bool = False):
    """The Tuner for the pending work (grid) or the rest of the Optuna search, and its progress callback.
    evaluate: `loopstudy evaluate`'s readings of stored weights: no early-stopping scheduler (no training to cut
    short) and an experiment folder of their own (the study's is the one `resume` restores)."""
    from ray import tune
    from ray.tune.logger import JsonLoggerCallback

    spec, sweep = study.spec, study.spec.sweep
    mode = sweep.optuna.modes[0] if sweep.optuna else "max"
    search_alg, num_samples, scheduler = None, 1, None
    if search is not None:
        from study.run.search import searcher
        from study.run.trainable import SampleTrial

        search_alg = searcher(search, sweep.seeds[0], sweep.optuna, resolve=SampleTrial(study))
        num_samples = sweep.optuna.num_samples - search.finished
    if sweep.asha is not None and not evaluate:
        from ray.tune.schedulers import ASHAScheduler

        # time = the training step (checkpoint and evaluation reports repeat it: they never advance a rung); a
        # trial past the last rung is not stopped at max_t but trains on and is evaluated
        scheduler = ASHAScheduler(time_attr="step", max_t=sweep.asha.max_t, grace_period=sweep.asha.grace_period,
                                  reduction_factor=sweep.asha.reduction_factor, stop_last_trials=False)
    total = num_samples if sweep.optuna else len(work)
    from study.run.progress import Progress

    progress = Progress(spec.name, total, mode, swept=swept_keys(sweep))
    trackers, names = [], {}
    if spec.tracking.any:
        from study.run.tracking import callbacks

        trackers, params = callbacks(spec.tracking, study=spec.name, folder=tracking_folder(root, spec.name),
                                     swept=swept_keys(sweep))
        names = {"trial_name_creator": params.name, "trial_dirname_creator": params.dirname}
    tuner = tune.Tuner(
        tune.with_resources(trial_function(study), trial_resources(study)),
        param_space=param_space(study, root, work, threads, search),
        # several objectives: the searcher holds them, and Tune's own metric and mode stay unset, as Tune asks
        tune_config=tune.TuneConfig(**({} if search is not None and sweep.optuna.multi else
                                       {"metric": "objective", "mode": mode}),
                                    search_alg=search_alg, scheduler=scheduler,
                                    num_samples=num_samples, max_concurrent_trials=sweep.max_concurrent or None,
                                    reuse_actors=reuse_actors(study), **names),
        run_config=tune.RunConfig(
            name=spec.name, storage_path=evaluate_tune_dir(root) if evaluate else tune_dir(root), verbose=0,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            # result.json (Tune's ResultGrid reads it) and the trackers the spec asks for; the auto loggers are off,
            # see init_ray
            callbacks=[progress, JsonLoggerCallback(), *trackers],
        ),
    )
    return tuner, progress


def tracking_folder(root: str, study: str) -> Path:
    """Where MLflow's SQLite store and W&B's offline runs go: beside the results, or this machine's cache when the
    results root is an object store."""
    local = tracking_dir(root, study)
    return Path(local) if local else machine_cache() / "tracking" / study


def fit(tuner, root: str, address: str | None):
    """tuner.fit() on the Ray at `address` (init_ray's), with what Tune raises on a full disk said as what it is: its
    state and error files cut short end in a bare EOFError, an UnpicklingError or a JSON error, whichever it reads
    back first. On a cluster, the placement groups its stopped trials left reserved are released at the end."""
    try:
        return tuner.fit()
    except Exception:
        if not is_uri(root) and shutil.disk_usage(root).free < LOW_DISK_BYTES:
            raise OSError(errno.ENOSPC, "No space left on device", root) from None
        raise
    finally:
        if not is_embedded(address):
            release_leftover_placement_groups()  # no trial of this run holds one now
