"""Studies on a real Ray cluster (head + 2 worker nodes as separate processes on 127.0.0.1).

Order matters only for speed: the node-kill test goes last (it takes a worker away).
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.request import urlopen

import optuna
import polars as pl
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from study.store import Store

from .conftest import CLUSTER_PORT, REPO, local_cluster

pytestmark = pytest.mark.ray


def loopstudy(*args, timeout=600, **kw):
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, **kw)


def complete_ids(root, study):
    return Store(root).completed_trials(study)


def assert_rows_once(root, study, n_trials):
    store = Store(root)
    trials = pl.from_arrow(store.read("trials", study))
    assert trials.height == n_trials and trials["trial_id"].n_unique() == n_trials
    depth = pl.from_arrow(store.read("depth_eval", study))
    per = depth.group_by("trial_id").len()
    assert per.height == n_trials and per["len"].n_unique() == 1  # same rows per trial: none lost, none twice
    assert depth.select(pl.struct("trial_id", "depth_layers", "difficulty").is_duplicated().any()).item() is False


# The README's study made small: what is asserted here is the path, not how well it learns or reads at depth
SMOKE = ("search_spaces/smoke.yaml", "train.steps=60", "train.log_every=20", "task.n_test=32", "eval.depths=[12,48]")


@pytest.fixture(scope="module")
def smoke_run(ray_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    # the earlier spellings --storage / --out still work beside --store / --figures
    proc = loopstudy("run", *SMOKE, "--address", ray_cluster["address"], "--storage", str(root), "--figures",
                     str(root / "figures"))
    return root, proc


def test_smoke_study_runs_end_to_end_through_loopstudy_run(smoke_run):
    root, proc = smoke_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    # ends with the depth table as the report shows it: a column per setting, mean ± CI, no constant column
    header = proc.stdout.splitlines()[0].split()
    assert header == ["depth_layers", "fprm", "infiloop_both", "trm_carry_last"], proc.stdout
    assert "source" not in proc.stdout and "measured" not in proc.stdout
    assert "done 3/3  running 0" in proc.stderr  # the running count is exact, not Tune's lagging status
    # progress lines name settings, not trial ids
    assert "finished trm_carry_last seed 0" in proc.stderr, proc.stderr[-3000:]
    assert not any(tid in proc.stderr for tid in complete_ids(root, "smoke"))
    assert_rows_once(root, "smoke", 3)
    reports = [json.loads(line) for f in (root / "_tune" / "smoke").glob("*/result.json") for line in f.open()]
    assert {r.get("phase") for r in reports} >= {"train"}  # what the driver's status lines are made of
    store = Store(root)
    for table in ("train_curve", "dynamics", "perturbation"):
        assert len(store.files(table, "smoke")) == 3
    assert list((root / "figures").glob("smoke_depth.png"))


def test_trials_run_on_both_worker_nodes(smoke_run):
    root, _ = smoke_run
    nodes = pl.from_arrow(Store(root).read("trials", "smoke"))["node"]
    assert nodes.n_unique() == 2


def test_running_a_finished_study_again_reruns_nothing(smoke_run, ray_cluster):
    root, _ = smoke_run
    before = {p: p.stat().st_mtime_ns for p in (root / "trials").rglob("*.parquet")}
    proc = loopstudy("run", *SMOKE, "--address", ray_cluster["address"], "--store", str(root), "--no-plot")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "3 trial(s) already complete" in proc.stderr and "nothing to run" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in (root / "trials").rglob("*.parquet")} == before


def test_a_dry_run_shows_what_would_run_and_skip_on_the_cluster_and_starts_nothing(smoke_run, ray_cluster, tmp_path):
    root, _ = smoke_run
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    proc = loopstudy("run", *SMOKE, "--dry-run", "--address", ray_cluster["address"], "--store", str(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("skip (complete)") == 3 and "would run 0 of 3" in proc.stderr
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing stored, no lease taken
    # a paper spec asking for GPUs, checked on a CPU cluster: the refusal is reported, not fatal
    paper = loopstudy("run", "search_spaces/paper/beta_init.yaml", "--dry-run", "--address", ray_cluster["address"],
                      "--store", str(tmp_path / "paper"))
    assert paper.returncode == 0, paper.stderr[-3000:]
    assert paper.stdout.count(" run ") == 18 and "would run 18 of 18" in paper.stderr
    assert "a run here would be refused" in paper.stderr and "resources.gpu=1" in paper.stderr
    assert "the cluster offers" in paper.stderr and not (tmp_path / "paper").exists()
    # every refusal named, and the shipped specs' placeholder bucket named as one, never looked up
    hrm = loopstudy("run", "search_spaces/paper/hrm.yaml", "--dry-run", "--address", ray_cluster["address"])
    refusals = [line for line in hrm.stderr.splitlines() if "a run here would be refused" in line]
    assert hrm.returncode == 0 and len(refusals) == 3, hrm.stderr[-3000:]
    assert ["placeholder" in r for r in refusals] == [True, False, False], refusals
    assert "resources.gpu=1" in refusals[1] and "resources.cpu=8" in refusals[2], refusals
    assert "resolve" not in hrm.stderr.lower()
    real = loopstudy("run", "search_spaces/paper/hrm.yaml", "--address", ray_cluster["address"])
    assert real.returncode == 2 and "s3://YOUR-BUCKET/loopstudy is the shipped specs' placeholder" in real.stderr


# A driver as `run`, `resume` and `evaluate --address` start one (study.run.session.init_ray), then one task on a
# worker node that says which AWS_* variables it sees. (ray is imported after init_ray, as the CLI does: it keeps
# a loopback address on loopback only when set before ray's import.)
CARRY_SCRIPT = """
import sys
from study.run.session import init_ray
init_ray(sys.argv[1])
import ray
seen = ray.remote(num_cpus=1)(lambda: sorted(k for k in __import__("os").environ if k.startswith("AWS_")))
print(" ".join(ray.get(seen.remote(), timeout=120)))
"""


def test_a_driver_on_a_cluster_carries_this_machines_object_store_endpoint_and_region_to_its_tasks(ray_cluster):
    """The cluster was started without any AWS_* variable; Tune carries only the access keys to its trials, so an
    S3 endpoint or region set here reaches them only through the driver's runtime env."""
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_REGION": "eu-west-3"}
    proc = subprocess.run([sys.executable, "-c", CARRY_SCRIPT, ray_cluster["address"]], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"AWS_ENDPOINT_URL", "AWS_REGION"} <= set(proc.stdout.split()), proc.stdout


