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

from study.paths import is_uri

FINISHED = ("COMPLETE", "PRUNED", "FAIL")
INTERRUPTED = "interrupted"  # a sample its driver's death cut short: FAIL, not counted towards num_samples


def open_storage(location: str):
    """An Optuna storage: RDBStorage for a URL, JournalStorage over a file otherwise (its folder created)."""
    import optuna

    if is_uri(location):
        return optuna.storages.RDBStorage(location)
    from optuna.storages.journal import JournalFileBackend

    Path(location).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(location))


@dataclass(frozen=True)
class OptunaStudy:
    """Where a search's Optuna study is, its name for this spec version, and how many samples it has finished."""

    location: str
    name: str
    finished: int


def prepare(location: str, study: str, spec_hash: str, mode: str) -> OptunaStudy:
    """Create (or find) the Optuna study of this spec version, for a driver about to run the search (holding the
    study's lease). Trials left RUNNING by a driver that died are marked FAIL with user attribute `interrupted`:
    one driver runs a study at a time, so none of them is running; they do not count as finished samples."""
    import optuna
    from optuna.trial import TrialState

    storage = open_storage(location)
    existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    name = study
    if name in existing and existing[name].user_attrs.get("spec_hash") not in (None, spec_hash):
        name = f"{study}.{spec_hash}"  # the spec changed: its own search, as its trials are its own members
    ot = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                             direction="maximize" if mode == "max" else "minimize")
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
