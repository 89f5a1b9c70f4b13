"""Train once, read many times: stored weights, evaluations of them, checkpoints along training (study.run.plan,
study/trial/weights.py, `loopstudy evaluate`)."""

import hashlib
import json
import subprocess
import sys

import polars as pl
import pytest
from safetensors import safe_open

from study.analysis.results import open_results
from study.config import build_trial, reading_id, to_dict, trial_id
from study.errors import StoreError
from study.models.reasoner import build_reasoner
from study.rows import DEPTH_WALL_CLOCK
from study.run.driver import save_spec
from study.run.plan import pending_work
from study.spec import load_study
from study.store import Store
from study.store.layout import weights_file
from study.tasks.loader import load_task
from study.trial.execute import TrialContext, evaluate_stored, run_trial
from study.trial.work import Reading

from .conftest import REPO

SPEC = """
name: reads
task: {name: sudoku, size: 4, blanks: [6, 8], n_train: 200, n_test: 32}
model: {kind: nested, hidden: 16, heads: 2, n_layers: 1, H: 2, L: 2, carry: {rule: carry_last}}
train: {steps: 32, batch_size: 16, lr: 0.003, warmup: 4, n_sup: 2, log_every: 8, checkpoint_every: 4,
        keep_checkpoints: 2, threads: 1}
eval: {depths: [6, 12, 24]}
sweep:
  variants:
    - {name: last}
    - {name: max_conf, eval.readout: max_conf}
  seeds: [0]
resources: {cpu: 1}
"""


