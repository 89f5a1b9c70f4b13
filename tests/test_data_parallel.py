"""Trials trained by several data-parallel workers (resources.workers; study.run.workers, study.trial.data_parallel):
the same model as one worker trains, on workers that sit on different nodes of a real loopback cluster, resumed
from a checkpoint when a worker's node dies; and the spec's bad input refused in one line."""

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from safetensors.numpy import load_file

from study.config import build_trial, to_dict, trial_id
from study.errors import ConfigError
from study.rows import DEPTH_WALL_CLOCK
from study.run.preflight import check_resources
from study.spec import load_study
from study.store import Store
from study.trial.execute import TrialContext, evaluate_stored, run_trial
from study.trial.work import Reading

from .conftest import REPO
from .test_ray_studies import add_node, assert_rows_once, node_processes, remove_node

SPEC = REPO / "tests" / "specs" / "data_parallel.yaml"


READ_AGAIN = {"depths": [4, 8]}  # `loopstudy evaluate dp eval.depths=[4,8]`: a reading of the stored weights


def one_worker_reference(root: Path) -> tuple[str, str]:
    """Each trial of the spec trained and evaluated by one process, no Ray, and the first one's weights read again
    at other depths: what two workers must reproduce. Returns (that trial's id, its reading's id)."""
    trials = load_study(SPEC).trials
    for cfg in trials:
        cfg.train.threads = 1
        run_trial(cfg, context=TrialContext(Store(str(root)), "dp"))
    data = to_dict(trials[0])
    data["eval"].update(READ_AGAIN)
    reading = Reading(build_trial(data, "test"))
    evaluate_stored(trial_id(trials[0]), [reading], context=TrialContext(Store(str(root)), "dp"))
    return trial_id(trials[0]), reading.tid


def train_worker_nodes(resources: list[str]) -> set[str]:
    """The worker nodes (by their custom resource) running a Ray Train worker now."""
    return {r for r in resources if any("RayTrainWorker" in args for args in node_processes(r).values())}


