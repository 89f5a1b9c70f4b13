"""Live tracking (study/run/tracking.py), read back with each tracker's own client: TensorBoard's event reader,
mlflow.MlflowClient and W&B's offline run file. One run per trial named by its setting and trial id, the flat
config as params, training logs at the training step, the final metrics and the depth curve at the end."""

import json
import os
import struct
import subprocess
import sys
import time

import polars as pl
import pytest

from study.store import Store

from .conftest import REPO

STEPS, LOG_EVERY = 30, 10


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """tests/specs/tiny.yaml (one seed: two trials) run with all three trackers (the driver writes them) on an
    embedded Ray."""
    root = tmp_path_factory.mktemp("tracked")
    proc = subprocess.run([sys.executable, "-m", "study.cli", "run", "tests/specs/tiny.yaml", "--store", str(root),
                           f"train.steps={STEPS}", f"train.log_every={LOG_EVERY}", "eval.depths=[6,12]",
                           "sweep.seeds=[0]", "--tracking", "tensorboard,mlflow,wandb", "--no-plot"], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_ADDRESS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = pl.from_arrow(Store(root).read("trials", "tiny"))
    depth = pl.from_arrow(Store(root).read("depth_eval", "tiny")).filter(pl.col("difficulty").is_null())
    curve = pl.from_arrow(Store(root).read("train_curve", "tiny"))
    names = {f"rule={rule}-s0-{tid}": tid for tid, rule in trials.select("trial_id", "model.carry.rule").iter_rows()}
    return {"root": root, "trials": trials, "depth": depth, "curve": curve, "names": names}


def stored_depth(run, tid) -> dict[int, float]:
    rows = run["depth"].filter(pl.col("trial_id") == tid)
    return dict(rows.select("depth_layers", "exact_acc").iter_rows())


def stored_losses(run, tid) -> dict[int, float]:
    """The stored train_curve's loss at each training log (the curve holds every step the trainer recorded)."""
    rows = run["curve"].filter((pl.col("trial_id") == tid) & (pl.col("step") % LOG_EVERY == 0))
    return dict(rows.select("step", "loss").iter_rows())


def test_tensorboard_has_the_training_curve_at_the_training_step_and_the_depth_curve(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for name, tid in tracked["names"].items():
        events = EventAccumulator(str(tracked["root"] / "_tune" / "tiny" / name))  # one folder per run, by name
        events.Reload()
        loss = [(e.step, e.value) for e in events.Scalars("ray/tune/train_loss")]
        assert [s for s, _ in loss] == [10, 20, 30, 30]  # each training log once, then the final report
        assert dict(loss[:3]) == pytest.approx(stored_losses(tracked, tid))
        assert [e.step for e in events.Scalars("ray/tune/lr")][:3] == [10, 20, 30]
        depth = [(e.step, e.value) for e in events.Scalars("depth_curve/exact_acc")]
        assert dict(depth) == pytest.approx(stored_depth(tracked, tid))


def test_mlflow_has_one_run_per_trial_with_the_flat_config_and_step_aligned_metrics(tracked):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tracked['root']}/_tracking/tiny/mlflow.db")
    experiment = client.get_experiment_by_name("tiny")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == set(tracked["names"])
    for name, tid in tracked["names"].items():
        run = runs[name]
        row = tracked["trials"].filter(pl.col("trial_id") == tid).row(0, named=True)
        assert run.info.status == "FINISHED"
        assert run.data.params["model.carry.rule"] == row["model.carry.rule"]
        assert run.data.params["train.steps"] == str(STEPS) and "trial" not in run.data.params
        history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert [s for s, _ in history] == [10, 20, 30, 30]
        assert dict(history[:3]) == pytest.approx(stored_losses(tracked, tid))
        assert run.data.metrics["final_exact_acc"] == pytest.approx(row["final_exact_acc"])
        curve = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "depth_curve/exact_acc")}
        assert curve == pytest.approx(stored_depth(tracked, tid))


def wandb_records(path):
    """The records of a W&B offline run file (`run-<id>.wandb`): a ':W&B' header, then LevelDB-log blocks of 32 KiB
    whose records (7-byte header: CRC, length, type FULL/FIRST/MIDDLE/LAST) hold wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf = data[pos + 7:pos + 7 + length] if kind in (1, 2) else buf + data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def finished_wandb_records(path, wait_s=60.0):
    """The run file's records once W&B has written its `exit` record: W&B's own service process writes the file and
    may still be flushing it when the driver has exited, so the file is read again until it is whole."""
    deadline = time.monotonic() + wait_s
    while True:
        records = wandb_records(path)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds or time.monotonic() > deadline:
            assert "run" in kinds and "exit" in kinds, (path, kinds)
            return records
        time.sleep(0.5)


def test_wandb_offline_runs_hold_the_config_and_history_at_the_training_step(tracked):
    files = sorted((tracked["root"] / "_tracking" / "tiny" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2
    seen = {}
    for f in files:
        records = finished_wandb_records(f)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        config = {i.key: json.loads(i.value_json) for i in run.config.update}
        history = [{"_step": r.history.step.num, **{i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                                      for i in r.history.item}}
                   for r in records if r.WhichOneof("record_type") == "history"]
        seen[run.display_name] = (run.project, config, history)
    assert set(seen) == set(tracked["names"])
    for name, (project, config, history) in seen.items():
        tid = tracked["names"][name]
        assert project == "tiny" and config["model.carry.rule"] == name.split("-")[0].split("=")[1]
        assert [h["_step"] for h in history] == [10, 20, 30]  # W&B's step is the training step
        assert {h["_step"]: h["train_loss"] for h in history} == pytest.approx(stored_losses(tracked, tid))
        depth = {int(k.rsplit("/", 1)[1]): v for k, v in history[-1].items() if k.startswith("depth/exact_acc/")}
        assert depth == pytest.approx(stored_depth(tracked, tid))
