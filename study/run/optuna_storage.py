"""Where an Optuna search's study lives: a real Optuna storage, which optuna-dashboard opens and a resumed or
repeated run continues. Ray-free (the searcher is study.run.search).

Where it lives is study.spec.optuna_location's rule. The Optuna study is named after the study
and keeps the spec version it runs (`spec_hash`, a user attribute); a spec edited since gets its own Optuna study,
`<name>.<spec_hash>`, just as its trials are the study's members (study.spec.membership). So `optuna-dashboard
<root>/_optuna/<name>.journal` opens the search, and `loopstudy run` or `resume` of the same spec continues it:
samples already finished count towards num_samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from study.errors import ConfigError
from study.paths import is_uri, redacted
from study.spec.optuna_location import rdb_scheme

FINISHED = ("COMPLETE", "PRUNED", "FAIL")
INTERRUPTED = "interrupted"  # a sample its driver's death cut short: FAIL, not counted towards num_samples
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
    """Where a search's Optuna study is, its name for this spec version, and how many samples it has finished."""

    location: str
    name: str
    finished: int


def prepare(location: str, study: str, spec_hash: str, modes: list[str]) -> OptunaStudy:
    """Create (or find) the Optuna study of this spec version, for a driver about to run the search (holding the
    study's lease). Trials left RUNNING by a driver that died are marked FAIL with user attribute `interrupted`:
    one driver runs a study at a time, so none of them is running; they do not count as finished samples."""
    import optuna
    from optuna.trial import TrialState

    try:
        storage = open_storage(location)
        existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    except Exception as e:  # whatever the storage's client raises, said in one line before anything starts
        raise unopenable(location, e) from None
    name = study
    if name in existing and existing[name].user_attrs.get("spec_hash") not in (None, spec_hash):
        name = f"{study}.{spec_hash}"  # the spec changed: its own search, as its trials are its own members
    ot = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                             directions=[direction(m) for m in modes])
    ot.set_user_attr("spec_hash", spec_hash)
    ot.set_user_attr("loopstudy_study", study)
    study_id = storage.get_study_id_from_name(name)
    for t in ot.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        tid = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        storage.set_trial_user_attr(tid, INTERRUPTED, True)
        storage.set_trial_state_values(tid, TrialState.FAIL)
    finished = sum(1 for t in ot.get_trials(deepcopy=False)
                   if t.state.name in FINISHED and not t.user_attrs.get(INTERRUPTED))
    return OptunaStudy(location, name, finished)
