"""Ray Tune's OptunaSearch over the study's Optuna storage (study/run/optuna_storage.py), told the truth about
early-stopped trials: a trial that the scheduler (ASHA) ended before its final report is PRUNED in the Optuna
study, with its last reported value, not COMPLETE with a training accuracy passed off as the study's metric."""

from __future__ import annotations

from ray.tune.search.optuna import OptunaSearch

from study.run.optuna_storage import OptunaStudy, open_storage


class StoppedIsPruned(OptunaSearch):
    def __init__(self, *args, storage=None, study_name: str = "optuna", **kwargs):
        import optuna

        # our own handle on the storage (an in-memory one when none is given), to read trials back publicly
        storage = storage or optuna.storages.InMemoryStorage()
        super().__init__(*args, storage=storage, study_name=study_name, **kwargs)
        self.optuna_storage, self.optuna_study_name = storage, study_name
        self._storage_ids: dict[int, int] = {}  # Optuna trial number -> its id in the storage, looked up once

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
        if self._finished(trial_id):  # recorded already: telling it again would fail the driver
            self._ot_trials.pop(trial_id, None)  # (ray 2.60's private map, as above)
            return
        ot_trial = self._ot_trials.get(trial_id)
        if result is not None and result.get("trial") and ot_trial is not None:  # the row it left in the store
            ot_trial.set_user_attr("loopstudy_trial_id", result["trial"])
        if result is not None and not error and not result.get("final"):
            result = None  # OptunaSearch tells a trial without a value as PRUNED
        super().on_trial_complete(trial_id, result, error)


def searcher(ot: OptunaStudy, seed: int) -> StoppedIsPruned:
    """Tune's searcher over the search's Optuna study (Tune pickles it, storage and all, for resume)."""
    return StoppedIsPruned(storage=open_storage(ot.location), study_name=ot.name, seed=seed)
