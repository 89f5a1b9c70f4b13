"""Ray Tune's OptunaSearch over the study's Optuna storage (study/run/optuna_storage.py), told the truth about
early-stopped trials: a trial that the scheduler (ASHA) ended before its final report is PRUNED in the Optuna
study, with its last reported value, not COMPLETE with a training accuracy passed off as the study's metric.
The spec's sampler (TPE, NSGA-II or GP, one objective or several) and its constraints, each told to Optuna with
`Trial.set_constraint` before the trial's values, so its samplers prefer the trials that meet them.

Two samples that resolve to one loopstudy trial while it runs (a sampler that draws the same choice twice) run it
once: the second is held back, not handed to Tune, and told the first one's result when it ends (a sample drawn
after the trial finished reads its stored rows instead: study.run.trainable)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.tune.search.optuna import OptunaSearch

from study.run.optuna_storage import TRIAL_ID_ATTR, OptunaStudy, open_storage
from study.spec.schema import Limit, OptunaSpec


class StoppedIsPruned(OptunaSearch):
    def __init__(self, *args, storage=None, study_name: str = "optuna", constraints: dict[str, Limit] | None = None,
                 resolve: Callable[[dict[str, Any]], str | None] | None = None, **kwargs):
        import optuna

        # our own handle on the storage (an in-memory one when none is given), to read trials back publicly
        storage = storage or optuna.storages.InMemoryStorage()
        super().__init__(*args, storage=storage, study_name=study_name, **kwargs)
        self.optuna_storage, self.optuna_study_name = storage, study_name
        self._storage_ids: dict[int, int] = {}  # Optuna trial number -> its id in the storage, looked up once
        self.constraints = constraints or {}
        self.resolve = resolve  # a suggested config -> the loopstudy trial it runs as
        self._running: dict[str, str] = {}  # Tune trial id -> loopstudy trial id, for the trials handed to Tune
        self._twins: dict[str, list] = {}  # loopstudy trial id -> Optuna trials held back while it runs

    def suggest(self, trial_id: str):
        config = super().suggest(trial_id)
        tid = self.resolve(config) if self.resolve is not None and isinstance(config, dict) else None
        if tid is not None and tid in self._running.values():  # the same trial runs now: hold this sample back
            self._twins.setdefault(tid, []).append(self._ot_trials.pop(trial_id))  # (ray 2.60's private map)
            return None  # Tune asks again later
        if tid is not None:
            self._running[trial_id] = tid
        return config

    def _finished(self, trial_id: str) -> bool:
        """Whether the Optuna trial behind a Tune trial has finished in the storage already: a resumed driver's
        searcher (Tune's saved copy) may not know that a sample ended before the last driver died."""
        # Tune's map of its trials to Optuna's: private to ray 2.60's OptunaSearch (pinned in pyproject.toml); the
        # rest is Optuna's public storage API
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return False
        storage = self.optuna_storage
        if ot_trial.number not in self._storage_ids:
            study_id = storage.get_study_id_from_name(self.optuna_study_name)
            self._storage_ids[ot_trial.number] = storage.get_trial_id_from_study_id_trial_number(study_id,
                                                                                                 ot_trial.number)
        return storage.get_trial(self._storage_ids[ot_trial.number]).state.is_finished()

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if not self._finished(trial_id):
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        twins = self._twins.pop(self._running.pop(trial_id, ""), [])
        told = self._finished(trial_id)  # recorded already: telling it again would fail the driver
        ot_trial = self._ot_trials.pop(trial_id, None) if told else self._ot_trials.get(trial_id)
        ran_as = (result or {}).get("trial")  # the row it left in the store
        if result is not None and not error and not result.get("final"):
            result = None  # OptunaSearch tells a trial without a value as PRUNED
        for sample in [None if told else ot_trial, *twins]:
            if sample is not None:
                self._annotate(sample, ran_as, result)
        if not told:
            super().on_trial_complete(trial_id, result, error)
        for i, twin in enumerate(twins):  # the samples held back are told what this one was, as OptunaSearch tells
            twin_id = f"{trial_id}/twin{i}"
            self._ot_trials[twin_id] = twin  # (ray 2.60's private map, as above)
            super().on_trial_complete(twin_id, result, error)

    def _annotate(self, ot_trial, ran_as: str | None, result: dict | None) -> None:
        """The trial id a sample ran as (its rows' trial_id) and its constraints, before its values are told."""
        if ran_as:
            ot_trial.set_user_attr(TRIAL_ID_ATTR, ran_as)
        if result is not None:
            for metric, limit in self.constraints.items():
                if result.get(metric) is not None:
                    ot_trial.set_constraint(metric, limit.violation(float(result[metric])))


def sampler(name: str, seed: int):
    """The spec's Optuna sampler, seeded."""
    import optuna

    return {"tpe": optuna.samplers.TPESampler, "nsga2": optuna.samplers.NSGAIISampler,
            "gp": optuna.samplers.GPSampler}[name](seed=seed)


def searcher(ot: OptunaStudy, seed: int, spec: OptunaSpec,
             resolve: Callable[[dict[str, Any]], str | None] | None = None) -> StoppedIsPruned:
    """Tune's searcher over the search's Optuna study (Tune pickles it, storage and all, for resume). One objective:
    Tune's `objective` (its TuneConfig sets it); several: the searcher holds the metrics and their modes. The
    sampler's seed is the spec's plus the samples the study holds already: a search continued after an interruption
    draws on from there, where the spec's seed alone would draw its first samples again."""
    objectives = {"metric": spec.metrics, "mode": spec.modes} if spec.multi else {}
    return StoppedIsPruned(storage=open_storage(ot.location), study_name=ot.name,
                           sampler=sampler(spec.sampler, seed + ot.sampled),
                           constraints=spec.constraints, resolve=resolve, **objectives)
