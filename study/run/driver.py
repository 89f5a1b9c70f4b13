"""The one driver behind `loopstudy run`, `resume` and `evaluate`: plan the work, start Ray and check the cluster
(preflight), run Tune under the study's lease, and end the same way (count failures, record how trials ended).

Grid studies: the spec expands to resolved trial configs; those already complete in storage are skipped, the rest
go to Tune as one grid_search (study.run.tuner). Optuna studies: OptunaSearch samples the dotted keys of its space
on top of the base config. Each trial is study.run.trainable.trainable: it runs study.trial.execute.run_trial,
writes its own rows to the store, checkpoints through Tune every train.checkpoint_every batches and resumes from
the last checkpoint when its node died (FailureConfig). `resume` restores a dead driver's experiment
(Tuner.restore); `evaluate` reads stored weights again (study.run.plan).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import Any

from study.config import trial_id
from study.console import eprint
from study.errors import ConfigError
from study.paths import is_uri, resolve_root
from study.run.optuna_storage import SEARCHED, OptunaStudy, prepare
from study.run.plan import pending_work, plan_readings, plan_work, reads_line
from study.run.preflight import preflight_study
from study.run.services import check_trackers
from study.run.session import cluster_nodes, init_ray
from study.run.tuner import build_tuner, fit, param_space, trial_function, trial_resources
from study.spec import Study
from study.spec.schema import StudySpec
from study.store import Store
from study.store.layout import spec_file, tune_dir
from study.trial.work import WorkItem

SAMPLING_ROUNDS = 3  # an Optuna search stops after this many rounds in a row that found no new distinct trial
COMPACT_AT = 500  # per-trial files per table at which a finished run compacts its study (loopstudy run --compact-at)


@dataclass(frozen=True)
class Connection:
    """Where a driver runs its trials: a Ray address (None: embedded local Ray), CPUs of an embedded Ray, whether
    the results root is shared by every node (skips the reachability check), and whether Ray may speak."""

    address: str | None = None
    num_cpus: int | None = None
    shared_storage: bool = False
    verbose: bool = False

    @property
    def where(self) -> str:
        return self.address or "embedded"


def start(study: Study, store: Store, conn: Connection) -> None:
    """Every driver's start-up: the services the study names (before Ray starts), Ray (embedded or the cluster),
    then every check of the study on that cluster."""
    check_trackers(study)
    init_ray(conn.address, conn.num_cpus, conn.verbose)
    import ray

    preflight_study(study, store, cluster=ray.cluster_resources(), nodes=cluster_nodes(),
                    shared=conn.shared_storage)


def finish(store: Store, name: str, grid, took: float, what: str) -> int:
    """Every driver's ending: say in each trial's row how it ended when the trial could not, and count failures.
    Returns the number of failed trials."""
    errors = sum(1 for r in grid if r.error is not None)
    record_endings(store, name, grid)
    if what:
        eprint(f"[{name}] {what} in {took:.0f}s: {len(grid) - errors} trial(s) done, {errors} failed")
    return errors


PLACEHOLDER_BUCKET = "YOUR-BUCKET"  # the paper specs' storage until a user names theirs (s3://YOUR-BUCKET/loopstudy)


def placeholder(study: Study, root: str) -> str | None:
    """The refusal of a results root that is the shipped specs' placeholder bucket (None: a real root)."""
    if is_uri(root) and PLACEHOLDER_BUCKET in root.split("?", 1)[0]:
        return (f"{study.source}: storage {root.split('?', 1)[0]} is the shipped specs' placeholder, not a bucket; "
                "pass --store ROOT (a path, or s3://your-bucket/prefix) or set storage in the spec")
    return None


def storage_root(study: Study, override: str | None, allow_placeholder: bool = False) -> str:
    """The results root for a run: --store if given, else the spec's `storage`; the placeholder bucket is refused
    (allow_placeholder: returned, for a dry run to name it)."""
    root = override or study.spec.storage
    said = placeholder(study, root)
    if said is not None and not allow_placeholder:
        raise ConfigError(said)
    return root if said is not None else resolve_root(root)


def save_spec(store: Store, study: Study) -> None:
    """Keep the spec beside the results, so `status` and `resume` need only the study name."""
    import yaml

    store.put_text(spec_file(study.name), yaml.safe_dump(study.data, sort_keys=False))


