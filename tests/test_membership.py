"""Study membership: a study's trials are those its current spec resolves to; earlier versions' trials stay in
storage as `stale`, counted by status and ls alike and left out of tables unless asked for."""

import polars as pl
import pytest

from study.analysis.tables import build_table, list_studies
from study.cli import main
from study.config import to_dict, trial_id
from study.run.driver import save_spec
from study.spec import load_study
from study.spec.membership import membership
from study.store import Store, config_row

from .test_bad_input import csv_rows, write_csv
from .test_store import SAMPLES

SPEC = "name: m\ntask: {name: sudoku, size: 4, n_test: 16}\nsweep: {grid: {model.carry.rule: [carry_last, infiloop]}}\n"


def write_complete(store, study, cfg):
    tid = trial_id(cfg)
    for table, rows in SAMPLES.items():
        if table != "trials":
            store.write(table, study, tid, rows)
    store.write("trials", study, tid, [{**SAMPLES["trials"][0], **config_row(to_dict(cfg))}])
    return tid


@pytest.fixture
def edited(tmp_path):
    """Version 1 (rules carry_last, infiloop) ran; then the spec was edited (infiloop -> damped) and saved."""
    store = Store(tmp_path / "r")
    v1 = load_study(write(tmp_path, SPEC))
    ids = [write_complete(store, "m", c) for c in v1.trials]
    v2 = load_study(write(tmp_path, SPEC.replace("infiloop]", "damped]")))
    save_spec(store, v2)
    return store, ids


def write(tmp_path, text, name="m.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_trials_of_an_earlier_spec_are_stale_and_the_new_ones_pending(edited):
    store, (kept, old) = edited
    m = membership(store, "m")
    assert m.status[kept] == "complete" and m.status[old] == "stale"
    assert m.counts() == {"running": 0, "stopped": 0, "failed": 0, "complete": 1, "pending": 1, "stale": 1}


def test_status_and_ls_agree_on_the_counts(edited, capsys):
    store, _ = edited
    assert main(["status", "m", "--store", store.uri]) == 0
    out = capsys.readouterr().out
    assert "m: 1/2 trials complete" in out and "1 pending" in out and "1 stale" in out
    row = list_studies(store).row(0, named=True)
    assert (row["complete"], row["pending"], row["stale"]) == (1, 1, 1)


def test_tables_leave_stale_trials_out_and_say_so_unless_asked(edited, capsys):
    store, (kept, old) = edited
    df = build_table(store, "m", "final")
    assert df["n"].sum() == 1
    assert "1 complete trial(s) of an earlier version of its spec left out" in capsys.readouterr().err
    assert build_table(store, "m", "final", include_stale=True)["n"].sum() == 2
    assert main(["table", "final", "--study", "m", "--store", store.uri, "--all", "--format", "csv"]) == 0


def test_editing_a_data_file_makes_its_trials_stale(tmp_path):
    data = write_csv(tmp_path / "p.csv", csv_rows(4, 40, (6, 8), seed=0))
    spec = write(tmp_path, "name: c\ntask: {name: sudoku, size: 4, csv: p.csv, n_train: 24, n_test: 8}\n")
    store = Store(tmp_path / "r")
    study = load_study(spec)
    before = write_complete(store, "c", study.trials[0])
    save_spec(store, study)
    assert membership(store, "c").counts()["complete"] == 1
    write_csv(data, csv_rows(4, 40, (6, 8), seed=1))  # new content, same path: another trial
    m = membership(store, "c")
    assert m.status[before] == "stale" and m.counts()["pending"] == 1
    assert pl.from_arrow(store.read("trials", "c")).height == 1  # the old rows stay in storage
