"""Optuna searches: the searcher hears the truth about trials the scheduler stopped early; the Optuna study lives
in a real Optuna storage, one per spec version, and a new driver continues it."""

import optuna
import pytest
from ray import tune

from study.errors import ConfigError
from study.run.optuna_storage import prepare
from study.run.search import StoppedIsPruned
from study.spec import load_study
from study.spec.optuna_location import check_location, storage_location

from .conftest import REPO


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


@pytest.mark.parametrize("ending,state", [
    ({"objective": 0.9, "final": 1, "trial": "t-same"}, optuna.trial.TrialState.COMPLETE),
    ({"objective": 0.4, "trial": "t-same"}, optuna.trial.TrialState.PRUNED),  # stopped early
])
def test_a_sample_that_resolves_to_a_running_trial_is_held_back_and_told_its_result(ending, state):
    """Two samples of one trial at once: the second is not handed to Tune (the trial runs once) and gets the first
    one's ending; a sample of another trial runs beside them."""
    same = StoppedIsPruned(space={"x": tune.choice([1])}, metric="objective", mode="max", seed=0,
                           resolve=lambda config: f"t-{config['x']}" if config["x"] != 1 else "t-same")
    assert same.suggest("tune-1") == {"x": 1}
    assert same.suggest("tune-2") is None  # the same trial is running: Tune asks again later
    same.on_trial_complete("tune-1", ending)
    trials = same._ot_study.trials
    assert [t.state for t in trials] == [state, state]
    assert all(t.user_attrs["loopstudy_trial_id"] == "t-same" for t in trials)
    if state == optuna.trial.TrialState.COMPLETE:
        assert [t.value for t in trials] == [0.9, 0.9]
    assert same.suggest("tune-3") == {"x": 1}  # the trial has ended: a new sample runs (and reads its rows)


def journal(path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


def test_the_search_lives_in_a_journal_in_the_results_root_and_is_continued(tmp_path):
    loc = storage_location(None, str(tmp_path), "hpo")
    assert loc == str(tmp_path / "_optuna" / "hpo.journal")
    first = prepare(loc, "hpo", "v1", ["max"])
    assert (first.name, first.finished) == ("hpo", 0)
    ot = optuna.load_study(study_name="hpo", storage=journal(loc))
    done, orphan = ot.ask(), ot.ask()
    ot.tell(done, 0.5)  # `orphan` stays RUNNING: its driver died
    again = prepare(loc, "hpo", "v1", ["max"])
    assert (again.name, again.finished) == ("hpo", 1)  # the orphan is FAIL, interrupted: sampled anew, not counted
    trials = {t.number: t for t in optuna.load_study(study_name="hpo", storage=journal(loc)).trials}
    assert trials[done.number].state == optuna.trial.TrialState.COMPLETE
    assert trials[orphan.number].state == optuna.trial.TrialState.FAIL and trials[orphan.number].user_attrs == {
        "interrupted": True}


def test_a_sample_left_running_whose_trial_completed_is_told_complete_with_its_stored_value(tmp_path):
    """Ctrl-C can stop the driver after a sample's trial stored its complete rows, before Tune told the searcher:
    the sample is COMPLETE with the stored value (not sampled again); one whose trial did not finish is
    interrupted; two samples that ran as one trial count once."""
    loc = storage_location(None, str(tmp_path), "hpo")
    prepare(loc, "hpo", "v1", ["max"])
    ot = optuna.load_study(study_name="hpo", storage=journal(loc))
    finished_run, cut_short = ot.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), ot.ask(
        {"x": optuna.distributions.FloatDistribution(0, 1)})
    stored = {finished_run.params["x"]: ("t-done", [0.75])}
    again = prepare(loc, "hpo", "v1", ["max"], settled=lambda params: stored.get(params["x"]))
    assert again.finished == 1 and again.sampled == 2
    assert again.continued == (cut_short.params,)  # its trial looks for the checkpoint it left; no other does
    trials = {t.number: t for t in optuna.load_study(study_name="hpo", storage=journal(loc)).trials}
    assert trials[finished_run.number].state.name == "COMPLETE" and trials[finished_run.number].value == 0.75
    assert trials[finished_run.number].user_attrs == {"loopstudy_trial_id": "t-done"}
    assert trials[cut_short.number].state.name == "FAIL" and trials[cut_short.number].user_attrs["interrupted"]
    # the cut-short sample is enqueued again: the search's next sample runs its trial, from its checkpoint
    waiting = [t for t in trials.values() if t.state.name == "WAITING"]
    assert len(waiting) == 1 and waiting[0].user_attrs == {"continues": cut_short.number}
    assert ot.ask({"x": optuna.distributions.FloatDistribution(0, 1)}).params == cut_short.params
    twin = ot.ask()
    twin.set_user_attr("loopstudy_trial_id", "t-done")
    ot.tell(twin, 0.75)
    assert prepare(loc, "hpo", "v1", ["max"]).finished == 1  # the same trial twice: one sample


