"""The store on a real S3 server (SeaweedFS on loopback, tests/conftest.py): both ways to name the endpoint work for
the store and for every command, and an unreachable server or refused credentials end in one clear line."""

import os
import subprocess
import sys

import polars as pl
import pytest

from study.errors import StoreError
from study.store import Store

from .conftest import REPO
from .test_store import SAMPLES, write_trial


def loopstudy(*args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RAY_ADDRESS": "", **env})


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for k, v in s3_server["env"].items():
        monkeypatch.setenv(k, v)
    return s3_server


def test_the_store_round_trips_on_s3_with_the_endpoint_in_the_uri(s3_env, request):
    store = Store(s3_env["uri"].format(prefix=request.node.name))
    assert not store.local
    store.write("depth_eval", "s3study", "t1", SAMPLES["depth_eval"])
    store.write("depth_eval", "s3study", "t1", SAMPLES["depth_eval"])  # replaced, not duplicated
    write_trial(store, "s3study", "t1")
    write_trial(store, "s3study", "t2")
    assert store.studies() == ["s3study"]
    assert store.read("depth_eval", "s3study").num_rows == 4
    assert store.completed_trials("s3study") == {"t1", "t2"}
    store.put_text("_studies/s3study.yaml", "name: s3study\n")
    assert store.get_text("_studies/s3study.yaml") == "name: s3study\n"
    store.compact("s3study", grace_s=0)
    assert store.files("trials", "s3study") == [] and store.completed_trials("s3study") == {"t1", "t2"}
    write_trial(Store(store.uri), "s3study", "t1")  # a re-run after compaction: its rows once
    assert store.read("depth_eval", "s3study").num_rows == 4


def test_the_endpoint_can_come_from_aws_endpoint_url(s3_env, monkeypatch, request):
    prefix = request.node.name
    write_trial(Store(s3_env["uri"].format(prefix=prefix)), "s", "t1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env["endpoint"])
    plain = Store(f"s3://loopstudy/{prefix}")
    assert plain.completed_trials("s") == {"t1"}
    assert pl.from_arrow(plain.read("trials", "s"))["trial_id"].to_list() == ["t1"]


def test_a_study_on_s3_reads_back_with_either_endpoint_form_and_from_its_stored_weights(s3_server, ray_cluster,
                                                                                         request):
    """On the tests' cluster, started without any AWS_* variable. (SeaweedFS here may take anonymous writes: this
    study passed with the driver's carrying of the credentials to its trials switched off, so it does not pin it;
    test_ray_studies' test_a_driver_on_a_cluster_carries_... does.)"""
    uri = s3_server["uri"].format(prefix=request.node.name)
    env = s3_server["env"]
    run = loopstudy("run", "tests/specs/tiny.yaml", "--store", uri, "train.steps=8", "eval.depths=[6]",
                    "sweep.seeds=[0]", "--address", ray_cluster["address"], env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2 complete, 0 failed" in run.stderr
    plain = f"s3://loopstudy/{request.node.name}"
    by_env = {**env, "AWS_ENDPOINT_URL": s3_server["endpoint"]}
    for store, e in ((uri, env), (plain, by_env)):
        st = loopstudy("status", "tiny", "--store", store, env=e)
        assert st.returncode == 0 and "2/2" in st.stdout, st.stdout + st.stderr
        table = loopstudy("table", "depth", "--study", "tiny", "--store", store, "--format", "csv", env=e)
        assert table.returncode == 0 and len(table.stdout.strip().splitlines()) == 3, table.stderr
    compact = loopstudy("compact", "tiny", "--store", plain, "--grace", "0", env=by_env)
    assert compact.returncode == 0, compact.stderr
    q = loopstudy("query", "SELECT count(*) AS n FROM trials", "--store", uri, "--format", "csv", env=env)
    assert q.returncode == 0 and q.stdout.split() == ["n", "2"], q.stdout + q.stderr
    # the trials' weights are on the same S3 root (compacted rows keep their hashes): read back and checked
    ev = loopstudy("evaluate", "tiny", "eval.readout=max_conf", "--store", uri, "--address", ray_cluster["address"],
                   "--no-plot", env=env)
    assert ev.returncode == 0 and "2 reading(s) of the stored weights of 2 trial(s)" in ev.stderr, ev.stderr[-3000:]
    st = loopstudy("status", "tiny", "--store", plain, env=by_env)
    assert "tiny: 2/2 trials complete" in st.stdout and "2 evaluation(s)" in st.stdout, st.stdout + st.stderr


def test_refused_credentials_end_in_one_line_naming_what_to_set(s3_server, request):
    uri = s3_server["uri"].format(prefix=request.node.name)
    proc = loopstudy("ls", "--store", uri, env={**s3_server["env"], "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "refused the credentials" in proc.stderr
    assert "AWS_SECRET_ACCESS_KEY" in proc.stderr and "wrong" not in proc.stderr  # names the variable, not its value


def test_an_unreachable_endpoint_ends_in_one_line_saying_how_to_name_one(s3_server):
    uri = "s3://loopstudy/x?endpoint_override=127.0.0.1:1&scheme=http&region=us-east-1"  # nothing listens there
    proc = loopstudy("run", "tests/specs/tiny.yaml", "--store", uri, env=s3_server["env"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("loopstudy: cannot reach the results store") and "http://127.0.0.1:1" in line
    assert "AWS_ENDPOINT_URL" in line and "endpoint_override" in line


def test_a_store_error_names_the_endpoint_it_used(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(StoreError, match=r"endpoint http://127\.0\.0\.1:\d+\) refused the credentials"):
        Store(s3_env["uri"].format(prefix="x"))


def test_an_endpoint_written_with_its_scheme_reaches_the_same_server(s3_env, request):
    """`endpoint_override=http://HOST:PORT`, as AWS_ENDPOINT_URL users write it, is the server, not http://http://."""
    prefix = request.node.name
    write_trial(Store(s3_env["uri"].format(prefix=prefix)), "s", "t1")
    with_scheme = f"s3://loopstudy/{prefix}?endpoint_override={s3_env['endpoint']}"
    assert s3_env["endpoint"].startswith("http://")
    assert Store(with_scheme).completed_trials("s") == {"t1"}
    assert pl.from_arrow(Store(with_scheme).read("trials", "s"))["trial_id"].to_list() == ["t1"]
    proc = loopstudy("query", "SELECT count(*) AS n FROM trials", "--store", with_scheme, "--format", "csv",
                     env=s3_env["env"], timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["n", "1"], proc.stdout + proc.stderr


@pytest.mark.parametrize("uri,says", [
    ("s3://", "no bucket"), ("s3:///prefix", "no bucket"), ("gs://bucket/prefix", "gs:// is not served"),
    ("hdfs://namenode/x", "hdfs:// is not served"),
    ("s3://b/p?endpoint_override=http://127.0.0.1:9&scheme=https", "give one"),
])
def test_a_store_uri_loopstudy_cannot_serve_is_one_line_within_seconds(uri, says):
    proc = loopstudy("ls", "--store", uri, env={}, timeout=30)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    with pytest.raises(StoreError, match=says):
        Store(uri)


def test_credentials_in_a_store_uri_are_never_printed():
    proc = loopstudy("ls", "--store", "gs://user:hunter2@b/p?secret_key=hunter3", env={}, timeout=30)
    assert proc.returncode == 2 and "hunter" not in proc.stderr and "***" in proc.stderr, proc.stderr


def test_a_trm_checkpoint_on_s3_is_read_at_depth_from_each_machines_cached_copy(s3_env, tmp_path, request):
    import hashlib

    import pyarrow.fs as pafs
    import yaml

    from .test_published import SMALL_TRM_ARCH, trm_tensors, write_checkpoint

    tensors = trm_tensors("trm", False, 16, 4, 6, 16, {"L": 1})
    local = write_checkpoint(tmp_path / "ckpt", tensors, SMALL_TRM_ARCH)
    uri = s3_env["uri"].format(prefix=request.node.name)
    fs, key = pafs.FileSystem.from_uri(uri.replace("?", "/step_1000?"))
    env = {**s3_env["env"], "LOOPSTUDY_CACHE": str(tmp_path / "cache")}
    for name in ("step_1000", "all_config.yaml"):
        with fs.open_output_stream(key.rsplit("/", 1)[0] + "/" + name) as out:
            out.write((local.parent / name).read_bytes())
    trial = tmp_path / "read.yaml"
    init = "trm:" + uri.replace("?", "/step_1000?")
    trial.write_text(yaml.safe_dump({"task": {"name": "sudoku", "size": 4, "n_train": 32, "n_test": 16},
                                     "model": {"init_from": init}, "train": {"steps": 0},
                                     "eval": {"depths": [6, 60]}}))
    proc = loopstudy("trial", str(trial), "--store", str(tmp_path / "r"), env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = Store(tmp_path / "r").read("trials", "adhoc").to_pylist()[0]
    assert row["init_sha256"] == hashlib.sha256(local.read_bytes()).hexdigest()
    assert row["model.init_from"].startswith("trm:s3://loopstudy/") and row["model.puzzle_prefix"] == 4
    fetched = list((tmp_path / "cache" / "fetched").glob("*/*"))
    assert sorted(p.name for p in fetched) == ["all_config.yaml", "step_1000"]
    missing = init.replace("step_1000", "step_2000")
    trial.write_text(trial.read_text().replace(init, missing))
    proc = loopstudy("trial", str(trial), "--store", str(tmp_path / "r"), env=env)
    assert proc.returncode != 0 and "no such object" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