@pytest.mark.ray
def test_two_workers_on_two_nodes_train_the_same_model_as_one_and_write_its_rows_once(ray_cluster, tmp_path):
    """Deep supervision with truncated BPTT, the progressive loss and ARC's puzzle embedding under sign-SGD: the
    loss curve, the final EMA weights and the depth rows of a 2-worker trial match one worker's, and so do the rows
    of `loopstudy evaluate` reading one trial's weights again on 2 workers (each worker rolls out half the test
    set)."""
    read_tid, reading_id = one_worker_reference(tmp_path / "one")
    driver = subprocess.Popen([sys.executable, "-m", "study.cli", "run", str(SPEC), "--address",
                               ray_cluster["address"], "--store", str(tmp_path / "two"), "--no-plot"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[str] = set()
    while driver.poll() is None:  # where the workers run, while they run (a worker node has one CPU)
        with contextlib.suppress(AssertionError):
            seen = max(seen, train_worker_nodes(["w1", "w2"]), key=len)
        time.sleep(0.5)
    out, err = driver.communicate()
    assert driver.returncode == 0, err[-3000:]
    assert seen == {"w1", "w2"}, "the two workers did not sit on different nodes"
    assert "done 2/2  running 0" in err  # one trial each in the driver's progress line
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    assert_rows_once(two, "dp", 2)
    trials = pl.from_arrow(Store(two).read("trials", "dp"))
    assert trials["workers"].to_list() == [2, 2] and set(trials["status"]) == {"complete"}

    def table(root, name, keys):
        return pl.from_arrow(Store(root).read(name, "dp")).sort(keys)

    c1, c2 = table(one, "train_curve", ["trial_id", "step"]), table(two, "train_curve", ["trial_id", "step"])
    assert c1["step"].to_list() == c2["step"].to_list()
    np.testing.assert_allclose(c2["loss"].to_numpy(), c1["loss"].to_numpy(), rtol=1e-5)
    assert c1["cell_acc"].to_list() == c2["cell_acc"].to_list()
    for f in glob.glob(f"{one}/_weights/dp/*/final.safetensors"):
        w1, w2 = load_file(f), load_file(f.replace(one, two))
        assert "puzzle.weight" in w1 and w1.keys() == w2.keys()
        for k in w1:
            np.testing.assert_allclose(w2[k], w1[k], atol=1e-6, err_msg=k)
    reread = subprocess.run([sys.executable, "-m", "study.cli", "evaluate", "dp", "eval.depths=[4,8]", "--trials",
                             read_tid, "--address", ray_cluster["address"], "--store", two, "--no-plot"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert reread.returncode == 0, reread.stderr[-3000:]
    readings = pl.from_arrow(Store(two).read("trials", "dp")).filter(pl.col("trial_id") == reading_id)
    assert readings["workers"].to_list() == [2]
    keys = ["trial_id", "depth_layers", "difficulty"]
    d1, d2 = table(one, "depth_eval", keys), table(two, "depth_eval", keys)
    assert reading_id in set(d2["trial_id"]) and d2["depth_layers"].n_unique() == 4  # 6, 12 and 4, 8
    assert d1.drop(DEPTH_WALL_CLOCK).equals(d2.drop(DEPTH_WALL_CLOCK))  # split and merged as one worker reads


@pytest.mark.ray
def test_asha_stops_and_optuna_searches_two_worker_trials_and_a_stopped_trial_frees_its_workers(ray_cluster, tmp_path):
    """An Optuna search with ASHA whose trials each take both worker nodes: a trial ASHA stops must end its Ray Train
    run (which holds both CPUs), or the next trial never starts."""
    overrides = ["model.hidden=16", "model.L=1", "task.n_train=64", "task.n_test=8", "train.steps=20",
                 "train.batch_size=16", "train.log_every=5", "train.warmup=2", "train.checkpoint_every=0",
                 "sweep.optuna.num_samples=3", "sweep.max_concurrent=1", "sweep.asha.grace_period=5",
                 "sweep.asha.max_t=20", "resources.workers=2"]
    store = str(tmp_path / "s")
    run = subprocess.run([sys.executable, "-m", "study.cli", "run", str(REPO / "search_spaces" / "optuna_hpo.yaml"),
                          *overrides, "--address", ray_cluster["address"], "--store", store, "--no-plot"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "done 3/3  running 0" in run.stderr  # each two-worker trial is one trial in the progress line
    trials = pl.from_arrow(Store(store).read("trials", "optuna_hpo"))
    assert trials.height == 3 and trials["workers"].to_list() == [2, 2, 2]
    assert set(trials["status"]) <= {"complete", "stopped"} and "stopped" in set(trials["status"])
    curve = pl.from_arrow(Store(store).read("train_curve", "optuna_hpo"))
    assert curve["trial_id"].n_unique() == 3 and not curve.select("trial_id", "step").is_duplicated().any()
    status = subprocess.run([sys.executable, "-m", "study.cli", "status", "optuna_hpo", "--store", store],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "Optuna samples complete" in status and "failed" not in status
    deadline = time.time() + 30
    while train_worker_nodes(["w1", "w2"]) and time.time() < deadline:
        time.sleep(0.5)
    assert not train_worker_nodes(["w1", "w2"]), "a Ray Train worker outlived its search"


# the node dies at a checkpoint Ray Train registered, mid-training (300 steps, 6 s of training, once ended before
# the kill landed)
KILL_STEPS = 600


@pytest.mark.ray
def test_a_two_worker_trial_resumes_from_its_checkpoint_when_a_worker_node_dies(ray_cluster, tmp_path):
    """On the shared cluster with a third worker node, w3, so that two nodes are left for the retry; the cluster
    is w1 and w2 again afterwards."""
    add_node("w3")
    killed: list[str] = []
    try:
        run_and_kill_a_worker_node(ray_cluster["address"], tmp_path, killed)
    finally:
        if set(killed) & {"w1", "w2"}:
            add_node(killed[0])  # the node the later tests know by that name
        if "w3" not in killed:
            remove_node("w3", ray_cluster["dashboard"])


def run_and_kill_a_worker_node(address: str, tmp_path: Path, killed: list[str]) -> None:
    """The test above, naming the node it kills in `killed`."""
    spec = tmp_path / "dp_kill.yaml"
    spec.write_text(SPEC.read_text().replace("name: dp", "name: dp_kill")
                    .replace("    - {name: progressive, train.n_sup: 1, train.progressive: 0.5, model.grad_steps: 3}\n",
                             "")
                    .replace("steps: 8,", f"steps: {KILL_STEPS},").replace("log_every: 2, checkpoint_every: 2}",
                                                                  "log_every: 40, checkpoint_every: 20}")
                    .replace("  seeds: [0]", "  seeds: [0]\n  max_failures: 2"))
    driver = subprocess.Popen([sys.executable, "-m", "study.cli", "run", str(spec), "--address", address, "--store",
                               str(tmp_path / "r"), "--no-plot"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    busy: set[str] = set()

    def results() -> list[Path]:
        return list((tmp_path / "r" / "_tune" / "dp_kill").glob("*/result.json"))

    # a checkpoint that Ray Train registered (one only written is not resumed from: Tune hears of it once it is)
    while not (busy and any("checkpoint_path" in f.read_text() for f in results())):
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        assert time.time() < deadline
        busy = train_worker_nodes(["w1", "w2", "w3"])
        time.sleep(0.1)
    killed.append("w3" if "w3" in busy else sorted(busy)[0])  # w3 if it can: the later tests need w1 and w2 only
    for pid in node_processes(killed[0]):  # a node with a worker on it dies mid-training
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out, err = driver.communicate(timeout=600)
    assert driver.returncode == 0, err[-3000:]
    root = str(tmp_path / "r")
    assert_rows_once(root, "dp_kill", 1)
    trial = Store(root).read("trials", "dp_kill").to_pylist()[0]
    assert trial["status"] == "complete" and trial["step"] == KILL_STEPS and trial["workers"] == 2
    reports = [json.loads(line) for f in results() for line in f.open()]
    resumed = {r["resumed_step"] for r in reports if r.get("resumed_step") is not None}
    assert resumed and min(resumed) > 0, "the trial started again from step 0"  # from its last checkpoint
    curve = pl.from_arrow(Store(root).read("train_curve", "dp_kill"))
    assert curve["step"].is_unique().all() and curve["step"].max() == KILL_STEPS


# A driver on the cluster, as init_ray starts one, whose actor reserves a CPU in a placement group and is killed
# holding it, as a stopped trial's Ray Train controller can be (study.run.leftovers): Ray keeps that group reserved
# while the driver lives. Prints the CPUs held before and after the driver releases its leftovers.
LEFTOVER_SCRIPT = """
import sys, time
from study.run.session import init_ray
init_ray(sys.argv[1])
import ray
from study.run.leftovers import release_leftover_placement_groups

@ray.remote(num_cpus=0)
class Controller:
    def reserve(self):
        group = ray.util.placement_group([{"CPU": 1}])
        ray.get(group.ready(), timeout=60)
        return group.id.hex()

def held(settle):
    time.sleep(settle)  # the resource view catches up within a second or two
    return ray.cluster_resources()["CPU"] - ray.available_resources().get("CPU", 0)

controller = Controller.remote()
ray.get(controller.reserve.remote(), timeout=120)
ray.kill(controller)
print("held", held(3))
print("released", release_leftover_placement_groups(grace_s=5))
print("held", held(3))
"""


# A second Ray on the machine, as a test of the other lane or a user's own runs one: Ray's state API, asked with no
# address, refuses to choose between two. Ends (and its Ray with it) when its standard input closes.
EMBEDDED_RAY = """
import sys, ray
ray.init(address="local", num_cpus=0, include_dashboard=False)
print("up", flush=True)
sys.stdin.read()
"""


@pytest.mark.ray
def test_a_driver_releases_the_placement_groups_its_dead_actors_left_reserved_beside_another_ray(ray_cluster):
    other = subprocess.Popen([sys.executable, "-c", EMBEDDED_RAY], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        assert other.stdout.readline() == "up\n"
        proc = subprocess.run([sys.executable, "-c", LEFTOVER_SCRIPT, ray_cluster["address"]], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
    finally:
        other.stdin.close()
        other.wait(60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["held", "1.0", "released", "1", "held", "0.0"], proc.stdout + proc.stderr[-2000:]


def spec_with(tmp_path: Path, *changes: tuple[str, str]) -> Path:
    text = SPEC.read_text()
    for old, new in changes:
        assert old in text
        text = text.replace(old, new)
    (tmp_path / "s.yaml").write_text(text)
    return tmp_path / "s.yaml"


def refusal(tmp_path: Path, resources: str) -> str:
    """What `loopstudy run` says of the spec with these resources: one line on stderr, exit 2 (checked here)."""
    spec = spec_with(tmp_path, ("resources: {cpu: 1, workers: 2}", resources))
    proc = subprocess.run([sys.executable, "-m", "study.cli", "run", str(spec), "--store", str(tmp_path / "r")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_a_spec_refuses_more_than_one_gpu_per_worker_naming_workers(tmp_path):
    assert "resources.gpu: 1 and resources.workers: 4" in refusal(tmp_path, "resources: {cpu: 1, gpu: 4}")


def test_a_global_batch_that_does_not_split_over_the_workers_is_refused_before_any_trial(tmp_path):
    study = load_study(spec_with(tmp_path, ("workers: 2", "workers: 3")))
    with pytest.raises(ConfigError, match=r"train.batch_size 8 does not split evenly over resources.workers=3"):
        check_resources(study, {"CPU": 8})
    with pytest.raises(ConfigError, match=r"resources.cpu=1.0 for each of resources.workers=3 but .* only 2 CPUs"):
        check_resources(study, {"CPU": 2})


def test_workers_sharing_a_fractional_gpu_are_refused_naming_the_fix(tmp_path):
    said = refusal(tmp_path, "resources: {cpu: 1, gpu: 0.5, workers: 2}")
    assert "each data-parallel worker needs a whole GPU. Set resources.gpu: 1" in said


def test_workers_no_node_can_hold_are_refused_naming_what_each_node_has(tmp_path):
    """4 CPUs in all, but a worker of 2 CPUs fits only on the 2-CPU node: 2 such workers can never run at once."""
    study = load_study(spec_with(tmp_path, ("resources: {cpu: 1, workers: 2}", "resources: {cpu: 2, workers: 2}")))
    nodes = [{"Resources": {"CPU": c}} for c in (0.0, 2.0, 1.0, 1.0)]
    with pytest.raises(ConfigError, match=r"nodes \(0 CPU, 2 CPU, 1 CPU, 1 CPU\) can hold 1 at once"):
        check_resources(study, {"CPU": 4.0}, nodes)
    check_resources(study, {"CPU": 6.0}, [*nodes, {"Resources": {"CPU": 2.0}}])  # a second 2-CPU node: fine
