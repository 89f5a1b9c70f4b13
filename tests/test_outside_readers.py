"""Outside readers see what loopstudy sees: DuckDB, pyarrow.dataset, pandas and Polars pointed at `<root>/<table>`
read the same rows as loopstudy's own read, for a fresh study, a compacted one, a trial re-run after compaction and
an earlier store's `_compacted.parquet` once it is compacted again (study/store/__init__.py, "Outside readers")."""

import shutil

import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as ds
import pytest

from study.store import COMPACTED, TABLES, Store

from .test_store import SAMPLES, write_trial

KEY = ["study", "trial_id"]


def loopstudy_rows(root, table) -> list[tuple]:
    return sorted(Store(root).scan(table).select(*KEY).collect().iter_rows())


def duckdb_rows(root, table) -> list[tuple]:
    con = duckdb.connect()
    try:
        return sorted(con.execute(f"SELECT study, trial_id FROM read_parquet('{root}/{table}/**/*.parquet', "
                                  "hive_partitioning=true)").fetchall())
    finally:
        con.close()


def pyarrow_rows(root, table) -> list[tuple]:
    t = ds.dataset(f"{root}/{table}", format="parquet", partitioning="hive").to_table(columns=KEY)
    return sorted(zip(*(map(str, t[c].to_pylist()) for c in KEY)))


def pandas_rows(root, table) -> list[tuple]:
    df = pd.read_parquet(f"{root}/{table}", columns=KEY)
    return sorted(zip(df["study"].astype(str), df["trial_id"]))


def polars_rows(root, table) -> list[tuple]:
    return sorted(pl.scan_parquet(f"{root}/{table}/", hive_partitioning=True).select(*KEY).collect().iter_rows())


READERS = {"duckdb": duckdb_rows, "pyarrow.dataset": pyarrow_rows, "pandas": pandas_rows, "polars": polars_rows}


def assert_readers_agree(root, n_trials: int) -> None:
    for table in TABLES:
        want = loopstudy_rows(root, table)
        per_trial = len(SAMPLES[table])
        assert len(want) == n_trials * per_trial, (table, len(want))
        for name, read in READERS.items():
            assert read(root, table) == want, (name, table)


def a_store(tmp_path) -> Store:
    store = Store(tmp_path)
    for i in range(4):
        write_trial(store, "s", f"t{i:03d}")
    write_trial(store, "other", "t000")  # a second study with the same trial id
    return store


def test_outside_readers_agree_on_a_fresh_store(tmp_path):
    a_store(tmp_path)
    assert_readers_agree(tmp_path, 5)


def test_outside_readers_agree_on_a_compacted_study(tmp_path):
    store = a_store(tmp_path)
    store.compact("s", grace_s=0)
    assert store.files("trials", "s") == [] and (tmp_path / "trials" / "study=s" / COMPACTED).exists()
    assert_readers_agree(tmp_path, 5)


def test_a_trial_rerun_after_compaction_is_read_once_by_every_reader(tmp_path):
    a_store(tmp_path).compact("s", grace_s=0)
    rerun = Store(tmp_path)  # a new process, as `loopstudy trial --study s` would be
    write_trial(rerun, "s", "t002")
    assert rerun.is_complete("s", "t002") and len(rerun.completed_trials("s")) == 4
    assert_readers_agree(tmp_path, 5)
    Store(tmp_path).compact("s", grace_s=0)  # and folded back in by the next compaction
    assert Store(tmp_path).files("trials", "s") == []
    assert_readers_agree(tmp_path, 5)


def test_an_earlier_stores_compacted_file_is_read_and_replaced_by_the_next_compaction(tmp_path):
    store = a_store(tmp_path)
    store.compact("s", grace_s=0)
    for table in TABLES:  # the name compaction used before: plain readers skip it, loopstudy reads it
        d = tmp_path / table / "study=s"
        shutil.move(d / COMPACTED, d / "_compacted.parquet")
    old = Store(tmp_path)
    assert len(loopstudy_rows(tmp_path, "trials")) == 5 and old.completed_trials("s") == {f"t{i:03d}" for i in range(4)}
    write_trial(old, "s", "t004")  # a new trial beside the earlier compacted file
    old.compact("s", grace_s=0)
    assert not any((tmp_path / t / "study=s" / "_compacted.parquet").exists() for t in TABLES)
    assert_readers_agree(tmp_path, 6)


@pytest.mark.parametrize("table", TABLES)
def test_a_rerun_keeps_only_its_new_rows(tmp_path, table):
    a_store(tmp_path).compact("s", grace_s=0)
    rerun = Store(tmp_path)
    write_trial(rerun, "s", "t001")
    mine = duckdb_rows(tmp_path, table)
    assert mine.count(("s", "t001")) == len(SAMPLES[table])
