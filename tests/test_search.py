"""The Optuna searcher hears the truth about trials the scheduler stopped early."""

import optuna
import pytest
from ray import tune

from study.search import StoppedIsPruned


@pytest.mark.parametrize("result,state", [
    ({"objective": 0.4, "step": 20}, optuna.trial.TrialState.PRUNED),  # stopped by ASHA: no final report
    ({"objective": 0.9, "step": 60, "final": 1}, optuna.trial.TrialState.COMPLETE),
])
def test_a_stopped_trial_is_pruned_and_a_finished_one_complete(result, state):
    search = StoppedIsPruned(space={"x": tune.uniform(0, 1)}, metric="objective", mode="max", seed=0)
    assert search.suggest("t1") is not None
    search.on_trial_result("t1", {**result, "training_iteration": 1})
    search.on_trial_complete("t1", result)
    trial = search._ot_study.trials[0]
    assert trial.state == state
    if state == optuna.trial.TrialState.COMPLETE:
        assert trial.value == 0.9
