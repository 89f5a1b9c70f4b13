"""Running a study on Ray Tune: embedded local Ray by default, or a running cluster via --address.

Grid studies: the spec expands to resolved trial configs; those already complete in storage are skipped, the rest
go to Tune as one grid_search over the configs (as JSON text). Optuna studies: OptunaSearch samples the dotted keys
of its space on top of the base config. Each trial is study.trainable.trainable: it runs study.trial.run_trial,
writes its own rows to the store, checkpoints through Tune every train.checkpoint_every batches and resumes from
the last checkpoint when its node died (FailureConfig). This module also checks the cluster and storage, resumes
a dead driver's study (Tuner.restore) and submits studies as Ray Jobs; study.progress prints the progress lines.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from study.config import ConfigError, trial_id
from study.console import eprint
from study.evaluations import WorkItem, pending_work, plan_readings, plan_work, reads_line
from study.metrics import DEFAULT_METRIC
from study.optuna_storage import OptunaStudy, prepare
from study.paths import is_uri, machine_cache, resolve_root
from study.preflight import is_loopback, preflight_study
from study.spec import Study
from study.spec_schema import StudySpec
from study.store import Store
from study.store.files import OBJECT_STORE_ENV
from study.store.layout import evaluate_tune_dir, spec_file, tracking_dir, tune_dir
from study.trainable import trainable

LOW_DISK_BYTES = 64 << 20  # below this, an error reading back Tune's state files is the disk being full
COMPACT_AT = 500  # per-trial files per table at which a finished run compacts its study (loopstudy run --compact-at)


# -- cluster and storage checks ----------------------------------------------------------------------------------------
def init_ray(address: str | None, num_cpus: int | None = None, verbose: bool = False) -> None:
    """Embedded local Ray (default) or join a cluster. A loopback address keeps this driver on 127.0.0.1 too.
    Quiet unless verbose: the terminal shows loopstudy's own lines (results live in Parquet, not in Tune's
    experiment folder), not Ray's token notice, Tune's configuration box or its "View detailed results" line."""
    if not verbose:
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's box and result-folder lines
        logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
        # a failed trial's traceback (Tune logs it whole) and Tune's closing warnings: the progress line says
        # why a trial failed in one line and where its traceback is (study.progress)
        for name in ("ray.tune", "ray.train"):  # ray.train: the syncer's tracebacks when the store refuses a write
            logging.getLogger(name).setLevel(logging.CRITICAL)
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # "Creating initial MLflow database tables..."
    # Frequent small checkpoints are by design (resume after a lost node); Tune's sync warning is noise here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Our rows go to the Parquet store. Tune's default CSV/JSON/TensorBoard loggers would only duplicate them, and
    # tensorboardX imports torch into the driver (which crashed job drivers here with an MKL load error).
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    embedded = address in (None, "", "local")
    if embedded or is_loopback(urlparse(f"//{address}").hostname or ""):
        # Ray otherwise swaps 127.0.0.1 for the machine's outward IP and looks for a raylet there; this keeps the
        # driver (and an embedded cluster) on loopback. Read by ray_constants at import, so set before importing.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    if embedded:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=verbose,
                 configure_logging=verbose)
    else:
        ray.init(address=address, log_to_driver=verbose, configure_logging=verbose)


def cluster_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def storage_root(study: Study, override: str | None) -> str:
    """The results root for a run: --store if given, else the spec's `storage`."""
    return resolve_root(override or study.spec.storage)