def test_an_edited_spec_gets_its_own_optuna_study(tmp_path):
    loc = storage_location(None, str(tmp_path), "hpo")
    prepare(loc, "hpo", "v1", ["max"])
    edited = prepare(loc, "hpo", "v2", ["max"])
    assert edited.name == "hpo.v2" and edited.finished == 0
    assert {s.study_name for s in optuna.get_all_study_summaries(journal(loc))} == {"hpo", "hpo.v2"}


def test_an_object_store_root_keeps_its_journal_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPSTUDY_CACHE", str(tmp_path))
    assert storage_location(None, "s3://bucket/ls", "hpo") == str(tmp_path / "optuna" / "hpo.journal")
    assert storage_location("sqlite:///x.db", "s3://bucket/ls", "hpo") == "sqlite:///x.db"


@pytest.mark.parametrize("location,needle", [("redis://h/0", "an RDB URL"), (".", "is a folder")])
def test_a_storage_optuna_cannot_open_is_refused(location, needle):
    with pytest.raises(ConfigError, match=needle):
        check_location(location, "spec.yaml")


def test_the_storage_is_read_against_the_spec_folder_and_is_not_part_of_the_version(tmp_path):
    spec = (REPO / "search_spaces" / "optuna_hpo.yaml").read_text()
    (tmp_path / "hpo.yaml").write_text(spec)
    plain = load_study(tmp_path / "hpo.yaml")
    placed = load_study(tmp_path / "hpo.yaml", ["sweep.optuna.storage=searches/hpo.journal"])
    assert placed.optuna_storage("/elsewhere") == str(tmp_path / "searches" / "hpo.journal")
    assert plain.optuna_storage("/elsewhere") == "/elsewhere/_optuna/optuna_hpo.journal"
    assert placed.spec_hash == plain.spec_hash  # where the search is kept does not change what it runs


@pytest.mark.parametrize("name,cls", [("tpe", "TPESampler"), ("nsga2", "NSGAIISampler"), ("gp", "GPSampler")])
def test_each_spec_sampler_searches_two_objectives_under_a_constraint(name, cls):
    """The samplers a spec may name take two objectives and the constraints the searcher sets (Trial.set_constraint):
    a real Optuna study, asked and told as Tune's searcher does."""
    from study.run.search import sampler
    from study.spec.schema import Limit

    s = sampler(name, 0)
    assert type(s).__name__ == cls
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=s)
    limit = Limit(min=0.5)
    for _ in range(6):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        acc, flops = trial.params["x"], 1e6 * (1 + trial.params["x"])
        trial.set_constraint("final_exact_acc", limit.violation(acc))
        study.tell(trial, [acc, flops])
    assert len(study.trials) == 6 and all(len(t.values) == 2 for t in study.trials)
    assert all(t.params["x"] >= 0.5 for t in study.best_trials)  # the front holds feasible trials only


def test_two_samples_of_one_trial_at_the_same_time_train_it_once_and_both_get_its_result(tmp_path):
    """A space of one point: every sample is the same trial. With two samples at a time, the first trains, the one
    drawn beside it is held back and told its result; later samples read its stored rows; the search ends saying
    the space gave one distinct trial."""
    import json
    import subprocess
    import sys

    import polars as pl

    from study.store import Store

    spec = tmp_path / "one.yaml"
    spec.write_text("name: one\ntask: {name: sudoku, size: 4, n_train: 64, n_test: 8}\n"
                    "model: {hidden: 16, heads: 2, n_layers: 1, H: 1, L: 1}\n"
                    "train: {steps: 30, batch_size: 16, warmup: 2, log_every: 10}\neval: {depths: [2]}\n"
                    "sweep:\n  optuna:\n    metric: final_cell_acc\n    mode: max\n    num_samples: 2\n"
                    "    space: {model.L: {type: choice, values: [1]}}\n  max_concurrent: 2\nresources: {cpu: 1}\n")
    proc = subprocess.run([sys.executable, "-m", "study.cli", "run", str(spec), "--store", str(tmp_path / "r"),
                           "--num-cpus", "2", "--no-plot"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gave 1 distinct trial(s)" in proc.stderr, proc.stderr[-3000:]
    rows = pl.from_arrow(Store(tmp_path / "r").read("trials", "one"))
    assert rows.height == 1 and rows["status"].to_list() == ["complete"]
    trained = []
    for result in (tmp_path / "r" / "_tune" / "one").glob("*/result.json"):
        last = json.loads(result.read_text().splitlines()[-1])
        trained += [] if last.get("skipped") else [last["trial"]]
    assert trained == [rows["trial_id"][0]]  # one Tune trial trained it; the others read its rows
    samples = optuna.load_study(study_name="one", storage=journal(tmp_path / "r" / "_optuna" / "one.journal")).trials
    assert len(samples) >= 2 and {t.state.name for t in samples} == {"COMPLETE"}
    assert {t.value for t in samples} == {rows["final_cell_acc"][0]}
    assert {t.user_attrs["loopstudy_trial_id"] for t in samples} == {rows["trial_id"][0]}
