"""Accuracy against test-time compute: the Pareto front of a hand-made study's readings, the best reading within a
budget, the figure, a search's front with constraints, and multi-objective specs refused line by line."""

from datetime import UTC, datetime

import numpy as np
import polars as pl
import pytest

from study.analysis.figures import plot
from study.analysis.front import nondominated, search_front
from study.analysis.pareto import Frontier, pareto
from study.analysis.tables import load_context
from study.config import TrialConfig, to_dict
from study.errors import AnalysisError, ConfigError
from study.spec import load_study
from study.spec.schema import OptunaSpec
from study.store import Store, config_row

from .conftest import REPO

# (exact accuracy, FLOPs per sample) per rule and depth, two seeds: seed 1 is seed 0 + 0.02 accuracy
READINGS = {
    "carry_last": {12: (0.50, 1e6), 48: (0.70, 4e6), 192: (0.60, 16e6)},  # overthinks past 48 layers
    "infiloop": {12: (0.45, 1.1e6), 48: (0.72, 4.4e6), 192: (0.80, 17.6e6)},
    "damped": {12: (0.40, 1e6), 48: (0.40, 1.5e6), 192: (0.40, 1.5e6)},  # halts early: the same cost at every depth
}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("pareto"))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for rule, depths in READINGS.items():
        for seed in (0, 1):
            cfg = to_dict(TrialConfig(seed=seed))
            cfg["model"]["carry"]["rule"] = rule
            tid = f"{rule[:3]}{seed}"
            store.write("depth_eval", "front", tid, [
                {"depth_layers": d, "outer_cycles": d // 12, "difficulty": None, "n": 100, "exact_acc": a + 0.02 * seed,
                 "cell_acc": 0.9, "halted_frac": 0.0, "eff_layers": float(d), "flops": f, "rollout_s": 0.01}
                for d, (a, f) in depths.items()])
            for table in ("dynamics", "perturbation", "train_curve"):
                store.write(table, "front", tid, [])
            store.write("trials", "front", tid, [{**config_row(cfg), "status": "complete", "params": 1,
                                                  "started": now, "ended": now, "wall_s": 1.0, "device": "cpu"}])
    return load_context(store, "front")


def test_nondominated_keeps_the_points_nothing_beats_on_both_objectives():
    points = np.array([[0.5, 1.0], [0.7, 4.0], [0.6, 16.0], [0.7, 5.0], [0.5, 1.0]])
    assert nondominated(points, [True, False]).tolist() == [True, True, False, False, True]  # ties both stay
    assert nondominated(points, [False, True]).tolist() == [True, False, True, False, True]


def test_the_front_is_the_hand_picked_readings_cheapest_first_with_cis_over_seeds(ctx):
    df = pareto(ctx)
    assert [(s, d) for s, d in df.select("setting", "depth_layers").iter_rows()] == [
        ("rule=carry_last", 12), ("rule=carry_last", 48), ("rule=infiloop", 48), ("rule=infiloop", 192)]
    assert df["exact_acc_mean"].to_list() == pytest.approx([0.51, 0.71, 0.73, 0.81])
    assert df["n"].to_list() == [2] * 4
    assert df["exact_acc_ci95"][0] == pytest.approx(12.706 * 0.02 / np.sqrt(2) / np.sqrt(2), rel=1e-3)
    every = pareto(ctx, Frontier(every_point=True))
    assert every.height == 9 and every["front"].sum() == 4


def test_a_budget_answers_the_most_accurate_reading_within_it(ctx):
    assert pareto(ctx, Frontier(budget=5e6)).select("setting", "depth_layers").row(0) == ("rule=infiloop", 48)
    assert pareto(ctx, Frontier(budget=1.2e6)).select("setting", "depth_layers").row(0) == ("rule=carry_last", 12)
    with pytest.raises(AnalysisError, match="costs 1000 FLOPs per sample or less; the cheapest costs 1e"):
        pareto(ctx, Frontier(budget=1e3))
    with pytest.raises(AnalysisError, match="unknown metric 'flops'"):
        pareto(ctx, Frontier(metric="flops"))


def test_the_front_over_chosen_settings_ignores_the_others_readings(ctx):
    def front(*settings):
        df = pareto(ctx, Frontier(settings=settings))
        return [(s, d) for s, d in df.select("setting", "depth_layers").iter_rows()]

    assert front("rule=carry_last", "rule=damped") == [("rule=carry_last", 12), ("rule=carry_last", 48)]
    assert front("rule=damped") == [("rule=damped", 12)]  # on no front of every setting's readings
    with pytest.raises(AnalysisError, match="'rule=nope': no reading of study 'front' has that setting; its "
                                            "settings: rule=carry_last"):
        pareto(ctx, Frontier(settings=("rule=nope",)))


