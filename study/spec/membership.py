"""Which trials belong to a study: the ones its current spec resolves to. Torch-free and Ray-free.

A study's name can be run again after its spec was edited; the trials of the earlier version stay in storage,
but they are not the study any more. The rule, stated once:
- a grid study's members are the trial ids its saved spec (`_studies/<name>.yaml`) resolves to, data files by
  content (edit a CSV and the old trials go stale), and the evaluations of their stored weights (`loopstudy
  evaluate`: a trials row whose `weights_of` is a member);
- an Optuna search's members are the trials run under the saved spec's version (`spec_hash` in the trials row;
  rows from before that column existed count as members);
- a study without a saved spec (rows written by `loopstudy trial`) has every trial as a member.
Everything else with files in the study is `stale`: counted by `status` and `ls`, left out of tables, figures,
report and importance unless asked for (`--all`, `include_stale=True`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from study.config import trial_id
from study.errors import ConfigError
from study.rows import STATUSES
from study.spec.schema import OptunaSpec
from study.store import TABLES, Store
from study.store.layout import file_trial_id, spec_file

KINDS = (*STATUSES, "pending", "stale")  # what a trial of a study can be, as status and ls count them


@dataclass
class Membership:
    """status: trial id -> one of KINDS, for every trial with files in the study and every expected one."""

    study: str
    status: dict[str, str] = field(default_factory=dict)
    optuna_samples: int | None = None  # an Optuna search: how many samples its spec asks for
    search: OptunaSpec | None = None  # an Optuna search: its objectives, modes and constraints
    note: str | None = None  # how membership was decided, when not by the spec's resolved trials
    evaluations: set[str] = field(default_factory=set)  # members added by `loopstudy evaluate` (not the spec's)

    @property
    def members(self) -> set[str]:
        return {t for t, s in self.status.items() if s not in ("stale", "pending")}

    @property
    def stale(self) -> set[str]:
        return {t for t, s in self.status.items() if s == "stale"}

    def counts(self) -> dict[str, int]:
        """Trials by kind: the spec's trials (evaluations added by `loopstudy evaluate` are counted apart)."""
        c = Counter(s for t, s in self.status.items() if t not in self.evaluations)
        return {k: c.get(k, 0) for k in KINDS}


def trial_states(store: Store, study: str) -> tuple[dict[str, str], dict[str, str | None], dict[str, str | None]]:
    """(trial id -> status, trial id -> spec_hash, trial id -> weights_of) of every trial with files in the study:
    `complete` by the store's rule, else its trials row's status, else `running` (files but no row yet)."""
    complete = store.completed_trials(study)
    started = {file_trial_id(f) for table in TABLES for f in store.files(table, study)} | complete
    rows = store.scan("trials", study, skip_bad=True).select("trial_id", "status", "spec_hash", "weights_of").collect()
    row_status = dict(zip(rows["trial_id"], rows["status"]))
    hashes = dict(zip(rows["trial_id"], rows["spec_hash"]))
    started |= set(row_status)
    def state(t: str) -> str:
        if t in complete:
            return "complete"
        row = row_status.get(t)
        return "pending" if row == "complete" else row or "running"  # complete row, a table missing: runs again

    return {t: state(t) for t in started}, hashes, dict(zip(rows["trial_id"], rows["weights_of"]))


def by_version(states: dict[str, str], hashes: dict[str, str | None], current: str) -> dict[str, str]:
    """Members by spec version: trials run under `current` (or before spec_hash existed); the rest are stale."""
    return {t: s if hashes.get(t) in (None, current) else "stale" for t, s in states.items()}


def membership(store: Store, study: str) -> Membership:
    """The study's trials by kind (see the module docstring)."""
    from study.spec import load_saved_study, saved_spec

    states, hashes, weights_of = trial_states(store, study)
    out = Membership(study)
    if store.get_text(spec_file(study)) is None:
        out.status = states
        out.evaluations = {t for t in states if weights_of.get(t)}
        return out
    try:
        saved = load_saved_study(store, study)
    except ConfigError as e:  # e.g. a data file the spec names is not on this machine: go by the spec's version
        out.note = f"trials matched by spec version, not by resolved config ({e})"
        out.status = by_version(states, hashes, saved_spec(store, study).spec_hash)
        return out
    if saved.is_optuna:
        out.optuna_samples = saved.spec.sweep.optuna.num_samples
        out.search = saved.spec.sweep.optuna
        out.status = by_version(states, hashes, saved.spec_hash)
        out.evaluations = {t for t in out.members if weights_of.get(t)}
        return out
    expected = {trial_id(c) for c in saved.trials}
    out.status = {t: (s if t in expected or weights_of.get(t) in expected else "stale") for t, s in states.items()}
    out.status.update({t: "pending" for t in expected - set(states)})
    out.evaluations = {t for t in out.members if t not in expected}
    return out