def optuna_study(study: Study, root: str, verbose: bool = False) -> OptunaStudy:
    """The search's Optuna study (created if new) and how many samples it has finished (study.run.optuna_storage).
    Optuna's own log lines (a study created, each trial finished) stay out of loopstudy's output unless verbose."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.WARNING)
    return prepare(study.optuna_storage(root), study.name, study.spec_hash, study.spec.sweep.optuna.modes,
                   settled=lambda params: settled_sample(study, Store(root), params))


def settled_sample(study: Study, store: Store, params: dict[str, Any]) -> tuple[str, list[float]] | None:
    """(trial id, objective values) of an Optuna sample whose trial is complete in the store, else None: a sample
    left RUNNING by a driver that stopped after its trial finished, before Tune told the searcher."""
    from study.run.trainable import SampleTrial, stored_metrics

    tid = SampleTrial(study)({"searched": {key.removeprefix(SEARCHED): value for key, value in params.items()}})
    if tid is None or not store.is_complete(study.name, tid):
        return None
    metrics = stored_metrics(store, study.name, tid)
    values = [metrics.get(m) for m in study.spec.sweep.optuna.metrics]
    return (tid, [float(v) for v in values]) if None not in values else None


# -- run ---------------------------------------------------------------------------------------------------------------
def run_study(study: Study, *, address: str | None = None, storage: str | None = None,
              shared_storage: bool = False, num_cpus: int | None = None,
              compact_at: int = COMPACT_AT, verbose: bool = False) -> dict[str, Any]:
    """Run every pending trial of the study; returns counts. Trials complete in storage are not run again. When the
    study then has compact_at or more per-trial files per table (0: never), they are compacted. One driver per
    study: another one running it is refused before Ray starts (Store.lease)."""
    conn = Connection(address, num_cpus, shared_storage, verbose)
    root = storage_root(study, storage)
    store = Store(root)
    with store.lease(study.name):
        return _run_study(study, store, root, conn, compact_at)


def _run_study(study: Study, store: Store, root: str, conn: Connection, compact_at: int) -> dict[str, Any]:
    done = store.completed_trials(study.name)
    skipped = len(study.trials) - sum(1 for c in study.trials if trial_id(c) not in done)
    search = optuna_study(study, root, conn.verbose) if study.is_optuna else None
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
    start(study, store, conn)
    save_spec(store, study)
    eprint(f"[{study.name}] {left} trial(s) on Ray ({conn.where}){reads_line(work)}; results -> {root}")
    if search is not None:
        eprint(f"[{study.name}] Optuna study {search.name!r} in {search.location} (optuna-dashboard "
               f"{search.location})")
    t0 = time.perf_counter()
    ran = errors = stopped = fruitless = 0
    while True:
        tuner, progress = build_tuner(study, root, work, threads(study), search)
        grid = fit(tuner, root, conn.address)
        ran, errors = ran + len(grid), errors + finish(store, study.name, grid, time.perf_counter() - t0, "")
        stopped += progress.stopped
        took = f"{time.perf_counter() - t0:.0f}s"
        if progress.finished < left:  # Tune returns normally after Ctrl-C: do not call that finished
            eprint(f"[{study.name}] interrupted after {took}: {progress.done} trial(s) complete this run, "
                   f"{progress.failed} failed, {left - progress.finished} not finished. Complete trials stay in "
                   f"{root}; continue with: loopstudy resume {study.name} --store {shlex.quote(root)}")
            return {"ran": ran, "skipped": skipped, "errors": errors, "interrupted": True}
        if search is None:
            break
        before, search = search.finished, optuna_study(study, root, conn.verbose)
        left = study.spec.sweep.optuna.num_samples - search.finished
        fruitless = fruitless + 1 if search.finished == before else 0
        if left <= 0 or fruitless >= SAMPLING_ROUNDS:
            break
        # a sample that resolved to a trial already finished was not run: it does not count as a sample
        eprint(f"[{study.name}] {search.finished} distinct sample(s) finished: sampling {left} more")
    if left > 0 and search is not None:
        eprint(f"[{study.name}] the search space gave {search.finished} distinct trial(s) of the "
               f"{study.spec.sweep.optuna.num_samples} asked for: its samples keep resolving to trials already run")
    ended_early = f", {stopped} stopped early (ASHA)" if stopped else ""
    eprint(f"[{study.name}] finished in {took}: {ran - errors - stopped} complete{ended_early}, {errors} failed")
    maybe_compact(store, study.name, compact_at)
    return {"ran": ran, "skipped": skipped, "errors": errors}


def threads(study: Study) -> int:
    """torch threads per trial: the CPUs the spec gives each trial."""
    return max(1, int(study.spec.resources.cpu))


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


# -- dry run -----------------------------------------------------------------------------------------------------------
def dry_run_study(study: Study, *, address: str | None = None, storage: str | None = None,
                  shared_storage: bool = False, num_cpus: int | None = None, verbose: bool = False) -> dict[str, Any]:
    """`loopstudy run --dry-run`: what a run would do, starting nothing and storing nothing. The spec is validated
    and expanded (as for a run); Ray is started or joined to run the cluster checks, each of which is reported
    rather than fatal (a spec that asks for GPUs is checked on a laptop). Returns {"trials": one dict per trial or
    sample (what it is, whether it runs, what it holds), "offers": what each node has, "refused": the checks' lines,
    "root": the results root}."""
    from study.run.optuna_storage import peek
    from study.run.preflight import check_node_plugins, check_storage, data_files, resource_refusals

    conn = Connection(address, num_cpus, shared_storage, verbose)
    root = storage_root(study, storage, allow_placeholder=True)
    refused = [said] if (said := placeholder(study, root)) else []
    store = None if refused else Store(root)  # (a placeholder is never asked: its host does not exist)
    res = study.spec.resources
    holds = {"cpu": f"{res.cpu:g}", "gpu": f"{res.gpu:g}", "workers": res.workers}
    if study.is_optuna:
        optuna = study.spec.sweep.optuna
        finished = peek(study.optuna_storage(root), study.name, study.spec_hash)
        trials = [{"trial": f"Optuna sample {i + 1}", "action": "skip (finished)" if i < finished else "run", **holds}
                  for i in range(optuna.num_samples)]
    else:
        done = store.completed_trials(study.name) if store is not None else set()
        reads = {} if store is None else {r.tid: w.weights_of or trial_id(w.train)
                                          for w in plan_work(study, store, done) for r in w.readings}
        trials = [{"trial": c.label or "trial", "seed": c.seed, "trial_id": trial_id(c),
                   "action": "skip (complete)" if trial_id(c) in done else
                   f"read the weights of {reads[trial_id(c)]}" if trial_id(c) in reads else "run", **holds}
                  for c in study.trials]
    init_ray(conn.address, conn.num_cpus, conn.verbose)
    import ray

    nodes = cluster_nodes()
    refused += resource_refusals(study, ray.cluster_resources(), nodes)
    for check in ((lambda: check_storage(store.uri, nodes, conn.shared_storage, data_files(study)))
                  if store is not None else (lambda: None),
                  lambda: check_node_plugins(study, nodes)):
        try:
            check()
        except ConfigError as e:
            refused.append(str(e))
    offers = [f"{n.get('NodeManagerAddress', '?')}: " + ", ".join(f"{n['Resources'].get(k, 0):g} {k}"
                                                                  for k in ("CPU", "GPU")) for n in nodes]
    return {"trials": trials, "offers": offers, "refused": refused, "root": root, "where": conn.where}


# -- resume ------------------------------------------------------------------------------------------------------------
def resume_study(name: str, *, storage: str, address: str | None = None, verbose: bool = False) -> dict[str, Any]:
    """Tuner.restore the study's experiment: finished trials are not re-run, unfinished ones continue from their
    last checkpoint. When no experiment state was saved yet, run the saved spec again (complete trials skipped).
    An Optuna search continues from its Optuna study instead (study.run.optuna_storage): Tune's saved searcher can
    be older than the storage (a sample that finished after Tune's last save would be told twice, and one running
    at the time left RUNNING), while the storage knows every sample; the ones the dead driver left running are
    marked interrupted and their parameters enqueued again, so each continues from its checkpoint
    (study.run.carried). Every path gets the same start-up and preflight as `run`."""
    from study.spec import load_saved_study

    root = resolve_root(storage)
    store = Store(root)
    study = load_saved_study(store, name)
    store.lease(name).refuse_if_held()  # before Ray starts (the lease itself is taken around the run)
    rerun = {"address": address, "storage": root, "verbose": verbose}
    if study.is_optuna:
        eprint(f"[{name}] continuing the Optuna search from its Optuna study ({study.optuna_storage(root)})")
        return run_study(study, **rerun)
    init_ray(address, verbose=verbose)  # before Tune is imported: init_ray sets what Ray reads at import
    from ray import tune

    path = tune_dir(root, name)
    if not tune.Tuner.can_restore(path):
        eprint(f"[{name}] no saved Tune state at {path}: running the saved spec (complete trials skipped)")
        return run_study(study, **rerun)
    start(study, store, Connection(address, verbose=verbose))
    done_before = store.completed_trials(name)
    eprint(f"[{name}] restoring from {path}; {len(done_before)} trial(s) complete in storage")
    tuner = restored_tuner(study, store, root, path, done_before)
    if tuner is None:
        return run_study(study, **rerun)
    t0 = time.perf_counter()
    with store.lease(name):
        grid = fit(tuner, root, address)
    errors = finish(store, name, grid, time.perf_counter() - t0, "restored experiment finished")
    missing = [c for c in study.trials if trial_id(c) not in store.completed_trials(name)]
    if missing:  # trials Tune never got to before the driver died
        eprint(f"[{name}] {len(missing)} trial(s) were not in the restored experiment: running them")
        run_study(study, **rerun)
    return {"ran": len(grid), "errors": errors}


def restored_tuner(study: Study, store: Store, root: str, path: str, done_before: set[str]):
    """Tune's saved experiment with the param space handed again (Tune does not save it: trials it had not
    generated yet come from it; a trial that completed meanwhile is skipped by the trainable's own check). None
    when the saved state cannot be restored: the store still knows what is complete."""
    from ray import tune

    work = plan_work(study, store, done_before) or pending_work(study.trials, set(), {})
    space = param_space(study, root, work, threads(study))
    try:
        return tune.Tuner.restore(path, tune.with_resources(trial_function(study), trial_resources(study)),
                                  resume_unfinished=True, resume_errored=True, param_space=space)
    except Exception as e:  # a damaged tuner.pkl or experiment state
        eprint(f"[{study.name}] Tune's saved state at {path} cannot be restored ({type(e).__name__}: "
               f"{str(e).splitlines()[0][:200] if str(e) else ''}): running the saved spec (complete trials skipped)")
        return None


# -- evaluate ----------------------------------------------------------------------------------------------------------
def evaluate_study(name: str, *, storage: str, overrides: dict[str, Any], trials: list[str] | None = None,
                   checkpoints: bool = False, address: str | None = None, num_cpus: int | None = None,
                   verbose: bool = False) -> dict[str, Any]:
    """`loopstudy evaluate`: read the stored weights of the study's trained trials (or those named) under eval.*
    overrides, at their final weights and with `checkpoints` at every kept checkpoint, on Ray with the spec's
    resources. Each reading is stored as a trial of its own (study.trial.work); readings already stored are
    skipped, so running the command again after a dead driver finishes the rest. Returns counts."""
    root = resolve_root(storage)
    store = Store(root).require()
    study = evaluated_study(store, name)
    readings, skipped = plan_readings(store, study, overrides, trials, checkpoints)
    work = [WorkItem(None, source, rs) for source, rs in readings.items() if rs]
    n = sum(len(w.readings) for w in work)
    if skipped:
        eprint(f"[{name}] {skipped} reading(s) already stored: not run again")
    if not work:
        eprint(f"[{name}] nothing to evaluate: every reading asked for is stored")
        return {"ran": 0, "skipped": skipped, "errors": 0}
    store.lease(name).refuse_if_held()  # before Ray starts
    conn = Connection(address, num_cpus, verbose=verbose)
    start(study, store, conn)
    eprint(f"[{name}] {n} reading(s) of the stored weights of {len(work)} trial(s) on Ray ({conn.where}); "
           f"results -> {root}")
    t0 = time.perf_counter()
    with store.lease(name):
        tuner, _ = build_tuner(study, root, work, threads(study), evaluate=True)
        grid = fit(tuner, root, conn.address)
    errors = finish(store, name, grid, time.perf_counter() - t0, "evaluated")
    return {"ran": n, "skipped": skipped, "errors": errors}


def evaluated_study(store: Store, name: str) -> Study:
    """The study `evaluate` reads: its saved spec, or for trials written by `loopstudy trial` (no saved spec) a
    study of default resources."""
    from study.spec import load_saved_study

    if store.get_text(spec_file(name)) is None and name in store.studies():
        return Study(StudySpec(name=name), f"study {name} (no saved spec: default resources)")
    return load_saved_study(store, name)
