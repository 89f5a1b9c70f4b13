"""Results store: round trips, atomic writes, idempotent rewrites, older schemas, corrupt files, S3 on loopback."""

from datetime import UTC, datetime

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from study.config import TrialConfig, to_dict
from study.errors import StoreError
from study.store import SCHEMAS, Store, config_row, schema


def trial_row(**kw):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return {**config_row(to_dict(TrialConfig())), "status": "complete", "params": 10, "started": now, "ended": now,
            "wall_s": 1.0, "device": "cpu", **kw}


SAMPLES = {
    "trials": [trial_row()],
    "train_curve": [{"step": 1, "loss": 2.0, "cell_acc": 0.5, "exact_acc": 0.1, "lr": 1e-3, "seconds": 0.1}],
    "depth_eval": [{"depth_layers": 12, "outer_cycles": 2, "difficulty": None, "n": 10, "exact_acc": 0.5,
                    "cell_acc": 0.9, "halted_frac": 0.0, "eff_layers": 12.0},
                   {"depth_layers": 12, "outer_cycles": 2, "difficulty": 8, "n": 4, "exact_acc": 0.25,
                    "cell_acc": 0.8, "halted_frac": 0.0, "eff_layers": 12.0}],
    "dynamics": [{"kind": "update", "axis": "outer", "update": 1, "gamma_mean": 0.4, "solved": 0.1, "n": 10}],
    "perturbation": [{"eps": 1e-3, "update": 4, "updates_after": 1, "n_solved": 3, "solved_kept": 1.0,
                      "rel_distance": 0.01}],
}


def write_trial(store, study, tid):
    """Every table of one trial, the trials row last (as run_trial writes them)."""
    for table in [*SCHEMAS, "trials"]:
        store.write(table, study, tid, SAMPLES[table])


@pytest.mark.parametrize("table", list(SAMPLES))
def test_every_table_round_trips(tmp_path, table):
    store = Store(tmp_path)
    store.write(table, "s1", "t1", SAMPLES[table])
    got = store.read(table, "s1")
    assert got.num_rows == len(SAMPLES[table])
    assert got.column("study").to_pylist() == ["s1"] * got.num_rows
    assert got.column("schema_version").to_pylist()[0] == 1
    for key, value in SAMPLES[table][0].items():
        assert got.column(key).to_pylist()[0] == value, key
    assert store.files(table, "s1") == [f"{tmp_path}/{table}/study=s1/t1.parquet"]


def test_trial_written_twice_appears_once(tmp_path):
    store = Store(tmp_path)
    store.write("depth_eval", "s", "t1", SAMPLES["depth_eval"])
    store.write("depth_eval", "s", "t1", SAMPLES["depth_eval"][:1])  # a retried trial replaces its own file
    store.write("depth_eval", "s", "t2", SAMPLES["depth_eval"])
    t = pl.from_arrow(store.read("depth_eval"))
    assert t.filter(pl.col("trial_id") == "t1").height == 1 and t.height == 3


def test_half_written_temporary_file_is_never_read(tmp_path):
    store = Store(tmp_path)
    store.write("depth_eval", "s", "t1", SAMPLES["depth_eval"])
    d = tmp_path / "depth_eval" / "study=s"
    (d / ".t2.parquet.abcd1234.tmp").write_bytes(b"PAR1 half a file")
    assert store.read("depth_eval", "s").num_rows == 2
    assert store.scan("depth_eval", "s").collect().height == 2


def test_file_of_an_older_schema_with_a_missing_column_still_loads(tmp_path):
    store = Store(tmp_path)
    old = schema("depth_eval").remove(schema("depth_eval").get_field_index("eff_layers"))
    d = tmp_path / "depth_eval" / "study=s"
    d.mkdir(parents=True)
    row = {k: v for k, v in SAMPLES["depth_eval"][0].items() if k != "eff_layers"}
    pq.write_table(pa.Table.from_pylist([{**row, "trial_id": "old", "schema_version": 0}], schema=old),
                   d / "old.parquet")
    store.write("depth_eval", "s", "new", SAMPLES["depth_eval"])
    t = pl.from_arrow(store.read("depth_eval", "s")).sort("trial_id")
    assert t.height == 3
    assert t.filter(pl.col("trial_id") == "old")["eff_layers"].to_list() == [None]
    assert t.filter(pl.col("trial_id") == "new")["eff_layers"].to_list() == [12.0, 12.0]


def test_corrupt_file_is_named_and_skip_bad_reads_the_rest(tmp_path):
    store = Store(tmp_path)
    store.write("depth_eval", "s", "good", SAMPLES["depth_eval"])
    bad = tmp_path / "depth_eval" / "study=s" / "bad.parquet"
    bad.write_bytes(b"this is not parquet at all, just bytes" * 10)
    with pytest.raises(StoreError, match="bad.parquet.*--skip-bad"):
        store.read("depth_eval", "s")
    assert store.read("depth_eval", "s", skip_bad=True).num_rows == 2


def test_writing_an_unknown_column_or_table_is_refused(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(StoreError, match="wat"):
        store.write("depth_eval", "s", "t", [{"wat": 1}])
    with pytest.raises(StoreError, match="unknown table 'nope'; tables: trials"):
        store.read("nope")


def test_row_dataclasses_match_the_schemas():
    import dataclasses

    from study.evaluate import DepthRow, DynamicsRow, PerturbationRow
    from study.trial.train import TrainLog

    for cls, table in ((DepthRow, "depth_eval"), (DynamicsRow, "dynamics"), (PerturbationRow, "perturbation"),
                       (TrainLog, "train_curve")):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields == set(SCHEMAS[table].names) - {"trial_id", "schema_version"}, table