def loopstudy(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The spec's trained trial, run without Ray into a store that keeps the spec (as `loopstudy run` would)."""
    tmp = tmp_path_factory.mktemp("reads")
    (tmp / "spec.yaml").write_text(SPEC)
    study = load_study(tmp / "spec.yaml", [f"task.cache_dir={tmp / 'cache'}"])
    store = Store(tmp / "r")
    save_spec(store, study)
    cfg = study.trials[0]
    run_trial(cfg, context=TrialContext(store, "reads"))
    return tmp, store, study, cfg


def depth_rows(store, tid):
    return (pl.from_arrow(store.read("depth_eval", "reads")).filter(pl.col("trial_id") == tid)
            .drop("trial_id", "study").sort("depth_layers", "difficulty", nulls_last=True))


def test_a_trial_stores_its_final_weights_and_kept_checkpoints_with_hash_size_and_config(trained):
    tmp, store, _, cfg = trained
    tid = trial_id(cfg)
    row = store.trial_row("reads", tid)
    path = tmp / "r" / weights_file("reads", tid)
    data = path.read_bytes()
    assert row["weights_sha256"] == hashlib.sha256(data).hexdigest() and row["weights_bytes"] == len(data)
    with safe_open(str(path), "pt") as f:  # a safe format: tensors and a text header, readable without loopstudy
        meta, names = f.metadata(), set(f.keys())
    task = load_task(cfg.task)
    model = build_reasoner(cfg.model, task.spec)
    assert names == set(model.state_dict())  # every tensor of the model, nothing else
    assert meta["trial_id"] == tid and meta["step"] == "32" and json.loads(meta["config"]) == to_dict(cfg)
    # checkpoints every 4 batches of 2 steps, every 2nd kept: steps 16 and 32
    kept = json.loads(row["checkpoints"])
    assert sorted(map(int, kept)) == [16, 32]
    assert (tmp / "r" / weights_file("reads", tid, 16)).is_file()


def test_rereading_stored_weights_at_depths_already_read_gives_the_stored_numbers_exactly(trained):
    _, store, _, cfg = trained
    data = to_dict(cfg)
    data["eval"]["depths"] = [6, 24]
    reading = Reading(build_trial(data, "test"))
    evaluate_stored(trial_id(cfg), [reading], context=TrialContext(store, "reads"))
    got = depth_rows(store, reading.tid)
    want = depth_rows(store, trial_id(cfg)).filter(pl.col("depth_layers").is_in([6, 24]))
    assert got.height == want.height > 0 and got.drop(DEPTH_WALL_CLOCK).equals(want.drop(DEPTH_WALL_CLOCK))
    row = store.trial_row("reads", reading.tid)
    assert row["weights_of"] == trial_id(cfg) and row["weights_step"] == 32 and row["status"] == "complete"
    assert pl.from_arrow(store.read("train_curve", "reads")).filter(pl.col("trial_id") == reading.tid).height == 0


def test_a_weights_file_changed_after_it_was_stored_is_refused(trained, tmp_path):
    tmp, store, _, cfg = trained
    tid = trial_id(cfg)
    path = tmp / "r" / weights_file("reads", tid, 16)
    original = path.read_bytes()
    try:
        path.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        with pytest.raises(StoreError, match="changed or damaged after the trial stored it"):
            evaluate_stored(tid, [Reading(cfg, 16)], context=TrialContext(store, "reads"))
    finally:
        path.write_bytes(original)


def test_a_missing_checkpoint_file_costs_its_own_reading_only(trained):
    tmp, store, _, cfg = trained
    tid = trial_id(cfg)
    data = to_dict(cfg)
    data["eval"]["depths"] = [12]
    other = build_trial(data, "test")
    path = tmp / "r" / weights_file("reads", tid, 16)
    original = path.read_bytes()
    path.unlink()
    try:
        readings = [Reading(other, 16), Reading(other, 32), Reading(other)]
        missing = r"1 reading\(s\) not taken.*the other 2 stored.*step-0*16.safetensors is missing"
        with pytest.raises(StoreError, match=missing):
            evaluate_stored(tid, readings, context=TrialContext(store, "reads"))
        assert [store.is_complete("reads", r.tid) for r in readings] == [False, True, True]
    finally:
        path.write_bytes(original)
    evaluate_stored(tid, readings, context=TrialContext(store, "reads"))  # restored: the missing one only is read
    assert store.is_complete("reads", readings[0].tid)


def test_configs_that_differ_in_eval_keys_only_train_once():
    base = {"task": {"name": "sudoku", "size": 4}, "model": {"hidden": 16, "heads": 2}, "seed": 0}
    a = build_trial(base, "t")
    b = build_trial({**base, "eval": {"readout": "max_conf"}}, "t")
    c = build_trial({**base, "model": {"hidden": 32, "heads": 2}}, "t")
    work = pending_work([a, b, c], set(), {})
    assert [(w.train is not None, len(w.readings)) for w in work] == [(True, 1), (True, 0)]
    assert work[0].train == a and work[0].readings[0].cfg == b
    # a's trial complete with stored weights: b reads them, nothing trains
    work = pending_work([a, b], {trial_id(a)}, {trial_id(a): {"weights_sha256": "x"}})
    assert [(w.train, w.weights_of, [r.tid for r in w.readings]) for w in work] == [(None, trial_id(a),
                                                                                      [trial_id(b)])]
    # complete but without stored weights (an older trial): the pending one trains
    work = pending_work([a, b], {trial_id(a)}, {trial_id(a): {"weights_sha256": None}})
    assert work[0].train == b and not work[0].readings
    assert reading_id(a, 16) != reading_id(a) == trial_id(a)


@pytest.mark.parametrize("args, needle", [
    (["model.hidden=64"], "model.hidden: an evaluation changes eval.* keys only"),
    (["eval.depthz=[4]"], "eval.depthz: not an eval key"),
    ([], "nothing to evaluate: give eval.* overrides"),
    (["eval.depths=[6]", "--trials", "feedc0ffee00"], "--trials feedc0ffee00: not a complete trained trial"),
])
def test_evaluate_refuses_bad_input_in_one_line(trained, args, needle):
    tmp, *_ = trained
    proc = loopstudy("evaluate", "reads", "--store", str(tmp / "r"), *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_evaluate_refuses_a_study_whose_trials_stored_no_weights(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC.replace("keep_checkpoints: 2, ", ""))
    study = load_study(tmp_path / "spec.yaml", [f"task.cache_dir={tmp_path / 'cache'}", "train.steps=8"])
    store = Store(tmp_path / "r")
    save_spec(store, study)
    cfg = study.trials[0]
    run_trial(cfg, context=TrialContext(store, "reads"))
    row = store.trial_row("reads", trial_id(cfg))
    store.write("trials", "reads", trial_id(cfg), [{**row, "weights_sha256": None, "weights_bytes": None}])
    proc = loopstudy("evaluate", "reads", "--store", str(tmp_path / "r"), "eval.depths=[6]")
    assert proc.returncode == 2 and "stored weights (they ran before loopstudy kept them)" in proc.stderr, \
        proc.stderr
    store.write("trials", "reads", trial_id(cfg), [row])
    proc = loopstudy("evaluate", "reads", "--store", str(tmp_path / "r"), "--checkpoints")
    assert proc.returncode == 2 and "no trial of study reads kept weights along training" in proc.stderr, \
        proc.stderr


@pytest.mark.ray
def test_a_study_reads_eval_variants_from_one_training_and_evaluate_reads_checkpoints_on_ray(ray_cluster, tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC.replace("seeds: [0]", "seeds: [0, 1]"))
    addr = ["--address", ray_cluster["address"], "--store", str(tmp_path / "r")]
    proc = loopstudy("run", str(tmp_path / "spec.yaml"), *addr, "--no-plot")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 to train, 2 evaluation(s) of weights trained once" in proc.stderr
    store = Store(tmp_path / "r")
    trials = pl.from_arrow(store.read("trials", "reads"))
    assert trials.height == 4
    reads = trials.filter(pl.col("label") == "max_conf")
    assert set(reads["weights_of"]) == set(trials.filter(pl.col("label") == "last")["trial_id"])
    curves = pl.from_arrow(store.read("train_curve", "reads"))
    assert set(curves["trial_id"]) == set(reads["weights_of"])  # trained twice, not four times

    proc = loopstudy("evaluate", "reads", *addr, "eval.depths=[6,12]", "--checkpoints",
                     "--figures", str(tmp_path / "fig"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 reading(s) of the stored weights of 2 trial(s)" in proc.stderr  # final and step 16, per trial
    assert (tmp_path / "r" / "_tune" / "_evaluate" / "reads").is_dir()  # the study's own run stays resumable
    table = proc.stdout.splitlines()
    assert "train_step" in table[0] and sum("last depths=[6, 12]" in line for line in table) == 4  # 2 steps x 2
    assert (tmp_path / "fig" / "reads_checkpoints.png").is_file()
    evaluations = open_results(tmp_path / "r").evaluations("reads")
    assert evaluations.height == 8 and evaluations["trained_trial"].n_unique() == 2
    # a reading is named by what it changes: the spec's own settings keep their names beside `evaluate`'s depths
    assert set(evaluations["setting"]) == {"last", "max_conf", "last depths=[6, 12]"}  # the trained trials first
    assert set(open_results(tmp_path / "r").table("depth", "reads")["setting"]) == {
        "last", "max_conf", "last depths=[6, 12]"}
    page = open_results(tmp_path / "r").report("reads", tmp_path / "fig").read_text()
    assert 'id="table-checkpoints"' in page and 'id="figure-checkpoints"' in page
    assert "4 readings of the trials" in page  # the summary counts the evaluations apart from the trials
    status = loopstudy("status", "reads", "--store", str(tmp_path / "r"))
    assert "reads: 4/4 trials complete" in status.stdout, status.stdout + status.stderr
    assert "4 evaluation(s) of their stored weights" in status.stdout  # evaluations of members are members
    again = loopstudy("evaluate", "reads", *addr, "eval.depths=[6,12]", "--checkpoints", "--no-plot")
    assert again.returncode == 0 and "4 reading(s) already stored" in again.stderr
    assert "nothing to evaluate" in again.stderr
