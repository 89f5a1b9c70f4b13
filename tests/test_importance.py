"""`loopstudy importance`: Optuna's evaluators rank the knobs a study swept, from the stored trials alone."""

from datetime import UTC, datetime

import pytest

from study.analysis.importance import importance
from study.config import TrialConfig, to_dict
from study.errors import AnalysisError
from study.store import Store, config_row


def write_trials(store, study, points):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for i, (rule, beta, seed, acc) in enumerate(points):
        cfg = to_dict(TrialConfig(seed=seed))
        cfg["model"]["carry"].update(rule=rule, beta_init=beta)
        store.write("trials", study, f"t{i:02d}", [{**config_row(cfg), "status": "complete", "params": 1,
                                                   "started": now, "ended": now, "wall_s": 1.0,
                                                   "final_exact_acc": acc}])


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path)
    # the rule decides accuracy; beta_init barely moves it
    write_trials(s, "knobs", [(rule, beta, seed, (0.9 if rule == "infiloop" else 0.3) + 0.01 * beta + 0.002 * seed)
                              for rule in ("carry_last", "infiloop") for beta in (0.1, 0.55, 0.9)
                              for seed in (0, 1)])
    write_trials(s, "seeds_only", [("carry_last", 0.55, seed, 0.5 + 0.1 * seed) for seed in range(3)])
    return s


@pytest.mark.parametrize("evaluator", ["fanova", "mdi", "ped_anova"])
def test_the_knob_that_decides_accuracy_ranks_first(store, evaluator):
    df = importance(store, "knobs", evaluator=evaluator)
    assert set(df["knob"]) == {"model.carry.rule", "model.carry.beta_init"}
    assert abs(df["importance"].sum() - 1) < 1e-6
    if evaluator != "ped_anova":  # PED-ANOVA ranks within the top quantile, not the whole range
        assert df["knob"][0] == "model.carry.rule" and df["importance"][0] > 0.8


def test_a_study_without_swept_knobs_says_so(store):
    with pytest.raises(AnalysisError, match="sweeps no knob"):
        importance(store, "seeds_only")
    with pytest.raises(AnalysisError, match="metric 'wat'"):
        importance(store, "knobs", metric="wat")


def test_importance_command_prints_the_ranking(store, capsys):
    from study.cli import main

    assert main(["importance", "knobs", "--store", store.uri, "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("knob,importance") and out[1].startswith("model.carry.rule,")


def test_too_few_trials_for_the_knobs_are_refused(tmp_path):
    s = Store(tmp_path)
    write_trials(s, "few", [("carry_last", 0.1, 0, 0.3), ("infiloop", 0.9, 0, 0.9), ("infiloop", 0.5, 0, 0.8)])
    with pytest.raises(AnalysisError, match="3 complete trial.*2 swept knob.*at least 4"):
        importance(s, "few")


def test_knobs_that_change_together_are_refused_as_confounded(tmp_path):
    s = Store(tmp_path)
    # rule and beta_init move in lockstep over six trials: no evaluator can tell which one matters
    write_trials(s, "tied", [(rule, beta, seed, acc) for (rule, beta, acc) in
                             (("carry_last", 0.1, 0.3), ("infiloop", 0.9, 0.9), ("damped", 0.5, 0.6))
                             for seed in (0, 1)])
    with pytest.raises(AnalysisError, match="change together.*model.carry.rule and model.carry.beta_init"):
        importance(s, "tied")