def test_readings_without_flops_say_how_to_get_them(tmp_path):
    store = Store(tmp_path)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    row = {"depth_layers": 12, "outer_cycles": 1, "difficulty": None, "n": 8, "exact_acc": 0.5, "cell_acc": 0.5,
           "halted_frac": 0.0, "eff_layers": 12.0}
    store.write("depth_eval", "old", "t0", [row])
    store.write("trials", "old", "t0", [{**config_row(to_dict(TrialConfig())), "status": "complete", "params": 1,
                                         "started": now, "ended": now, "wall_s": 1.0}])
    with pytest.raises(AnalysisError, match="loopstudy evaluate"):
        pareto(load_context(store, "old"))


def test_the_pareto_figure_is_drawn_from_the_store(ctx, tmp_path):
    files = plot(ctx.store, "front", "pareto", tmp_path)
    assert sorted(p.suffix for p in files) == [".pdf", ".png"] and all(p.stat().st_size > 5000 for p in files)


def test_a_search_front_counts_only_feasible_complete_trials():
    trials = pl.DataFrame({"trial_id": ["a", "b", "c", "d", "e"],
                           "status": ["complete", "complete", "complete", "stopped", "complete"],
                           "final_exact_acc": [0.9, 0.95, 0.4, 0.99, 0.97],
                           "final_flops": [1e6, 2e6, 0.5e6, 0.1e6, 9e6]})
    search = OptunaSpec(metric=["final_exact_acc", "final_flops"], mode=["max", "min"],
                        constraints={"final_exact_acc": {"min": 0.5}}, space={"train.lr": {"type": "uniform",
                                                                                           "low": 0.1, "high": 1}})
    got = dict(search_front(trials, search).select("trial_id", "pareto").iter_rows())
    # c is cheapest but infeasible; d is best on both but stopped; e is most accurate of the feasible ones
    assert got == {"a": True, "b": True, "c": False, "d": None, "e": True}


@pytest.mark.parametrize("overrides,needle", [
    (["sweep.optuna.metric=[final_exact_acc, final_flop]"], "sweep.optuna.metric: 'final_flop' is not allowed"),
    (["sweep.optuna.mode=[max, minimise]"], "sweep.optuna.mode: 'minimise' is not allowed; allowed: 'max' or 'min'"),
    (["sweep.optuna.mode=max"], "must match one to one (2 metric(s), 1 mode(s))"),
    (["sweep.optuna.metric=[final_exact_acc, final_pass_at_2]"],
     "sweep.optuna.metric final_pass_at_2 is task arc's only; this search's task is 'sudoku': no trial would report"),
    (["sweep.optuna.constraints={final_acc: {min: 0.9}}"], "'final_acc' is not allowed"),
    (["sweep.optuna.constraints={final_pass_at_2: {min: 0.5}}"], "sweep.optuna.constraints final_pass_at_2 is task"),
    (["sweep.optuna.constraints={final_flops: {}}"], "a constraint needs min, max or both"),
    (["sweep.optuna.sampler=cmaes"], "sweep.optuna.sampler: 'cmaes' is not allowed; allowed: 'tpe', 'nsga2' or 'gp'"),
    (["sweep.asha={max_t: 100}"], "asha with several objectives"),
])
def test_bad_multi_objective_specs_are_refused_in_one_line(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_study(REPO / "search_spaces" / "pareto_search.yaml", overrides)
    assert needle in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


def test_the_report_and_the_python_api_show_the_front_and_the_paired_comparisons(ctx, tmp_path):
    from study.analysis.report import report
    from study.analysis.results import open_results

    page = report(ctx.store, "front", tmp_path / "r.html").read_text()
    assert 'id="pareto"' in page and 'id="compare-1"' in page and "Baseline <code>rule=carry_last</code>" in page
    assert open_results(ctx.store.uri).pareto("front").equals(pareto(ctx))


def test_a_single_objective_search_keeps_its_version_however_its_objective_is_spelled(tmp_path):
    base = (REPO / "search_spaces" / "optuna_hpo.yaml").read_text()
    spelled = tmp_path / "spelled.yaml"
    spelled.write_text(base.replace("    metric: final_exact_acc\n    mode: max\n",
                                    "    metric: [final_exact_acc]\n    mode: [max]\n    sampler: tpe\n"
                                    "    constraints: {}\n"))
    assert spelled.read_text() != base
    assert load_study(spelled).spec_hash == load_study(REPO / "search_spaces" / "optuna_hpo.yaml").spec_hash
    two = load_study(REPO / "search_spaces" / "optuna_hpo.yaml", ["sweep.asha=null", "sweep.optuna.sampler=nsga2"])
    assert two.spec_hash != load_study(REPO / "search_spaces" / "optuna_hpo.yaml", ["sweep.asha=null"]).spec_hash