# -- running -----------------------------------------------------------------------------------------------------------
def param_space(study: Study, root: str, work: list[WorkItem], threads: int) -> dict[str, Any]:
    """Tune's param space: what every trial gets, plus the pending work (grid) or the Optuna space on the base.
    Built again by resume_study: Tune's saved state does not keep the param space."""
    from ray import tune

    spec, sweep = study.spec, study.spec.sweep
    common = {"store": root, "study": spec.name, "threads": threads, "spec_hash": study.spec_hash,
              "metric": sweep.optuna.metric if sweep.optuna else DEFAULT_METRIC}
    if sweep.optuna is not None:
        space = {}
        for key, p in sweep.optuna.space.items():
            space[key] = {"uniform": lambda p=p: tune.uniform(p.low, p.high),
                          "loguniform": lambda p=p: tune.loguniform(p.low, p.high),
                          "int": lambda p=p: tune.randint(int(p.low), int(p.high) + 1),
                          "choice": lambda p=p: tune.choice(p.values)}[p.type]()
        return {**common, "trial": {**spec.base(), "seed": sweep.seeds[0]}, "searched": space}
    # Configs go into the grid as JSON text: Tune deep-copies the whole param space for every variant, and a string
    # copies for free where a nested dict is walked: dicts cost O(N^2) (51 s of driver time before the first of 400
    # trials started). Handing configs over by id through tune.with_parameters was no better: each trial then
    # fetched all N configs (per-trial time doubled at N = 1,000).
    return {**common, "trial": tune.grid_search([w.to_json() for w in work])}