def test_submit_runs_a_study_as_a_ray_job_on_s3_with_this_machines_endpoint_and_credentials(ray_cluster, s3_server):
    """The cluster was started without any AWS_* variable: the job reaches the S3 server only because submit
    carries the endpoint and credentials set here."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    env = {**os.environ, **s3_server["env"], "AWS_ENDPOINT_URL": s3_server["endpoint"]}
    store = "s3://loopstudy/submitted"
    proc = loopstudy("submit", "tests/specs/tiny.yaml", "--address", ray_cluster["dashboard"], "--store", store,
                     "sweep.seeds=[0]", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    job_id = proc.stdout.strip().splitlines()[-1]
    assert "ray job logs" in proc.stderr and job_id in proc.stderr
    client = JobSubmissionClient(ray_cluster["dashboard"])
    deadline = time.time() + 300
    while client.get_job_status(job_id) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert time.time() < deadline, "job did not finish"
        time.sleep(0.5)
    assert client.get_job_status(job_id) == JobStatus.SUCCEEDED, client.get_job_logs(job_id)[-3000:]
    st = loopstudy("status", "tiny", "--store", store, env=env)
    assert st.returncode == 0 and "2/2" in st.stdout, st.stdout + st.stderr


def test_the_cluster_runs_token_auth_and_refuses_a_client_without_the_token_naming_what_is_missing(ray_cluster,
                                                                                                     tmp_path):
    """The tests' cluster runs as cluster/local_cluster.py starts any (every study on it in this suite runs with the
    token): its job API answers 401 without the token and 200 with it; a client without the token is refused by
    the job server and by the cluster, in one line that says what is missing."""
    import urllib.error
    import urllib.request

    assert ray_cluster["auth"] == "token" and ray_cluster["token_path"] == os.environ["RAY_AUTH_TOKEN_PATH"]
    url = ray_cluster["dashboard"] + "/api/jobs/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=30)
    assert refused.value.code in (401, 403)
    token = Path(ray_cluster["token_path"]).read_text().strip()
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}),
                                timeout=30) as ok:
        assert ok.status == 200
    # a client with no token anywhere Ray looks: no token variables, a home without ~/.ray/auth_token
    bare = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    bare["HOME"] = str(tmp_path)
    submit = loopstudy("submit", "tests/specs/tiny.yaml", "--address", ray_cluster["dashboard"], "--store",
                       str(tmp_path / "r"), env=bare)
    assert submit.returncode == 2 and "has none: give it as RAY_AUTH_TOKEN" in submit.stderr, submit.stderr[-3000:]
    run = loopstudy("run", "tests/specs/tiny.yaml", "--address", ray_cluster["address"], "--store",
                    str(tmp_path / "r"), "--no-plot", env=bare)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2 and last.startswith("loopstudy: could not join the Ray cluster at") and \
        "this machine has none: give it as RAY_AUTH_TOKEN" in last, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and not (tmp_path / "r" / "trials").exists()


def checkpoints_named_by_tune(path: Path) -> dict[str, str]:
    """{trial dir: the checkpoint Tune's saved experiment state names} for its unfinished trials."""
    from ray.tune import ExperimentAnalysis

    try:
        trials = ExperimentAnalysis(str(path)).trials
    except Exception:  # not saved yet, or mid-write
        return {}
    return {t.path: t.checkpoint.path for t in trials if t.status != "TERMINATED" and t.checkpoint is not None}


def last_report(trial_dir: str) -> dict:
    lines = (Path(trial_dir) / "result.json").read_text().splitlines()
    return json.loads(lines[-1]) if lines else {}


def test_driver_killed_mid_study_then_resume_completes_without_rerunning_even_when_its_checkpoint_is_gone(
        ray_cluster, tmp_path):
    """The driver dies mid-study; resume completes every trial once, complete ones not run again. Tune's saved state
    can name a checkpoint that num_to_keep deleted after the save (the driver died between the two): made certain
    here by deleting the named checkpoints. The trial continues from the newest kept one, or starts again when none
    is kept; it never fails for it."""
    import shutil

    driver = subprocess.Popen([sys.executable, "-m", "study.cli", "run", "tests/specs/tiny.yaml", "--address",
                               ray_cluster["address"], "--store", str(tmp_path), "--no-plot"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, unfinished = time.time() + 300, {}
    while len(unfinished) < 2:  # two trials mid-training, each with a checkpoint in the saved state
        assert driver.poll() is None, "driver ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.5)
        done = complete_ids(tmp_path, "tiny")
        unfinished = {d: c for d, c in checkpoints_named_by_tune(tmp_path / "_tune" / "tiny").items()
                      if last_report(d).get("trial") not in done}
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    # The trials' processes live on the worker nodes, not in the driver's process group: Ray ends them once it sees
    # the driver gone. Until then one may still write a checkpoint, so wait for them before deleting any.
    deadline = time.time() + 120
    while training_on("w1") or training_on("w2"):
        assert time.time() < deadline, "a trial outlived its driver by two minutes"
        time.sleep(0.5)
    done = complete_ids(tmp_path, "tiny")  # a trial may have completed since: it is then skipped, not resumed
    unfinished = {d: c for d, c in unfinished.items() if last_report(d).get("trial") not in done}
    trial_dirs = sorted(unfinished)
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "trials").rglob("*.parquet") if p.stem in done}
    for ckpt in unfinished.values():
        shutil.rmtree(ckpt, ignore_errors=True)
    for p in Path(trial_dirs[0]).glob("checkpoint_*"):  # the first trial keeps none: it starts again
        shutil.rmtree(p)

    proc = loopstudy("resume", "tiny", "--store", str(tmp_path), "--address", ray_cluster["address"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 failed" in proc.stderr and "does not exist on storage" not in proc.stderr, proc.stderr[-3000:]
    assert_rows_once(tmp_path, "tiny", 4)
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "trials").rglob("*.parquet")}
    assert all(after[name] == t for name, t in mtimes.items())  # trials complete before the resume were not rerun
    last = {d: last_report(d) for d in trial_dirs}
    assert all(r.get("final") and not r.get("skipped") for r in last.values())
    assert "resumed_step" not in last[trial_dirs[0]]  # started again
    if len(trial_dirs) > 1:
        assert last[trial_dirs[1]]["resumed_step"] > 0  # continued from the newest checkpoint it kept


def test_ctrl_c_says_the_study_was_interrupted_and_how_to_resume(ray_cluster, tmp_path):
    driver = subprocess.Popen([sys.executable, "-m", "study.cli", "run", "tests/specs/tiny.yaml", "--address",
                               ray_cluster["address"], "--store", str(tmp_path), "--no-plot"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list((tmp_path / "_tune").rglob("checkpoint_*")):  # trials are mid-training
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.2)
    driver.send_signal(signal.SIGINT)
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 130, err[-3000:]
    assert "interrupted after" in err and f"loopstudy resume tiny --store {tmp_path}" in err, err[-3000:]
    assert "finished in" not in err
    assert len(complete_ids(tmp_path, "tiny")) < 4


def test_stopping_a_local_cluster_leaves_other_rays_on_the_machine_running(ray_cluster):
    sys.path.insert(0, str(REPO / "cluster"))
    try:
        import local_cluster as lc
    finally:
        sys.path.pop(0)
    ours = lc.cluster_pids(int(CLUSTER_PORT))
    assert ours
    lc.start_head(6397, 8297)  # a second cluster: stands in for a user's own Ray beside the tests
    try:
        other = lc.cluster_pids(6397)
        assert other and not set(other) & set(ours)
    finally:
        local_cluster("stop", "--port", "6397")
    assert not [p for p in other if lc.alive(p)]
    assert all(lc.alive(p) for p in ours)  # the test cluster (another "user") is untouched


def kill_driver_once_tune_saved_state(ray_cluster, tmp_path):
    """Run tests/specs/tiny.yaml and SIGKILL its driver the moment Tune has written tuner.pkl."""
    driver = subprocess.Popen([sys.executable, "-m", "study.cli", "run", "tests/specs/tiny.yaml", "--address",
                               ray_cluster["address"], "--store", str(tmp_path), "--no-plot"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while not (tmp_path / "_tune" / "tiny" / "tuner.pkl").exists():
        assert driver.poll() is None and time.time() < deadline
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()


def test_resume_after_the_driver_died_before_tune_saved_any_trial(ray_cluster, tmp_path):
    """Tune's saved state keeps no param space: resume must hand it again, or the trials it generates are empty."""
    kill_driver_once_tune_saved_state(ray_cluster, tmp_path)
    proc = loopstudy("resume", "--study", "tiny", "--store", str(tmp_path), "--address", ray_cluster["address"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "KeyError" not in proc.stderr
    assert_rows_once(tmp_path, "tiny", 4)
    # tiny's grid names no variants: its progress lines name each trial by the swept value, as its tables do
    for rule in ("carry_last", "infiloop"):
        assert f"finished rule={rule} seed 1" in proc.stderr, proc.stderr[-3000:]


def ask_for_more_cpus_than_the_cluster_has(root: Path, name: str) -> None:
    """Edit a study's saved spec (what resume reads) so that its trials ask for 1,000 CPUs each."""
    import yaml

    from study.store.layout import spec_file

    path = root / spec_file(name)
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "resources": {"cpu": 1000}}, sort_keys=False))


def test_a_resumed_grid_study_gets_the_preflight_checks_of_a_run(ray_cluster, tmp_path):
    """Resuming restores Tune's saved experiment; the cluster is checked first, as for a run: one line, exit 2."""
    kill_driver_once_tune_saved_state(ray_cluster, tmp_path)
    ask_for_more_cpus_than_the_cluster_has(tmp_path, "tiny")
    proc = loopstudy("resume", "tiny", "--store", str(tmp_path), "--address", ray_cluster["address"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "resources.cpu=1000" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "restoring from" not in proc.stderr  # refused before Tune restored anything


def test_a_resumed_optuna_search_gets_the_preflight_checks_of_a_run(ray_cluster, tmp_path):
    from study.run.driver import save_spec
    from study.spec import load_study

    save_spec(Store(tmp_path), load_study(REPO / "search_spaces" / "optuna_hpo.yaml"))
    ask_for_more_cpus_than_the_cluster_has(tmp_path, "optuna_hpo")
    proc = loopstudy("resume", "optuna_hpo", "--store", str(tmp_path), "--address", ray_cluster["address"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "resources.cpu=1000" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "_tune" / "optuna_hpo").exists()  # no Tune experiment was started


def test_resume_continues_the_optuna_study_of_a_search_whose_driver_died(ray_cluster, tmp_path):
    """resume continues the search from its Optuna storage: the journal ends with 3 finished samples, the one the
    dead driver left running marked interrupted (FAIL) and sampled anew, none RUNNING, no sample told twice."""
    overrides = ["model.hidden=16", "task.n_train=128", "task.n_test=16", "train.steps=20", "train.log_every=10",
                 "train.warmup=5", "train.checkpoint_every=10", "sweep.optuna.num_samples=3",
                 "sweep.max_concurrent=1", "sweep.asha.grace_period=10", "sweep.asha.max_t=20"]
    driver = subprocess.Popen([sys.executable, "-m", "study.cli", "run", "search_spaces/optuna_hpo.yaml",
                               *overrides, "--address", ray_cluster["address"], "--store", str(tmp_path), "--no-plot"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    journal = tmp_path / "_optuna" / "optuna_hpo.journal"

    def samples():
        return optuna.load_study(study_name="optuna_hpo",
                                 storage=JournalStorage(JournalFileBackend(str(journal)))).trials

    while not (journal.exists() and (tmp_path / "_tune" / "optuna_hpo" / "tuner.pkl").exists()
               and any(t.state.name != "RUNNING" for t in samples())):
        assert driver.poll() is None and time.time() < deadline
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)  # one sample finished, the next one running
    driver.wait()
    proc = loopstudy("resume", "optuna_hpo", "--store", str(tmp_path), "--address", ray_cluster["address"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "continuing the Optuna search" in proc.stderr
    trials = samples()
    counted = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED", "FAIL") and not t.user_attrs.get(
        "interrupted")]
    assert len(counted) == 3 and not [t for t in trials if t.state.name == "RUNNING"], [t.state for t in trials]
    assert all(t.state.name == "FAIL" for t in trials if t.user_attrs.get("interrupted"))
    rows = pl.from_arrow(Store(tmp_path).read("trials", "optuna_hpo"))
    assert rows["trial_id"].n_unique() == rows.height and set(rows["trial_id"]) >= {
        t.user_attrs["loopstudy_trial_id"] for t in counted}


def test_an_optuna_search_interrupted_by_ctrl_c_continues_its_running_sample_and_ends_with_every_sample_once(
        ray_cluster, tmp_path):
    """Ctrl-C after the first sample, while the second trains with a checkpoint, then resume: the second sample
    continues with its parameters from its checkpoint (not drawn anew, not started again); the search ends with
    num_samples distinct complete samples, none stopped, the first one not run again."""
    overrides = ["model.hidden=16", "task.n_train=128", "task.n_test=16", "train.steps=120", "train.log_every=5",
                 "train.warmup=2", "train.checkpoint_every=5", "sweep.optuna.num_samples=4",
                 "sweep.max_concurrent=1", "sweep.asha=null", "eval.depths=[12]"]
    driver = subprocess.Popen([sys.executable, "-m", "study.cli", "run", "search_spaces/optuna_hpo.yaml",
                               *overrides, "--address", ray_cluster["address"], "--store", str(tmp_path), "--no-plot"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300

    def running_with_checkpoint() -> list[Path]:  # Tune trial folders of an unfinished trial that has a checkpoint
        done = complete_ids(tmp_path, "optuna_hpo")
        return [d for d in (tmp_path / "_tune" / "optuna_hpo").glob("*/") if list(d.glob("checkpoint_*"))
                and (d / "result.json").exists() and last_report(str(d)).get("trial") not in done]

    while len(complete_ids(tmp_path, "optuna_hpo")) < 1 or not running_with_checkpoint():
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.1)
    cut = last_report(str(running_with_checkpoint()[0]))["trial"]
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=300)
    assert driver.returncode == 130, err[-3000:]
    first = complete_ids(tmp_path, "optuna_hpo")
    assert cut not in first
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "trials").rglob("*.parquet") if p.stem in first}

    proc = loopstudy("resume", "optuna_hpo", "--store", str(tmp_path), "--address", ray_cluster["address"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pl.from_arrow(Store(tmp_path).read("trials", "optuna_hpo"))
    assert rows.height == 4 and set(rows["status"]) == {"complete"}, rows.select("trial_id", "status")
    assert cut in set(rows["trial_id"])  # the interrupted sample's own trial, completed
    continued = [last_report(str(d)) for d in (tmp_path / "_tune" / "optuna_hpo").glob("*/")
                 if (d / "result.json").exists() and last_report(str(d)).get("trial") == cut]
    assert [r.get("resumed_step", 0) > 0 for r in continued if r.get("final")] == [True], continued
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "trials").rglob("*.parquet")
            if p.stem in first} == mtimes  # the first sample was not run again
    journal = JournalStorage(JournalFileBackend(str(tmp_path / "_optuna" / "optuna_hpo.journal")))
    done = [t for t in optuna.load_study(study_name="optuna_hpo", storage=journal).trials
            if t.state.name == "COMPLETE"]
    assert len({tuple(sorted(t.params.items())) for t in done}) == len(done) == 4
    status = loopstudy("status", "optuna_hpo", "--store", str(tmp_path))
    said = status.stdout + status.stderr
    assert "4/4" in said and "stopped" not in said, said


def test_resume_with_a_damaged_tune_state_runs_the_saved_spec(ray_cluster, tmp_path):
    kill_driver_once_tune_saved_state(ray_cluster, tmp_path)  # its lease stays: resume here takes it over
    (tmp_path / "_tune" / "tiny" / "tuner.pkl").write_bytes(b"\x80\x04 damaged")
    proc = loopstudy("resume", "tiny", "--store", str(tmp_path), "--address", ray_cluster["address"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cannot be restored" in proc.stderr and "Traceback" not in proc.stderr
    assert_rows_once(tmp_path, "tiny", 4)


def node_processes(resource_name: str) -> dict[int, str]:
    """{pid: command line} of the shared test cluster's raylet that carries `resource_name`, and of its
    descendants (its workers, whose titles, once they run a task, name neither the raylet nor its socket)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    procs = {}
    for line in out.splitlines():
        pid, ppid, *args = line.split(None, 2)
        procs[int(pid)] = (int(ppid), args[0] if args else "")
    raylet = None
    for pid, (_, args) in procs.items():
        resources = next((a.split("=", 1)[1].split(",") for a in args.split()
                          if a.startswith("--static_resource_list=")), [])
        on_ours = f"--gcs-address=127.0.0.1:{CLUSTER_PORT} " in args
        if "/raylet " in args and resource_name in resources[::2] and on_ours:
            raylet = pid
    assert raylet is not None, f"no raylet with resource {resource_name}"
    ours = {raylet}
    while grown := {pid for pid, (ppid, _) in procs.items() if ppid in ours} - ours:
        ours |= grown
    return {pid: procs[pid][1] for pid in ours}


def add_node(name: str, env: dict[str, str] | None = None) -> None:
    """One more one-CPU worker node on the shared test cluster, carrying resource `name` (and `env` besides ours)."""
    proc = subprocess.run([sys.executable, str(REPO / "cluster" / "local_cluster.py"), "add-worker", "--name", name,
                           "--port", CLUSTER_PORT, "--no-log-monitor"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]


def remove_node(name: str, dashboard: str) -> None:
    """Kill the node carrying resource `name` and wait until the cluster counts it dead (the next test's preflight
    must not meet it); asked through the dashboard's state API, which needs no driver."""
    from ray.util.state import list_nodes

    for pid in node_processes(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 120
    while any(n.state == "ALIVE" and name in (n.resources_total or {})
              for n in list_nodes(address=dashboard, detail=True, raise_on_missing_output=False)):
        assert time.time() < deadline, f"node {name} still counted alive"
        time.sleep(0.5)


def training_on(resource_name: str) -> bool:
    """Whether a Tune trial is executing on the node that carries `resource_name` (its actor's process title)."""
    return any(args.startswith("ray::ImplicitFunc.train") for args in node_processes(resource_name).values())


def test_worker_node_killed_mid_study_every_trial_still_completes_once(ray_cluster, tmp_path):
    # --compact-at 2: the finished run also compacts the study, and every row is still there exactly once.
    # 240 steps: a trial trains for seconds, so the kill lands mid-training (a fast machine once finished all four
    # 80-step trials between the first checkpoint and the kill, and nothing was retried).
    driver = subprocess.Popen([sys.executable, "-m", "study.cli", "run", "tests/specs/tiny.yaml", "--address",
                               ray_cluster["address"], "--store", str(tmp_path), "--no-plot", "--compact-at", "2",
                               "train.steps=240"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    # a trial is training on w1 and has checkpointed (so the retry resumes from a checkpoint)
    while not (list((tmp_path / "_tune").rglob("checkpoint_*")) and training_on("w1")):
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.2)
    for pid in node_processes("w1"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out, err = driver.communicate(timeout=600)
    assert driver.returncode == 0, err[-3000:]
    assert "retried 1" in err or "retried 2" in err, err[-3000:]  # the progress line shows Tune's retries
    assert "compacted 4 complete trials" in err, err[-3000:]
    assert Store(tmp_path).is_compacted("tiny") and Store(tmp_path).files("trials", "tiny") == []
    assert len(complete_ids(tmp_path, "tiny")) == 4
    assert_rows_once(tmp_path, "tiny", 4)
    add_node("w1b")  # leave the cluster as we found it


def test_optuna_search_with_asha_keeps_every_sample_and_every_command_agrees(ray_cluster, tmp_path):
    """The shipped optuna_hpo spec (tiny overrides): ASHA stops some samples on the training step; each keeps a
    trials row (stopped: the step it reached, its last objective, its train_curve so far), the rest complete, and
    status, ls, the optuna table and importance count them alike."""
    overrides = ["model.hidden=32", "task.n_train=256", "task.n_test=16", "train.steps=60", "train.log_every=10",
                 "train.warmup=5", "train.checkpoint_every=0", "sweep.optuna.num_samples=6", "sweep.max_concurrent=1",
                 "sweep.asha.grace_period=20", "sweep.asha.max_t=60"]
    proc = loopstudy("run", "search_spaces/optuna_hpo.yaml", *overrides, "--address", ray_cluster["address"],
                     "--store", str(tmp_path), "--no-plot")
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = pl.from_arrow(Store(tmp_path).read("trials", "optuna_hpo"))
    assert trials.height == 6 and trials["trial_id"].n_unique() == 6  # every sample kept its row
    status = dict(trials.group_by("status").len().iter_rows())
    assert set(status) <= {"complete", "stopped"} and status.get("stopped", 0) >= 1 and status.get("complete", 0) >= 1
    stopped = trials.filter(pl.col("status") == "stopped")
    assert (stopped["step"] < 60).all() and stopped["objective"].is_not_null().all()
    curve = pl.from_arrow(Store(tmp_path).read("train_curve", "optuna_hpo"))
    reached = dict(curve.group_by("trial_id").agg(pl.col("step").max()).iter_rows())
    for tid, step in stopped.select("trial_id", "step").iter_rows():
        assert reached[tid] == step  # its curve up to where ASHA stopped it
    assert (trials.filter(pl.col("status") == "complete")["step"] == 60).all()
    n_done, n_stopped = status["complete"], status["stopped"]
    assert f"{n_done} complete, {n_stopped} stopped early" in proc.stderr

    st = loopstudy("status", "optuna_hpo", "--store", str(tmp_path))
    assert st.returncode == 0 and f"{n_done}/6 Optuna samples complete" in st.stdout
    assert f"{n_stopped} stopped" in st.stdout, st.stdout
    ls = loopstudy("ls", "--store", str(tmp_path))
    row = [ln.split() for ln in ls.stdout.splitlines() if ln.startswith("optuna_hpo")][0]
    header = ls.stdout.splitlines()[0].split()
    assert int(row[header.index("complete")]) == n_done and int(row[header.index("stopped")]) == n_stopped
    table = loopstudy("table", "optuna", "--study", "optuna_hpo", "--store", str(tmp_path), "--format", "csv")
    assert table.returncode == 0, table.stderr
    rows = table.stdout.strip().splitlines()[1:]
    assert len(rows) == 6 and sum(",stopped," in r for r in rows) == n_stopped
    imp = loopstudy("importance", "optuna_hpo", "--store", str(tmp_path))
    assert f"optuna_hpo: {n_done} complete trial(s) ({n_stopped} stopped: left out)" in imp.stderr, imp.stderr

    # the search lives in a real Optuna storage (a journal file in the results root), named after the study
    journal = tmp_path / "_optuna" / "optuna_hpo.journal"
    assert f"Optuna study 'optuna_hpo' in {journal}" in proc.stderr
    ot = optuna.load_study(study_name="optuna_hpo", storage=JournalStorage(JournalFileBackend(str(journal))))
    states = Counter(t.state.name for t in ot.trials)
    assert states == {"COMPLETE": n_done, "PRUNED": n_stopped}, states
    by_id = dict(trials.select("trial_id", "final_exact_acc").iter_rows())
    for t in ot.trials:
        if t.state.name == "COMPLETE":  # the value Optuna holds is the trial's stored metric
            assert t.value == pytest.approx(by_id[t.user_attrs["loopstudy_trial_id"]])
    # optuna-dashboard opens it: its HTTP API lists the study and its 6 trials
    with optuna_dashboard(journal) as url:
        studies = json.loads(urlopen(f"{url}/api/studies", timeout=10).read())["study_summaries"]
        sid = next(s["study_id"] for s in studies if s["study_name"] == "optuna_hpo")
        shown = json.loads(urlopen(f"{url}/api/studies/{sid}", timeout=10).read())["trials"]
        assert sorted(t["state"] for t in shown) == sorted(["Complete"] * n_done + ["Pruned"] * n_stopped)
    # running the same spec again continues the search: nothing to do (said without Ray), then one more sample
    again = loopstudy("run", "search_spaces/optuna_hpo.yaml", *overrides, "--store", str(tmp_path), "--no-plot")
    assert again.returncode == 0 and "nothing to run: 6 sample(s) of the search are finished" in again.stderr
    assert "Started a local Ray" not in again.stderr
    seven = [o.replace("num_samples=6", "num_samples=7") for o in overrides]
    more = loopstudy("run", "search_spaces/optuna_hpo.yaml", *seven, "--address", ray_cluster["address"], "--store",
                     str(tmp_path), "--no-plot")
    assert more.returncode == 0 and "1 trial(s) on Ray" in more.stderr, more.stderr[-3000:]
    assert len(optuna.load_study(study_name="optuna_hpo",
                                 storage=JournalStorage(JournalFileBackend(str(journal)))).trials) == 7


def test_a_search_with_two_objectives_keeps_both_and_every_reader_shows_the_same_front(ray_cluster, tmp_path):
    """The shipped pareto_search spec (tiny overrides): accuracy (max) and test-time FLOPs (min) with a constraint.
    Optuna holds both values of every trial, as stored, and the constraint; `table optuna` marks the same front as
    Optuna's best_trials; optuna-dashboard shows both directions; importance ranks the knobs for each objective."""
    overrides = ["model.hidden=32", "task.n_train=256", "task.n_test=16", "train.steps=40", "train.log_every=10",
                 "train.warmup=5", "train.checkpoint_every=0", "sweep.optuna.num_samples=4",
                 # cell accuracy: at 40 steps no puzzle is solved yet, and importance needs an objective that varies
                 "sweep.optuna.metric=[final_cell_acc, final_flops]",
                 "sweep.optuna.constraints={final_exact_acc: {min: 0.0}, final_flops: {max: 3.0e+6}}"]
    proc = loopstudy("run", "search_spaces/pareto_search.yaml", *overrides, "--address", ray_cluster["address"],
                     "--store", str(tmp_path), "--no-plot")
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = pl.from_arrow(Store(tmp_path).read("trials", "pareto_search"))
    assert trials.height == 4 and (trials["status"] == "complete").all() and trials["final_flops"].min() > 0
    stored = {r["trial_id"]: r for r in trials.iter_rows(named=True)}
    journal = tmp_path / "_optuna" / "pareto_search.journal"
    ot = optuna.load_study(study_name="pareto_search", storage=JournalStorage(JournalFileBackend(str(journal))))
    assert [d.name for d in ot.directions] == ["MAXIMIZE", "MINIMIZE"]
    for t in ot.trials:
        row = stored[t.user_attrs["loopstudy_trial_id"]]
        assert t.state.name == "COMPLETE"
        assert t.values == pytest.approx([row["final_cell_acc"], row["final_flops"]])
        assert t.system_attrs["constraints:final_flops"] == pytest.approx(row["final_flops"] - 3.0e6)
        assert t.system_attrs["constraints:final_exact_acc"] == pytest.approx(-row["final_exact_acc"])
    table = loopstudy("table", "optuna", "--study", "pareto_search", "--store", str(tmp_path), "--format", "csv")
    assert table.returncode == 0, table.stderr
    shown = pl.read_csv(table.stdout.strip().encode())
    front = set(shown.filter(pl.col("pareto"))["trial_id"].to_list())
    assert front == {t.user_attrs["loopstudy_trial_id"] for t in ot.best_trials}
    assert {"final_cell_acc", "final_flops", "pareto"} <= set(shown.columns)
    with optuna_dashboard(journal) as url:
        studies = json.loads(urlopen(f"{url}/api/studies", timeout=10).read())["study_summaries"]
        summary = next(s for s in studies if s["study_name"] == "pareto_search")
        assert summary["directions"] == ["maximize", "minimize"]
        detail = json.loads(urlopen(f"{url}/api/studies/{summary['study_id']}", timeout=10).read())
        assert all(len(t["values"]) == 2 for t in detail["trials"])
    assert "A new study created" not in proc.stderr and "[I 20" not in proc.stderr  # Optuna's own log lines
    report = loopstudy("report", "pareto_search", "--store", str(tmp_path), "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr[-3000:]
    assert "final_flops" in (tmp_path / "r.html").read_text()
    imp = loopstudy("importance", "pareto_search", "--store", str(tmp_path), "--format", "csv")
    assert imp.returncode == 0, imp.stderr
    ranked = pl.read_csv(imp.stdout.strip().encode())
    assert set(ranked["metric"]) == {"final_cell_acc", "final_flops"}
    assert set(ranked["knob"]) == {"eval.tau", "train.lr"}


@contextlib.contextmanager
def optuna_dashboard(storage):
    """optuna-dashboard on 127.0.0.1 (a free port) over `storage`, stopped on leaving."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "optuna-dashboard"), str(storage), "--host",
                             "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urlopen(f"{url}/api/studies", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_progress_lines_name_a_variant_by_its_name_and_an_unnamed_grid_point_by_its_swept_values():
    from study.run.naming import swept_keys
    from study.run.progress import describe
    from study.spec.schema import SweepSpec

    sweep = SweepSpec(grid={"model.carry.rule": ["carry_last", "infiloop"]},
                      variants=[{"model.carry.beta_init": 0.5}, {"name": "fprm", "model.kind": "fprm"}])
    swept = swept_keys(sweep)
    assert swept == ["model.carry.rule", "model.carry.beta_init", "model.kind"]
    point = {"model": {"kind": "nested", "carry": {"rule": "infiloop", "beta_init": 0.5}}, "seed": 2, "label": ""}
    assert describe({"trial": json.dumps(point)}, swept) == "rule=infiloop,beta_init=0.5,kind=nested seed 2"
    named = {**point, "label": "fprm", "_trains": False}  # a re-read of stored weights
    assert describe({"trial": json.dumps(named)}, swept) == "reading fprm seed 2"
    assert describe({"searched": {"train.lr": 0.0031622777}}) == "lr=0.00316"
