"""Where an Optuna search's study lives: a real Optuna storage, which optuna-dashboard opens and a resumed or
repeated run continues. Ray-free (the searcher is study.run.search).

Where it lives is study.spec.optuna_location's rule. The Optuna study is named after the study
and keeps the spec version it runs (`spec_hash`, a user attribute); a spec edited since gets its own Optuna study,
`<name>.<spec_hash>`, just as its trials are the study's members (study.spec.membership). So `optuna-dashboard
<root>/_optuna/<name>.journal` opens the search, and `loopstudy run` or `resume` of the same spec continues it:
samples already finished count towards num_samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from study.errors import ConfigError
from study.paths import is_uri, redacted
from study.spec.optuna_location import rdb_scheme

FINISHED = ("COMPLETE", "PRUNED", "FAIL")
TRIAL_ID_ATTR = "loopstudy_trial_id"  # the trial a sample ran as (its rows' trial_id), set when it ends
INTERRUPTED = "interrupted"  # a sample its driver's death cut short: FAIL, not counted towards num_samples
CONTINUES = "continues"  # an enqueued sample's attribute: the number of the interrupted sample it continues
SEARCHED = "searched/"  # how OptunaSearch names a pick: Tune's config key of the picks, then the dotted key
DRIVERS = {"postgresql": "psycopg2-binary", "mysql": "PyMySQL (and a mysql+pymysql:// URL)", "oracle": "oracledb",
           "mssql": "pyodbc"}  # what `pip install` gives an RDB URL's default driver
CONNECT_TIMEOUT_S = 10  # a database server that does not answer in this long is not there


def open_storage(location: str):
    """An Optuna storage: RDBStorage for a URL, JournalStorage over a file otherwise (its folder created)."""
    import optuna

    if is_uri(location):
        # the servers whose default drivers take connect_timeout (psycopg2, PyMySQL); sqlite has no server
        kwargs = ({"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
                  if rdb_scheme(location) in ("postgresql", "mysql") else {})
        return optuna.storages.RDBStorage(location, engine_kwargs=kwargs)
    from optuna.storages.journal import JournalFileBackend

    Path(location).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(location))


def unopenable(location: str, e: Exception) -> ConfigError:
    """One line for an Optuna storage that cannot be opened: what it said, and what to install or set (a
    password in the URL is never printed)."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200].replace(location, redacted(location))
    where = f"sweep.optuna.storage {redacted(location)}"
    if isinstance(e, ImportError) or "import DB access module" in first:  # Optuna's words for a missing driver
        return ConfigError(f"{where}: its database driver is not installed here: pip install "
                           f"{DRIVERS.get(rdb_scheme(location), 'the driver its URL names')}")
    if not is_uri(location):
        return ConfigError(f"{where} is not an Optuna journal file ({type(e).__name__}: {first}); give another "
                           "path, or move the file away to start a new search there")
    return ConfigError(f"{where} cannot be opened ({first}); check that the database (or, for sqlite, its "
                       "folder) exists and can be reached")


def direction(mode: str) -> str:
    """Optuna's word for a spec's mode."""
    return "maximize" if mode == "max" else "minimize"


@dataclass(frozen=True)
class OptunaStudy:
    """Where a search's Optuna study is, its name for this spec version, how many distinct samples it has finished
    (two samples that resolve to one trial count once: the second was not run) and how many it has asked for in
    all (the resumed sampler's seed moves on by this, so it does not replay the samples already drawn)."""

    location: str
    name: str
    finished: int
    sampled: int = 0
    # the picks of every sample a driver's interruption cut short ({dotted key: value}): a trial of one of them
    # looks for the checkpoint an earlier Tune trial of it left (study.run.carried); no other trial needs to
    continued: tuple[dict[str, Any], ...] = ()


def search_name(existing: dict, study: str, spec_hash: str) -> str:
    """The Optuna study of this spec version, given the storage's {name: summary}: the study's name, or when that
    one runs another spec version, `<name>.<spec_hash>` (its own search, as its trials are its own members)."""
    if study in existing and existing[study].user_attrs.get("spec_hash") not in (None, spec_hash):
        return f"{study}.{spec_hash}"
    return study


def prepare(location: str, study: str, spec_hash: str, modes: list[str],
            settled: Callable[[dict[str, Any]], tuple[str, list[float]] | None] | None = None) -> OptunaStudy:
    """Create (or find) the Optuna study of this spec version, for a driver about to run the search (holding the
    study's lease). One driver runs a study at a time, so no trial left RUNNING by an earlier driver (killed, or
    stopped by Ctrl-C before Tune told the searcher) is running: `settled(params)` says whether its sample ran to
    completion anyway ((the loopstudy trial id, its objective values) from the results store): it is then told
    COMPLETE with those values; otherwise it is marked FAIL with user attribute `interrupted`, does not count as a
    finished sample, and its parameters are enqueued: the search's next sample is the same trial, which continues
    from the checkpoint the interrupted one left (study.run.carried)."""
    import optuna
    from optuna.trial import TrialState

    try:
        storage = open_storage(location)
        existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    except Exception as e:  # whatever the storage's client raises, said in one line before anything starts
        raise unopenable(location, e) from None
    name = search_name(existing, study, spec_hash)
    ot = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                             directions=[direction(m) for m in modes])
    ot.set_user_attr("spec_hash", spec_hash)
    ot.set_user_attr("loopstudy_study", study)
    study_id = storage.get_study_id_from_name(name)
    for t in ot.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        tid = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        done = settled(t.params) if settled is not None else None
        if done is not None:
            storage.set_trial_user_attr(tid, TRIAL_ID_ATTR, done[0])
            storage.set_trial_state_values(tid, TrialState.COMPLETE, done[1])
            continue
        storage.set_trial_user_attr(tid, INTERRUPTED, True)
        storage.set_trial_state_values(tid, TrialState.FAIL)
        ot.enqueue_trial(t.params, user_attrs={CONTINUES: t.number})
    trials = ot.get_trials(deepcopy=False)
    asked = [t for t in trials if t.state != TrialState.WAITING]  # (an enqueued sample is not drawn by the sampler)
    continued = tuple({k.removeprefix(SEARCHED): v for k, v in t.params.items()} for t in trials
                      if t.user_attrs.get(INTERRUPTED))
    return OptunaStudy(location, name, len(finished_samples(trials)), len(asked), continued)


def finished_samples(trials) -> set[str]:
    """The distinct samples among Optuna trials: finished, not cut short by a driver's death, one per loopstudy
    trial they ran as (two samples that resolved to one trial count once)."""
    return {t.user_attrs.get(TRIAL_ID_ATTR, f"#{t.number}") for t in trials
            if t.state.name in FINISHED and not t.user_attrs.get(INTERRUPTED)}


def peek(location: str, study: str, spec_hash: str) -> int:
    """The distinct samples a search has finished, read without creating or changing anything (a dry run): 0 when
    its Optuna study does not exist yet. As prepare counts them; samples left RUNNING count as not finished."""
    import optuna

    if not is_uri(location) and not Path(location).exists():
        return 0
    try:
        storage = open_storage(location)
        summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    except Exception as e:
        raise unopenable(location, e) from None
    name = search_name(summaries, study, spec_hash)
    if name not in summaries:
        return 0
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    return len(finished_samples(trials))