def build_tuner(study: Study, root: str, work: list[WorkItem], threads: int, search: OptunaStudy | None = None,
                evaluate: bool = False):
    """The Tuner for the pending work (grid) or the rest of the Optuna search, and its progress callback.
    evaluate: `loopstudy evaluate`'s readings of stored weights: no early-stopping scheduler (no training to cut
    short) and an experiment folder of their own (the study's is the one `resume` restores)."""
    from ray import tune
    from ray.tune.logger import JsonLoggerCallback

    spec, sweep = study.spec, study.spec.sweep
    mode = sweep.optuna.mode if sweep.optuna else "max"
    search_alg, num_samples, scheduler = None, 1, None
    if search is not None:
        from study.search import searcher

        search_alg = searcher(search, sweep.seeds[0])
        num_samples = sweep.optuna.num_samples - search.finished
    if sweep.asha is not None and not evaluate:
        from ray.tune.schedulers import ASHAScheduler

        # time = the training step (checkpoint and evaluation reports repeat it: they never advance a rung); a
        # trial past the last rung is not stopped at max_t but trains on and is evaluated
        scheduler = ASHAScheduler(time_attr="step", max_t=sweep.asha.max_t, grace_period=sweep.asha.grace_period,
                                  reduction_factor=sweep.asha.reduction_factor, stop_last_trials=False)
    resources = {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    total = num_samples if sweep.optuna else len(work)
    from study.progress import Progress

    progress = Progress(spec.name, total, mode)
    trackers, names = [], {}
    if spec.tracking.any:
        from study.tracking import callbacks

        trackers, params = callbacks(spec.tracking, study=spec.name, folder=tracking_folder(root, spec.name),
                                     swept=list(sweep.grid))
        names = {"trial_name_creator": params.name, "trial_dirname_creator": params.dirname}
    tuner = tune.Tuner(
        tune.with_resources(trainable, resources),
        param_space=param_space(study, root, work, threads),
        tune_config=tune.TuneConfig(metric="objective", mode=mode, search_alg=search_alg, scheduler=scheduler,
                                    num_samples=num_samples, max_concurrent_trials=sweep.max_concurrent or None,
                                    reuse_actors=True, **names),  # a fresh worker process per trial costs seconds
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


def save_spec(store: Store, study: Study) -> None:
    """Keep the spec beside the results, so `status` and `resume` need only the study name."""
    import yaml

    store.put_text(spec_file(study.name), yaml.safe_dump(study.data, sort_keys=False))


def run_study(study: Study, *, address: str | None = None, storage: str | None = None,
              shared_storage: bool = False, num_cpus: int | None = None,
              compact_at: int = COMPACT_AT, verbose: bool = False) -> dict[str, Any]:
    """Run every pending trial of the study; returns counts. Trials complete in storage are not run again. When the
    study then has compact_at or more per-trial files per table (0: never), they are compacted. One driver per
    study: another one running it is refused before Ray starts (Store.lease)."""
    root = storage_root(study, storage)
    store = Store(root)
    with store.lease(study.name):
        return _run_study(study, store, root, address=address, shared_storage=shared_storage, num_cpus=num_cpus,
                          compact_at=compact_at, verbose=verbose)


def _run_study(study: Study, store: Store, root: str, *, address: str | None, shared_storage: bool,
               num_cpus: int | None, compact_at: int, verbose: bool = False) -> dict[str, Any]:
    done = store.completed_trials(study.name)
    pending = [c for c in study.trials if trial_id(c) not in done]
    skipped = len(study.trials) - len(pending)
    search = optuna_study(study, root) if study.is_optuna else None
    if skipped:
        eprint(f"[{study.name}] {skipped} trial(s) already complete in {root}: not run again")
    if search is not None and search.finished:
        skipped = search.finished
        eprint(f"[{study.name}] {search.finished} of {study.spec.sweep.optuna.num_samples} sample(s) already "
               f"finished in Optuna study {search.name!r} ({search.location}): not run again")
    work = [] if search else plan_work(study, store, done)
    left = study.spec.sweep.optuna.num_samples - search.finished if search else len(work)
    if left <= 0:  # said without starting Ray
        save_spec(store, study)
        what = f"{skipped} sample(s) of the search are finished" if search else \
            f"all {len(study.trials)} trial(s) are complete"
        eprint(f"[{study.name}] nothing to run: {what}")
        return {"ran": 0, "skipped": skipped, "errors": 0}
    init_ray(address, num_cpus, verbose)
    import ray

    preflight_study(study, store, cluster=ray.cluster_resources(), nodes=cluster_nodes(), shared=shared_storage)
    save_spec(store, study)
    threads = max(1, int(study.spec.resources.cpu))
    eprint(f"[{study.name}] {left} trial(s) on Ray ({address or 'embedded'}){reads_line(work)}; results -> {root}")
    if search is not None:
        eprint(f"[{study.name}] Optuna study {search.name!r} in {search.location} (optuna-dashboard "
               f"{search.location})")
    t0 = time.perf_counter()
    tuner, progress = build_tuner(study, root, work, threads, search)
    grid = fit(tuner, root)
    errors = sum(1 for r in grid if r.error is not None)
    record_endings(store, study.name, grid)
    took = f"{time.perf_counter() - t0:.0f}s"
    if progress.finished < left:  # Tune returns normally after Ctrl-C: do not call that finished
        eprint(f"[{study.name}] interrupted after {took}: {progress.done} trial(s) complete this run, "
               f"{progress.failed} failed, {left - progress.finished} not finished. Complete trials stay in {root}; "
               f"continue with: loopstudy resume {study.name} --store {shlex.quote(root)}")
        return {"ran": len(grid), "skipped": skipped, "errors": errors, "interrupted": True}
    stopped = f", {progress.stopped} stopped early (ASHA)" if progress.stopped else ""
    eprint(f"[{study.name}] finished in {took}: {len(grid) - errors - progress.stopped} complete{stopped}, "
           f"{errors} failed")
    maybe_compact(store, study.name, compact_at)
    return {"ran": len(grid), "skipped": skipped, "errors": errors}


def optuna_study(study: Study, root: str) -> OptunaStudy:
    """The search's Optuna study (created if new) and how many samples it has finished (study/optuna_storage.py)."""
    return prepare(study.optuna_storage(root), study.name, study.spec_hash, study.spec.sweep.optuna.mode)


def fit(tuner, root: str):
    """tuner.fit(), with what Tune raises on a full disk said as what it is: its state and error files cut short
    end in a bare EOFError, an UnpicklingError or a JSON error, whichever it reads back first."""
    try:
        return tuner.fit()
    except Exception:
        if not is_uri(root) and shutil.disk_usage(root).free < LOW_DISK_BYTES:
            raise OSError(errno.ENOSPC, "No space left on device", root) from None
        raise


def record_endings(store: Store, name: str, grid) -> None:
    """Say in each trial's row how it ended when the trial could not: a trial that Tune's scheduler stopped (its
    last report is not `final`) or that failed still has its `running` row; it becomes `stopped` or `failed`,
    keeping the step it reached, its last objective and its train_curve."""
    from study.store import now_utc

    for result in grid:
        metrics = result.metrics or {}
        if metrics.get("final") and result.error is None:
            continue  # it said how it ended itself: `complete`
        tid, status = metrics.get("trial"), "failed" if result.error is not None else "stopped"
        if tid is None:
            continue
        row = store.trial_row(name, tid)
        if row is not None and row.get("status") == "running":
            store.write("trials", name, tid, [{**row, "status": status, "ended": now_utc()}])


def maybe_compact(store: Store, name: str, compact_at: int) -> None:
    """Compact the study once it has compact_at per-trial files per table, so that reading it (the closing table
    and figures, status, ls) keeps costing a few files however many trials it has."""
    n = len(store.files("trials", name))
    if compact_at and n >= compact_at:
        t0 = time.perf_counter()
        out = store.compact(name)
        eprint(f"[{name}] compacted {out['trials']:,} complete trials into one file per table "
               f"({n:,} per-trial files per table; {time.perf_counter() - t0:.1f}s; --compact-at 0 turns this off)")


def resume_study(name: str, *, storage: str, address: str | None = None, verbose: bool = False) -> dict[str, Any]:
    """Tuner.restore the study's experiment: finished trials are not re-run, unfinished ones continue from their
    last checkpoint. When no experiment state was saved yet, run the saved spec again (complete trials skipped).
    An Optuna search continues from its Optuna study instead (study/optuna_storage.py): Tune's saved searcher can
    be older than the storage (a sample that finished after Tune's last save would be told twice, and one running
    at the time left RUNNING), while the storage knows every sample; the ones the dead driver left running are
    marked interrupted and sampled anew."""
    from study.spec import load_saved_study

    root = resolve_root(storage)
    store = Store(root)
    study = load_saved_study(store, name)
    store.lease(name).refuse_if_held()  # before Ray starts (the lease itself is taken around the run)
    if study.is_optuna:
        eprint(f"[{name}] continuing the Optuna search from its Optuna study ({study.optuna_storage(root)})")
        return run_study(study, address=address, storage=root, verbose=verbose)
    init_ray(address, verbose=verbose)
    from ray import tune

    path = tune_dir(root, name)
    if not tune.Tuner.can_restore(path):
        eprint(f"[{name}] no saved Tune state at {path}: running the saved spec (complete trials skipped)")
        return run_study(study, address=address, storage=root, verbose=verbose)
    done_before = store.completed_trials(name)
    eprint(f"[{name}] restoring from {path}; {len(done_before)} trial(s) complete in storage")
    res = study.spec.resources
    # the param space again (Tune does not save it): trials it had not generated yet come from it; a trial that
    # completed meanwhile is skipped by the trainable's own check
    work = plan_work(study, store, done_before) or pending_work(study.trials, set(), {})
    space = param_space(study, root, work, max(1, int(res.cpu)))
    try:
        tuner = tune.Tuner.restore(path, tune.with_resources(trainable, {"cpu": res.cpu, "gpu": res.gpu}),
                                   resume_unfinished=True, resume_errored=True, param_space=space)
    except Exception as e:  # a damaged tuner.pkl or experiment state: the store still knows what is complete
        eprint(f"[{name}] Tune's saved state at {path} cannot be restored ({type(e).__name__}: "
               f"{str(e).splitlines()[0][:200] if str(e) else ''}): running the saved spec (complete trials skipped)")
        return run_study(study, address=address, storage=root, verbose=verbose)
    with store.lease(name):
        grid = fit(tuner, root)
    errors = sum(1 for r in grid if r.error is not None)
    record_endings(store, name, grid)
    missing = [c for c in study.trials if trial_id(c) not in store.completed_trials(name)]
    if missing and not study.is_optuna:  # trials Tune never got to before the driver died
        eprint(f"[{name}] {len(missing)} trial(s) were not in the restored experiment: running them")
        run_study(study, address=address, storage=root, verbose=verbose)
    return {"ran": len(grid), "errors": errors}


def evaluate_study(name: str, *, storage: str, overrides: dict[str, Any], trials: list[str] | None = None,
                   checkpoints: bool = False, address: str | None = None, num_cpus: int | None = None,
                   verbose: bool = False) -> dict[str, Any]:
    """`loopstudy evaluate`: read the stored weights of the study's trained trials (or those named) under eval.*
    overrides, at their final weights and with `checkpoints` at every kept checkpoint, on Ray with the spec's
    resources. Each reading is stored as a trial of its own (study.evaluations); readings already stored are
    skipped, so running the command again after a dead driver finishes the rest. Returns counts."""
    from study.spec import load_saved_study

    root = resolve_root(storage)
    store = Store(root).require()
    if store.get_text(spec_file(name)) is None and name in store.studies():  # trials from `loopstudy trial`
        study = Study(StudySpec(name=name), f"study {name} (no saved spec: default resources)")
    else:
        study = load_saved_study(store, name)
    readings, skipped = plan_readings(store, study, overrides, trials, checkpoints)
    work = [WorkItem(None, source, rs) for source, rs in readings.items() if rs]
    n = sum(len(w.readings) for w in work)
    if skipped:
        eprint(f"[{name}] {skipped} reading(s) already stored: not run again")
    if not work:
        eprint(f"[{name}] nothing to evaluate: every reading asked for is stored")
        return {"ran": 0, "skipped": skipped, "errors": 0}
    store.lease(name).refuse_if_held()  # before Ray starts
    init_ray(address, num_cpus, verbose)
    import ray

    preflight_study(study, store, cluster=ray.cluster_resources(), nodes=cluster_nodes(), shared=False)
    eprint(f"[{name}] {n} reading(s) of the stored weights of {len(work)} trial(s) on Ray "
           f"({address or 'embedded'}); results -> {root}")
    t0 = time.perf_counter()
    with store.lease(name):
        tuner, progress = build_tuner(study, root, work, max(1, int(study.spec.resources.cpu)), evaluate=True)
        grid = fit(tuner, root)
    errors = sum(1 for r in grid if r.error is not None)
    eprint(f"[{name}] evaluated in {time.perf_counter() - t0:.0f}s: {len(grid) - errors} trial(s) read, "
           f"{errors} failed")
    return {"ran": n, "skipped": skipped, "errors": errors}


def submit_study(spec_path: str, *, address: str, storage: str | None, repo: Path,
                 extra_args: list[str] | None = None) -> str:
    """Send `loopstudy run SPEC --address auto` to the cluster's job server, the repo as working dir."""
    from ray.job_submission import JobSubmissionClient

    rel = os.path.relpath(os.path.abspath(spec_path), repo)
    if rel.startswith(".."):
        raise ConfigError(f"{spec_path}: the spec must live inside the repository ({repo}) to travel with it")
    cmd = ["python", "-m", "study.cli", "run", rel, "--address", "auto"]
    if storage:
        cmd += ["--store", storage]
    cmd += extra_args or []
    client = JobSubmissionClient(address)
    # the object store's endpoint and credentials as this machine has them (they show in the job's runtime env on
    # the dashboard: on a cluster with its own role, leave them unset here)
    env = {k: os.environ[k] for k in OBJECT_STORE_ENV if os.environ.get(k)}
    job_id = client.submit_job(
        entrypoint=" ".join(shlex.quote(c) for c in cmd),
        runtime_env={"working_dir": str(repo), "env_vars": env,
                     "excludes": [".git", ".venv", "results", "*.parquet", "__pycache__", "docs"]},
    )
    return job_id
