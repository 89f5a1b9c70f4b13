"""Ray Tune's OptunaSearch, told the truth about early-stopped trials: a trial that the scheduler (ASHA) ended
before its final report is PRUNED in the Optuna study, with its last reported value, not COMPLETE with a training
accuracy passed off as the study's metric."""

from __future__ import annotations

from ray.tune.search.optuna import OptunaSearch


class StoppedIsPruned(OptunaSearch):
    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if result is not None and not error and not result.get("final"):
            result = None  # OptunaSearch tells a trial without a value as PRUNED
        super().on_trial_complete(trial_id, result, error)
