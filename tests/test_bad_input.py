"""Bad input is refused up front (exit 2, one line, no traceback, before Ray starts) and no row escapes the store,
goes stale or is counted twice."""

import contextlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from study.analysis import query
from study.config import MAX_DEPTH_LAYERS, trial_id
from study.errors import AnalysisError, ConfigError, DataError, StoreError
from study.spec import load_study
from study.spec.study import load_trial_file as load_trial
from study.store import SCHEMAS, Store
from study.tasks import sudoku
from study.tasks.loader import load_task

from .conftest import REPO
from .test_store import SAMPLES, write_trial

BASE = "name: bad\ntask: {name: sudoku, size: 4, n_test: 64}\n"


def loopstudy(*args, cwd=REPO, timeout=120):
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RAY_ADDRESS": ""})


def assert_refused(proc, *needles):
    """Exit 2, one 'loopstudy:' line on stderr naming what is wrong, no traceback, Ray never started."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "Started a local Ray" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith(("loopstudy: ", "loopstudy ")), proc.stderr
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)


def write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def csv_rows(size: int, n: int, blanks: tuple[int, int], seed: int) -> list[str]:
    split = sudoku.generate(size, n, blanks, seed=seed)
    return [f"gen,{''.join('.' if v == 1 else str(v - 1) for v in inp)},{''.join(str(v - 1) for v in lab)},0"
            for inp, lab in zip(split.inputs, split.labels)]


def write_csv(path: Path, rows: list[str]) -> Path:
    path.write_text("source,q,a,rating\n" + "\n".join(rows) + "\n")
    return path


# -- spec values refused before any trial ------------------------------------------------------------------------------
@pytest.mark.parametrize("text,needles", [
    (BASE + "eval: {n_test: -5}\n", ["eval.n_test=-5", ">= 1"]),
    (BASE + "train: {puzzle_lr: 0.1}\n", ["train.puzzle_lr is set but never read", "no puzzle embedding"]),
    (BASE + "train: {puzzle_weight_decay: 0.5}\nsweep: {optuna: {num_samples: 2, space: {train.lr: {type: uniform, "
     "low: 0.001, high: 0.01}}}}\n", ["train.puzzle_weight_decay is set but never read"]),
    (BASE + "eval: {n_test: 0}\n", ["eval.n_test=0"]),
    (BASE + "eval: {n_test: 65}\n", ["eval.n_test=65", "task.n_test=64"]),
    (BASE + "eval: {batch_size: 0}\n", ["eval.batch_size=0"]),
    (BASE + "train: {log_every: 0}\n", ["train.log_every=0"]),
    (BASE + "model: {H: 2, L: 2}\neval: {depths: [999999996]}\n", ["eval.depths", f"at most {MAX_DEPTH_LAYERS}"]),
    (BASE + "model: {H: 100000}\n", ["layers per update", f"at most {MAX_DEPTH_LAYERS}"]),
    (BASE + "eval: {stability: [1, 100000]}\n", ["eval.stability", f"at most {MAX_DEPTH_LAYERS}"]),
    (BASE + "sweep: {max_failures: -1}\n", ["sweep.max_failures", ">= 0"]),
    (BASE + "sweep: {max_concurrent: -3}\n", ["sweep.max_concurrent", ">= 0"]),
    (BASE + "model: {expansion: 0}\n", ["model.expansion=0"]),
    (BASE + "sweep: {grid: {model.L: []}}\n", ["sweep.grid", "'model.L' has no values"]),
    (BASE + "sweep: {optuna: {num_samples: 0, space: {train.lr: {type: uniform, low: 0.001, high: 0.01}}}}\n",
     ["sweep.optuna.num_samples", "at least 1"]),
    (BASE + "sweep: {asha: {max_t: 0}}\n", ["sweep.asha", "grace_period <= max_t"]),
    (BASE + "sweep: {asha: {reduction_factor: 1}}\n", ["sweep.asha", "reduction_factor"]),
    (BASE + "sweep: {variants: [{name: a, model.L: 2}, {name: a, model.L: 3}]}\n", ["sweep.variants", "['a']"]),
    (BASE + "model: {carry: infiloop}\n", ["model.carry", "dictionary"]),
    (BASE + "model: {carry: infiloop}\nsweep: {grid: {model.carry.rule: [infiloop]}}\n",
     ["model.carry is a section", "'infiloop'"]),
    (BASE + "eval: {L: -1}\n", ["eval.L=-1"]),
    (BASE + "bogus: 1\n", ["bogus: unknown key", "allowed: name, description, task"]),
    (BASE + "sweep: {gird: {}}\n", ["sweep.gird: unknown key", "allowed: grid, variants"]),
    (BASE + "resources: {cpu: 0}\n", ["resources.cpu", "cpu > 0"]),
    ("name: ../../x\n", ["name: study name '../../x' is not allowed"]),
    ("name: a%20b\n", ["'a%20b' is not allowed"]),
    ("name: bad\ntask: {name: sudoku, size: 4, csv: missing.csv}\n", ["task.csv=", "missing.csv", "does not exist"]),
    ("name: bad\ntask: {name: sudoku, size: 4, csv: .}\n", ["task.csv=", "is a folder"]),
    ("name: bad\ntask: {name: maze, size: 5, csv: x.csv}\n", ["task.csv is for sudoku", "'maze'"]),
    (BASE + "model: {hidden: 1000000000}\n", ["model.hidden=1000000000", "at most 16,384"]),
    ("name: bad\ntask: {name: sudoku, size: 4, n_train: 1000000000}\n", ["task.n_train=1000000000", "at most"]),
    (BASE + "train: {steps: 1000000000}\n", ["train.steps=1000000000", "at most"]),
    (BASE + "train: {batch_size: 1000000000}\n", ["train.batch_size", "at most"]),
    (BASE + "train: {lr: .inf}\n", ["train.lr=inf", "finite"]),
    (BASE + "model: {carry: {beta_init: .inf}}\n", ["model.carry.beta_init=inf", "finite"]),
    (BASE + "model: {carry: {clip: .inf}}\n", ["model.carry.clip=inf", "finite"]),
    (BASE + "eval: {perturb_eps: [.nan]}\n", ["eval.perturb_eps=[nan]", "finite"]),
    (BASE + "eval: {tau: .nan}\n", ["eval.tau=nan", "finite"]),
    (BASE + "resources: {gpu: .nan}\n", ["resources.gpu", "must be >= 0"]),
    (BASE + "train: {betas: [0.9, 1.0]}\n", ["train.betas=", "lie in [0, 1)"]),
])
def test_bad_spec_values_are_refused_naming_file_and_key(tmp_path, text, needles):
    with pytest.raises(ConfigError) as e:
        load_study(write(tmp_path, text))
    msg = str(e.value)
    assert "bad.yaml" in msg and "\n" not in msg
    for n in needles:
        assert n in msg, (n, msg)


def test_cuda_without_gpus_is_refused_before_any_trial(tmp_path):
    from study.run.preflight import check_resources

    study = load_study(write(tmp_path, BASE + "train: {device: cuda}\n"))
    with pytest.raises(ConfigError, match="train.device is 'cuda' but resources.gpu=0"):
        check_resources(study, {"CPU": 2.0})
    cfg = write(tmp_path, "task: {name: sudoku, size: 4}\ntrain: {device: cuda}\n", "cfg.yaml")
    assert_refused(loopstudy("trial", str(cfg), "--no-store"), "no CUDA GPU")


def test_refusals_end_the_same_clean_way_from_every_command(tmp_path):
    spec = write(tmp_path, BASE + "eval: {n_test: -5}\n")
    assert_refused(loopstudy("run", str(spec), "--store", str(tmp_path / "r")), "eval.n_test=-5")
    assert_refused(loopstudy("submit", str(spec), "--address", "http://127.0.0.1:1"), "eval.n_test=-5")
    cfg = write(tmp_path, "task: {name: sudoku, size: 4}\ntrain: {log_every: 0}\n", "cfg.yaml")
    assert_refused(loopstudy("trial", str(cfg)), "train.log_every=0")
    (tmp_path / "afile").write_text("x")
    good = REPO / "tests" / "specs" / "tiny.yaml"
    assert_refused(loopstudy("run", str(good), "--store", str(tmp_path / "afile")), "is a file")
    for args in (("query", "SELECT 1 FROM trials"), ("ls",), ("table", "depth", "--study", "x"), ("status", "x")):
        assert_refused(loopstudy(*args, "--store", str(tmp_path / "nowhere")), "no results store at")


def test_study_names_cannot_leave_the_store(tmp_path):
    cfg = write(tmp_path, "task: {name: sudoku, size: 4}\n", "cfg.yaml")
    proc = loopstudy("trial", str(cfg), "--store", str(tmp_path / "r"), "--study", "../../x")
    assert proc.returncode == 2 and "study name '../../x' is not allowed" in proc.stderr
    assert not (tmp_path / "r").exists() and not list(tmp_path.parent.glob("x*"))
    store = Store(tmp_path / "r")
    for name in ("../../x", "a/b", "a%20b", ".hidden", "", "a b"):
        with pytest.raises(ConfigError):
            store.write("trials", name, "t1", SAMPLES["trials"])
        with pytest.raises(ConfigError):
            store.files("trials", name)
    assert not (tmp_path / "r").exists()


# -- task data ---------------------------------------------------------------------------------------------------------
def test_csv_answers_that_break_the_rules_are_refused_with_file_and_line(tmp_path):
    rows = csv_rows(4, 3, (6, 8), seed=1)
    src, q, a, r = rows[1].split(",")
    for bad_a in ("1" * 16, a[:1] + a[0] + a[2:] if a[0] != a[1] else a[:1] + a[2] + a[2:]):
        q_ok = "." * 16  # no given, so only the rules can catch it
        path = write_csv(tmp_path / "bad.csv", [rows[0], f"{src},{q_ok},{bad_a},{r}", rows[2]])
        with pytest.raises(DataError, match=r"bad.csv:3: a is not a solved 4x4 sudoku"):
            sudoku.load_csv(path, 4)


def test_folder_as_csv_is_a_clean_error_not_a_traceback(tmp_path):
    with pytest.raises(DataError, match="is a folder"):
        sudoku.load_csv(tmp_path, 4)


def test_bad_csv_content_is_refused_before_any_trial_from_run_and_trial(tmp_path):
    rows = csv_rows(4, 4, (6, 8), seed=2)
    src, q, a, r = rows[2].split(",")
    write_csv(tmp_path / "data.csv", [*rows[:2], f"{src},{'.' * 16},{'1' * 16},{r}", rows[3]])
    spec = write(tmp_path, "name: csvstudy\ntask: {name: sudoku, size: 4, csv: data.csv, n_test: 1}\n")
    assert_refused(loopstudy("run", str(spec), "--store", str(tmp_path / "r")), "data.csv:4", "not a solved")
    cfg = write(tmp_path, "task: {name: sudoku, size: 4, csv: data.csv, n_test: 1}\n", "cfg.yaml")
    assert_refused(loopstudy("trial", str(cfg), "--no-store"), "data.csv:4")


def test_csv_without_test_csv_holds_out_its_last_puzzles_and_says_so(tmp_path):
    write_csv(tmp_path / "d.csv", csv_rows(4, 10, (6, 8), seed=3))
    cfg = load_trial(write(tmp_path, "task: {name: sudoku, size: 4, csv: d.csv, n_train: 100, n_test: 3}\n",
                           "c.yaml"))
    task = load_task(cfg.task)
    assert len(task.train) == 7 and len(task.test) == 3
    train_q = {t.tobytes() for t in task.train.inputs}
    assert not any(t.tobytes() in train_q for t in task.test.inputs)  # disjoint
    assert "held out" in task.source and "d.csv" in task.source
    with pytest.raises(DataError, match="leaves none to train on"):
        cfg.task.n_test = 10
        load_task(cfg.task)


def test_relative_csv_is_read_against_the_spec_folder_from_any_working_folder(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_csv(data / "d.csv", csv_rows(4, 6, (6, 8), seed=4))
    spec = write(data, "name: rel\ntask: {name: sudoku, size: 4, csv: d.csv, n_test: 2}\n", "spec.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    old = os.getcwd()
    try:
        os.chdir(elsewhere)
        study = load_study(spec)
    finally:
        os.chdir(old)
    assert study.trials[0].task.csv == str(data / "d.csv")
    assert yaml.safe_load(yaml.safe_dump(study.data))["task"]["csv"] == str(data / "d.csv")  # the saved spec too


def test_trial_identity_holds_the_csv_contents_not_its_path(tmp_path):
    rows = csv_rows(4, 6, (6, 8), seed=5)
    write_csv(tmp_path / "d.csv", rows)
    cfg_path = write(tmp_path, "task: {name: sudoku, size: 4, csv: d.csv, n_test: 2}\n", "c.yaml")
    before = trial_id(load_trial(cfg_path))
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(tmp_path / "d.csv", moved / "d.csv")
    shutil.copy(cfg_path, moved / "c.yaml")
    assert trial_id(load_trial(moved / "c.yaml")) == before  # same bytes elsewhere: the same trial
    write_csv(tmp_path / "d.csv", rows[::-1])
    os.utime(tmp_path / "d.csv", ns=(1, 1))  # a new mtime, so no cached digest can stand in for the new bytes
    assert trial_id(load_trial(cfg_path)) != before  # edited data: a new trial, not the old numbers


# -- the store: nothing counted twice, nothing stale -------------------------------------------------------------------
def test_stray_copies_are_named_and_left_out_so_no_trial_counts_twice(tmp_path, capsys):
    store = Store(tmp_path)
    store.write("depth_eval", "s", "t1", SAMPLES["depth_eval"])
    d = tmp_path / "depth_eval" / "study=s"
    shutil.copy(d / "t1.parquet", d / "t1 (1).parquet")
    (d / "backup").mkdir()
    shutil.copy(d / "t1.parquet", d / "backup" / "t1.parquet")
    shutil.copy(d / "t1.parquet", d / "t2.parquet")  # a renamed copy: its rows say t1
    (tmp_path / "depth_eval" / "study=a%20b").mkdir()
    shutil.copy(d / "t1.parquet", tmp_path / "depth_eval" / "study=a%20b" / "t1.parquet")
    assert store.scan("depth_eval").collect().height == 2  # no --skip-bad needed: strays are never trials
    assert store.read("depth_eval", "s").num_rows == 2
    assert store.studies() == ["s"]
    err = capsys.readouterr().err
    for name in ("t1 (1).parquet", "backup/t1.parquet", "t2.parquet: its rows belong to trial 't1'",
                 "study=a%20b/t1.parquet"):
        assert name in err, (name, err)


def test_a_column_of_the_wrong_type_names_the_file_and_skip_bad_skips_it(tmp_path, capsys):
    store = Store(tmp_path)
    write_trial(store, "s", "good")
    sch = SCHEMAS["depth_eval"].set(SCHEMAS["depth_eval"].get_field_index("exact_acc"), pa.field("exact_acc",
                                                                                                  pa.string()))
    row = {**SAMPLES["depth_eval"][0], "exact_acc": "high", "trial_id": "wrong", "schema_version": 1}
    pq.write_table(pa.Table.from_pylist([row], schema=sch), tmp_path / "depth_eval" / "study=s" / "wrong.parquet")
    with pytest.raises(StoreError, match=r"wrong.parquet: column 'exact_acc' is string.*--skip-bad"):
        store.scan("depth_eval", "s")
    assert store.scan("depth_eval", "s", skip_bad=True).collect()["trial_id"].to_list() == ["good", "good"]
    assert "wrong.parquet" in capsys.readouterr().err
    from study.analysis.tables import build_table

    with pytest.raises(StoreError, match="wrong.parquet"):
        build_table(store, "s", "depth")
    assert build_table(store, "s", "depth", skip_bad=True).height >= 1


@pytest.mark.parametrize("table", list(SCHEMAS))
def test_a_trial_with_a_corrupt_or_missing_file_is_not_complete(tmp_path, table):
    store = Store(tmp_path)
    for tid in ("t1", "t2"):
        write_trial(store, "s", tid)
    assert store.completed_trials("s") == {"t1", "t2"} and store.is_complete("s", "t1")
    path = tmp_path / table / "study=s" / "t1.parquet"
    path.write_bytes(path.read_bytes()[:40])  # truncated mid-write by something other than our atomic writer
    assert store.completed_trials("s") == {"t2"}
    assert not store.is_complete("s", "t1") and store.is_complete("s", "t2")
    path.unlink()
    assert store.completed_trials("s") == {"t2"} and not store.is_complete("s", "t1")


# -- generated: random mutations of the smoke spec ---------------------------------------------------------------------
FAST = {"task": {"n_train": 64, "n_test": 8}, "train": {"steps": 4, "batch_size": 8, "warmup": 1, "log_every": 2,
                                                        "checkpoint_every": 0},
        "eval": {"depths": [12, 24], "stability": [1, 2], "perturb_update": 1, "perturb_updates": 1,
                 "perturb_n": 4}}


def leaves(d, prefix=()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from leaves(v, (*prefix, k))
        yield (*prefix, k), v


def mutate(spec: dict, rng: random.Random) -> tuple[dict, str]:
    spec = yaml.safe_load(yaml.safe_dump(spec))
    path, value = rng.choice(list(leaves(spec)))
    parent = spec
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    kind = rng.choice(["drop", "type", "negative", "zero", "empty", "unknown", "huge"])
    if kind == "drop" and path in (("train",), ("model",)):  # valid, but the defaults train for minutes
        kind = "unknown"
    if kind == "drop":
        del parent[key]
    elif kind == "type":
        parent[key] = rng.choice(["lots", [1, 2], {"x": 1}, None, True])
    elif kind == "negative":
        parent[key] = -abs(value) if isinstance(value, int | float) and not isinstance(value, bool) else -1
    elif kind == "zero":
        parent[key] = 0
    elif kind == "empty":
        parent[key] = [] if rng.random() < 0.5 else {}
    elif kind == "unknown":
        parent[key + "_typo"] = value
    else:
        parent[key] = 10 ** 9
    return spec, f"{kind} {'.'.join(map(str, path))}"


def test_random_mutations_of_the_smoke_spec_are_refused_cleanly_or_run_to_completion(tmp_path):
    """Each mutation either fails in load_study with a one-line ConfigError naming the file (that is all the CLI
    does before Ray starts), or every trial it expands to trains and evaluates to completion."""
    from study.config import build_trial, to_dict
    from study.spec import Study
    from study.trial.execute import run_trial

    base = yaml.safe_load((REPO / "search_spaces" / "smoke.yaml").read_text())
    for section, values in FAST.items():
        base[section].update(values)
    base["sweep"]["variants"] = base["sweep"]["variants"][:1] + base["sweep"]["variants"][2:]  # carry_last, fprm
    rng = random.Random(0)
    refused = ran = 0
    for i in range(40):
        spec, what = mutate(base, rng)
        path = tmp_path / f"m{i}.yaml"
        path.write_text(yaml.safe_dump(spec))
        try:
            study: Study = load_study(path)
        except ConfigError as e:
            msg = str(e)
            assert msg.startswith(str(path)) and "Traceback" not in msg, (what, msg)
            refused += 1
            continue
        configs = study.trials or [build_trial({**study.spec.base(), "seed": study.spec.sweep.seeds[0]})]
        for cfg in configs[:1]:  # the variants share every mutated key; one keeps the test fast
            metrics, _ = run_trial(build_trial(to_dict(cfg)))
            assert 0.0 <= metrics["final_exact_acc"] <= 1.0, what
        ran += 1
    assert refused >= 8 and ran >= 8, (refused, ran)


def test_a_refused_mutation_exits_2_from_the_command_line_without_starting_ray(tmp_path):
    spec = yaml.safe_load((REPO / "search_spaces" / "smoke.yaml").read_text())
    spec["sweep"]["seeds"] = []
    path = write(tmp_path, yaml.safe_dump(spec), "m.yaml")
    assert_refused(loopstudy("run", str(path), "--store", str(tmp_path / "r")), "sweep.seeds")
    assert not (tmp_path / "r").exists()


def test_polars_reads_the_study_column_the_same_as_pyarrow(tmp_path):
    store = Store(tmp_path)
    store.write("depth_eval", "a.b-c_1", "t1", SAMPLES["depth_eval"])
    assert pl.from_arrow(store.read("depth_eval"))["study"].unique().to_list() == ["a.b-c_1"]
    assert store.scan("depth_eval").collect()["study"].unique().to_list() == ["a.b-c_1"]


# -- round 2: paths are literal, one file rule, bounded parsing, one error boundary -----------------------------------
def test_a_root_with_glob_characters_reads_its_own_files_only(tmp_path):
    for name in ("g[1]", "g1", "g2", "gx"):
        write_trial(Store(tmp_path / name), "s", "t1")
    for name in ("g[1]", "g?", "g*"):
        (tmp_path / name).mkdir(exist_ok=True)
        write_trial(Store(tmp_path / name), "s", f"own{len(name)}")
        got = pl.from_arrow(Store(tmp_path / name).read("trials", "s"))
        assert got["trial_id"].to_list() == sorted({"t1", f"own{len(name)}"} & {
            p.stem for p in (tmp_path / name).rglob("*.parquet") if p.parent.parent.name == "trials"}), name


def test_a_root_or_folder_with_an_equals_sign_is_not_a_hive_partition(tmp_path):
    store = Store(tmp_path / "a=b" / "results")
    write_trial(store, "s", "t1")
    got = pl.from_arrow(store.read("depth_eval", "s"))
    assert got["study"].unique().to_list() == ["s"] and "a" not in got.columns
    from study.analysis.tables import build_table

    assert build_table(store, "s", "depth").height >= 1


def test_a_symlinked_or_fifo_trial_file_is_neither_complete_nor_read_and_never_hangs(tmp_path, capsys):
    store = Store(tmp_path)
    write_trial(store, "s", "t1")
    for table in SCHEMAS:
        os.symlink(tmp_path / table / "study=s" / "t1.parquet", tmp_path / table / "study=s" / "t2.parquet")
    os.mkfifo(tmp_path / "trials" / "study=s" / "t2.parquet")  # the trials "file" of t2 is a FIFO
    assert store.completed_trials("s") == {"t1"} and not store.is_complete("s", "t2")
    assert pl.from_arrow(store.read("depth_eval", "s"))["trial_id"].unique().to_list() == ["t1"]
    assert "t2.parquet: not a trial file" in capsys.readouterr().err
    proc = loopstudy("ls", "--store", str(tmp_path), timeout=60)  # a FIFO never blocks a listing
    assert proc.returncode == 0, proc.stderr


def test_a_study_folder_that_is_a_symlink_is_left_out_by_every_reader_and_counter(tmp_path, capsys):
    """One file rule: ls, status, tables, queries, completeness and DuckDB all leave a linked study folder out."""
    import duckdb

    real, root = tmp_path / "real", tmp_path / "root"
    write_trial(Store(real), "s", "t1")
    write_trial(Store(real), "s", "t2")
    for table in [*SCHEMAS, "trials"]:
        (root / table).mkdir(parents=True)
        os.symlink(real / table / "study=s", root / table / "study=s")
    store = Store(root)
    assert store.studies() == [] and "study=s: a symbolic link: not followed" in capsys.readouterr().err
    for call in (lambda: store.completed_trials("s"), lambda: store.read("trials", "s"),
                 lambda: store.is_complete("s", "t1"), lambda: store.trial_row("s", "t1"),
                 lambda: store.write("trials", "s", "t3", [])):
        with pytest.raises(StoreError, match="study=s is a symbolic link: not followed"):
            call()
    assert store.read("trials").num_rows == 0
    try:  # DuckDB, an outside reader, does not follow the link either: it finds no file
        outside = duckdb.sql(f"SELECT count(*) FROM read_parquet('{root}/trials/**/*.parquet')").fetchall()[0][0]
    except duckdb.IOException:
        outside = 0
    assert outside == 0
    ls = loopstudy("ls", "--store", str(root))
    assert ls.returncode == 0 and "study=s: a symbolic link: not followed" in ls.stderr and "\ns " not in ls.stdout
    q = loopstudy("query", "SELECT count(*) AS n FROM trials", "--store", str(root), "--format", "csv")
    assert q.returncode == 0 and q.stdout.split() == ["n", "0"], q.stdout + q.stderr
    status = loopstudy("status", "s", "--store", str(root))
    assert status.returncode == 2 and "symbolic link" in status.stderr + status.stdout, status.stderr


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("storage,says", [
    ("sqlite:///{tmp}/no-such-folder/optuna.db", "cannot be opened (("),
    ("postgresql://alice:s3cret-pw@127.0.0.1:{port}/db", "driver is not installed here: pip install psycopg2-binary"),
    ("{tmp}/not-a-journal.journal", "is not an Optuna journal file"),
])
def test_an_optuna_storage_that_cannot_be_opened_is_one_line_before_anything_starts(tmp_path, storage, says):
    (tmp_path / "not-a-journal.journal").write_bytes(b"not a journal\n\x00\x01")
    storage = storage.format(tmp=tmp_path, port=closed_port())
    proc = loopstudy("run", "search_spaces/optuna_hpo.yaml", f"sweep.optuna.storage={storage}",
                     "--store", str(tmp_path / "r"), timeout=120)
    assert_refused(proc, says)
    assert "s3cret" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r" / "_tune").exists()


@pytest.mark.parametrize("tracking,says", [
    ("tracking.mlflow=http://admin:s3cret-pw@127.0.0.1:{port}", "no MLflow server answers within 5s"),
    ("tracking.mlflow=sqlite:///{tmp}/no-such-folder/mlflow.db", "no-such-folder does not exist"),
    ("tracking.wandb=online", "tracking.wandb: online needs a W&B account: set WANDB_API_KEY"),
])
def test_a_tracker_out_of_reach_is_one_line_before_ray_starts(tmp_path, tracking, says, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    override = tracking.format(tmp=tmp_path, port=closed_port())
    proc = loopstudy("run", "tests/specs/tiny.yaml", override, "--store", str(tmp_path / "r"), timeout=60)
    assert_refused(proc, says)  # (and Ray never started)
    assert "s3cret" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_query_sees_the_store_tables_and_no_other_file(tmp_path):
    write_trial(Store(tmp_path), "s", "t1")
    for q in ("SELECT * FROM read_csv('/etc/passwd')", "select * from READ_PARQUET('/tmp/x.parquet')"):
        assert_refused(loopstudy("query", q, "--store", str(tmp_path)), "reads files", "store's tables only")
    assert loopstudy("query", "SELECT count(*) AS n FROM trials", "--store", str(tmp_path)).returncode == 0


@pytest.mark.parametrize("q", [
    "SELECT * FROM read_text('/etc/hostname')", "SELECT * FROM Read_Json_Auto('/etc/hostname')",
    "SELECT * FROM glob('/etc/*')", "SELECT * FROM read_parquet(['/tmp/a.parquet'])", "FROM read_csv('/etc/passwd')",
    "SELECT * FROM parquet_scan('/tmp/a.parquet')", "COPY trials TO '/tmp/loopstudy-leak.csv'",
    "ATTACH '/tmp/loopstudy-leak.db' AS x", "INSTALL httpfs", "LOAD httpfs",
    "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')",
])
def test_query_cannot_reach_a_file_an_extension_or_the_network_however_it_is_spelled(store_with_a_trial, q):
    with pytest.raises(AnalysisError, match="query refused: .*store's tables only") as e:
        query.sql(store_with_a_trial, q)
    assert len(str(e.value)) <= 300
    assert not Path("/tmp/loopstudy-leak.csv").exists() and not Path("/tmp/loopstudy-leak.db").exists()


@pytest.mark.parametrize("q", ["SELECT * FROM '/etc/passwd'", "SET enable_external_access = true",
                               "SET lock_configuration = false", "SET memory_limit = '100GB'"])
def test_query_cannot_name_a_path_as_a_table_or_unlock_the_sandbox(store_with_a_trial, q):
    with pytest.raises(AnalysisError, match="query failed: ") as e:
        query.sql(store_with_a_trial, q)
    assert len(str(e.value)) <= 300 and "root:" not in str(e.value)


def test_a_query_that_builds_billions_of_rows_stops_at_the_time_and_memory_limits(store_with_a_trial):
    # each query with only the limit it meets in reach: on a busy machine the list takes more than 2 s to build
    with pytest.raises(AnalysisError, match="stopped after 2s .*time limit"):
        query.sql(store_with_a_trial, "SELECT count(*) FROM range(100000000) a, range(100000000) b",
                  limits=query.QueryLimits(seconds=2, memory="256MB"))
    with pytest.raises(AnalysisError, match="more than 256MB of memory"):
        query.sql(store_with_a_trial, "SELECT list(range) FROM range(300000000)",
                  limits=query.QueryLimits(seconds=600, memory="256MB"))


def test_a_query_returns_at_most_its_row_limit_and_says_so(store_with_a_trial, capsys):
    out = query.sql(store_with_a_trial, "SELECT * FROM range(25)", limits=query.QueryLimits(rows=10))
    assert out.height == 10 and "the first 10 rows; the query returns more" in capsys.readouterr().err


def test_a_refused_query_prints_one_short_line_from_the_cli(tmp_path):
    write_trial(Store(tmp_path), "s", "t1")
    proc = loopstudy("query", "SELEC garbage FROM (((", "--store", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and len(proc.stderr) <= 320, proc.stderr


@pytest.mark.parametrize("q", ["SELECT count(*) FROM trials; SELECT count(*) FROM depth_eval",
                               "SELECT 1; DROP TABLE trials", "SELECT 1;;SELECT 2"])
def test_several_statements_in_one_query_are_refused(store_with_a_trial, q):
    with pytest.raises(AnalysisError, match="2 statements in one; give one per call"):
        query.sql(store_with_a_trial, q)


def test_a_query_answers_in_csv_and_json_with_every_value_as_stored(tmp_path):
    import json

    store = Store(tmp_path)
    write_trial(store, "s", "t1")
    q = "SELECT 0.0595857966123::DOUBLE AS x, 59585.8::DOUBLE AS big, [1, 2] AS xs"
    as_csv = loopstudy("query", q, "--store", str(tmp_path), "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    assert as_csv.stdout == "x,big,xs\n0.0595857966123,59585.8,\"[1, 2]\"\n"
    as_json = loopstudy("query", q, "--store", str(tmp_path), "--format", "json")
    assert json.loads(as_json.stdout) == [{"x": 0.0595857966123, "big": 59585.8, "xs": [1, 2]}]
    out = loopstudy("query", q, "--store", str(tmp_path), "--out", str(tmp_path / "a.parquet"))
    assert out.returncode == 0 and out.stdout == ""
    assert pl.read_parquet(tmp_path / "a.parquet").to_dicts() == [{"x": 0.0595857966123, "big": 59585.8,
                                                                   "xs": [1, 2]}]
    shown = loopstudy("query", q, "--store", str(tmp_path))
    assert "0.060" in shown.stdout and "59,585.8" in shown.stdout  # the terminal rounds for reading


@pytest.fixture
def store_with_a_trial(tmp_path):
    store = Store(tmp_path)
    write_trial(store, "s", "t1")
    return store


def test_a_trial_whose_loss_becomes_nan_fails_with_the_reason_and_stores_nothing(tmp_path):
    cfg = write(tmp_path, "task: {name: sudoku, size: 4, n_train: 64, n_test: 8}\nmodel: {hidden: 16, heads: 2, "
                "n_layers: 1, H: 1, L: 1}\ntrain: {steps: 30, batch_size: 8, lr: 1.0e+30, grad_clip: 0, "
                "log_every: 10, warmup: 1}\n", "cfg.yaml")
    proc = loopstudy("trial", str(cfg), "--store", str(tmp_path / "r"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "training loss became" in proc.stderr and "stores no results" in proc.stderr
    assert not Store(tmp_path / "r").completed_trials("adhoc")


# ids named here: a test's id goes into its environment (PYTEST_CURRENT_TEST), where a 2 MiB one leaves no room to
# start a subprocess
@pytest.mark.parametrize("text,needle", [
    pytest.param("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")),
        "expands to more than", id="billion-laughs"),
    pytest.param("name: x\n" + "k: " + "[" * 5000 + "]" * 5000 + "\n", "nested", id="nested-5000-deep"),
    pytest.param("name: x\nname: y\n", "key 'name' appears twice", id="duplicate-key"),
    pytest.param("name: bad\ntask: {size: 4, size: 6}\n", "key 'size' appears twice", id="duplicate-nested-key"),
    pytest.param("name: x\nd: '" + "y" * (2 << 20) + "'\n", "at most 1,048,576 bytes", id="2MiB-spec"),
])
def test_specs_that_would_cost_without_bound_or_mislead_are_refused(tmp_path, text, needle):
    spec = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_study(spec)
    assert needle in str(e.value) and len(str(e.value)) < 2000, str(e.value)[:500]
    assert_refused(loopstudy("run", str(spec), "--store", str(tmp_path / "r")), needle)


@pytest.mark.parametrize("raw,needle", [
    (b"name: caf\xe9\n", "not UTF-8 text"),
    ("name: x\n".encode("utf-16"), "UTF-16"),
])
def test_a_spec_that_is_not_utf8_is_refused(tmp_path, raw, needle):
    spec = tmp_path / "bad.yaml"
    spec.write_bytes(raw)
    assert_refused(loopstudy("run", str(spec), "--store", str(tmp_path / "r")), needle)
    assert_refused(loopstudy("run", str(tmp_path), "--store", str(tmp_path / "r")), "is a folder")


@pytest.mark.parametrize("override,needle", [
    ("eval.depths=[12,24", "override eval.depths: not valid YAML"),
    ("model.carry=" + "{a: " * 100 + "1" + "}" * 100, "nested more than"),
    ("model..L=2", "is not a dotted key"),
    ("train.lr=.nan", "train.lr=nan"),
])
def test_malformed_overrides_are_one_clear_line(tmp_path, override, needle):
    spec = write(tmp_path, BASE)
    assert_refused(loopstudy("run", str(spec), override, "--store", str(tmp_path / "r")), needle)


def test_damaged_files_under_the_root_are_one_line_or_ignored_with_a_warning(tmp_path):
    store = Store(tmp_path)
    write_trial(store, "s", "t1")
    (tmp_path / "_studies").mkdir()
    (tmp_path / "_studies" / "s.yaml").write_bytes(b"name: s\nsweep: {grid: [\n")
    assert_refused(loopstudy("status", "s", "--store", str(tmp_path)), "_studies/s.yaml", "not valid YAML")
    (tmp_path / "_studies" / "s.yaml").write_bytes(b"\xff\xfe")
    assert_refused(loopstudy("status", "s", "--store", str(tmp_path)), "not UTF-8")
    (tmp_path / "_studies" / "s.yaml").unlink()
    store.compact("s", grace_s=0)
    write_trial(store, "s", "t2")
    (tmp_path / "_compacting").mkdir(exist_ok=True)
    (tmp_path / "_compacting" / "s.json").write_text("{half")
    proc = loopstudy("query", "SELECT count(*) AS n FROM trials", "--store", str(tmp_path), "--format", "csv")
    assert proc.returncode == 0 and proc.stdout.splitlines()[1] == "2" and "damaged compaction marker" in proc.stderr


def test_output_paths_of_the_wrong_kind_are_handled(tmp_path):
    store = Store(tmp_path / "r")
    write_trial(store, "s", "t1")
    (tmp_path / "afile").write_text("x")
    assert_refused(loopstudy("plot", "depth", "--study", "s", "--store", store.uri, "--figures",
                             str(tmp_path / "afile")), "is a file; give a folder")
    (tmp_path / "out").mkdir()
    proc = loopstudy("report", "s", "--store", store.uri, "--out", str(tmp_path / "out"))
    assert proc.returncode == 0 and (tmp_path / "out" / "s_report.html").exists(), proc.stderr[-2000:]


@pytest.mark.parametrize("args,needle", [
    (("compact", "s", "--grace", "-1"), "--grace"), (("compact", "s", "--grace", "nan"), "--grace"),
    (("compact", "s", "--grace", "inf"), "--grace"), (("run", "x.yaml", "--num-cpus", "-1"), "--num-cpus"),
])
def test_bad_option_values_are_refused_before_anything_runs(tmp_path, args, needle):
    proc = loopstudy(*args, "--store", str(tmp_path))
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "_compacting").exists()


def test_a_store_path_that_is_not_utf8_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "study.cli", "ls", "--store", os.fsdecode(b"/tmp/\xff\xfe")],
                          cwd=REPO, capture_output=True, timeout=60)
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr and b"not a UTF-8 path" in proc.stderr


def test_a_home_that_is_a_file_does_not_stop_a_trial(tmp_path, monkeypatch):
    from study.tasks.loader import default_cache_dir

    (tmp_path / "home").write_text("not a folder")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOOPSTUDY_CACHE", raising=False)
    assert default_cache_dir().parts[-2:] == ("loopstudy", "datasets")
    assert not str(default_cache_dir()).startswith(str(tmp_path / "home"))


def test_a_full_disk_is_said_plainly():
    import errno

    from study.cli import os_error_line

    line = os_error_line(OSError(errno.ENOSPC, "No space left on device", "/r/trials/study=s/.t1.tmp"))
    assert "no space left" in line and "nothing half-written was left" in line and "/r/trials" in line
    assert "cannot write" in os_error_line(OSError(errno.EROFS, "Read-only file system", "/r"))


# -- generated: random overrides, YAML text and store paths ------------------------------------------------------------
NASTY = ["[", "]", "{", "}", "*", "?", "=", "&a", "*a", "!!python/object:os.system", "\x00", "\udcff", "..", "%2F",
         ":", "-", "#", "'", '"', "\n", "\t", "  ", "|", ">", ".inf", ".nan", "1e999", "-0", "~", "null"]


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(NASTY + list("abcxyz019.,_ ")) for _ in range(n))


def test_random_overrides_are_refused_in_one_line_or_accepted(tmp_path):
    """load_study with a random key=value: a valid config, or one ConfigError line naming the override or file;
    never another exception."""
    from study.config import parse_overrides

    spec = write(tmp_path, BASE)
    keys = ["train.lr", "model.carry.rule", "eval.depths", "model..L", "task", "sweep.grid", "x.y", "model.H"]
    rng = random.Random(1)
    refused = 0
    for _ in range(300):
        pair = f"{rng.choice(keys + [random_text(rng, 4)])}={random_text(rng, rng.randint(0, 12))}"
        try:
            parse_overrides([pair])
            load_study(spec, [pair])
        except ConfigError as e:
            assert "\n" not in str(e).strip() or str(e).count(str(spec)) >= 1, (pair, str(e)[:300])
            assert len(str(e)) < 5000, pair
            refused += 1
    assert refused > 100


def test_random_yaml_texts_are_refused_in_one_line_or_loaded(tmp_path):
    rng = random.Random(2)
    base = (REPO / "search_spaces" / "smoke.yaml").read_text()
    for i in range(200):
        at = rng.randrange(len(base))
        text = base[:at] + random_text(rng, rng.randint(1, 8)) + base[at + rng.randint(0, 5):]
        path = tmp_path / f"y{i}.yaml"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        try:
            load_study(path)
        except ConfigError as e:
            assert str(e).startswith(str(path)), (text[max(0, at - 20):at + 20], str(e)[:300])


@pytest.mark.parametrize("name", ["g[1]", "g*", "a=b", "sp ace", "per%cent", "new\nline", "x..y", "-dash", "ü"])
def test_stores_at_any_path_read_back_exactly_their_own_rows(tmp_path, name):
    root = tmp_path / name
    store = Store(root)
    write_trial(store, "s", "t1")
    write_trial(Store(tmp_path / "g1"), "s", "other")  # a sibling a glob would match
    assert pl.from_arrow(store.read("trials"))["trial_id"].to_list() == ["t1"]
    assert store.completed_trials("s") == {"t1"}
    proc = loopstudy("table", "depth", "--study", "s", "--store", str(root), "--format", "csv")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-1000:]


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB file system (tmpfs, mounted as root): a full disk for real; skipped where mounting is not allowed."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_ends_in_one_line_and_leaves_nothing_half_written(small_disk, tmp_path):
    store = Store(small_disk / "r")
    write_trial(store, "s", "t1")
    with contextlib.suppress(OSError), open(small_disk / "ballast", "wb") as f:  # fill what is left
        while True:
            f.write(b"\0" * 1024)
            f.flush()
    proc = loopstudy("compact", "s", "--store", str(small_disk / "r"), "--grace", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "no space left on the device" in proc.stderr and "nothing half-written was left" in proc.stderr
    assert not [p for p in (small_disk / "r").rglob("*") if p.name.endswith(".tmp")]  # no temporary file left
    assert store.completed_trials("s") == {"t1"}  # and the trial is as it was


@pytest.fixture
def read_only_store(tmp_path):
    """A store with one complete trial on a file system remounted read-only: refused writes for real, even to root
    (which ignores permission bits); skipped where mounting is not allowed."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        write_trial(Store(mnt / "r"), "tiny", "t1")
        if subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        yield mnt / "r"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("command", [
    ["run", "tests/specs/tiny.yaml", "train.steps=4", "sweep.seeds=[0]"],
    ["trial", "configs/sudoku4_infiloop.yaml", "train.steps=400", "--study", "tiny"],
    ["compact", "tiny", "--grace", "0"],
], ids=["run", "trial", "compact"])
def test_a_read_only_store_is_refused_in_one_line_before_any_work(read_only_store, command):
    proc = loopstudy(*command, "--store", str(read_only_store))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("loopstudy: ") and "Read-only file system" in line and "writable --store" in line, line
    assert "nothing was changed" in line or "nothing was run" in line
    assert "parameters" not in proc.stderr and "on Ray" not in proc.stderr  # before training, before Ray
    assert Store(read_only_store).completed_trials("tiny") == {"t1"}


def test_a_disk_that_fills_during_a_run_ends_in_loopstudys_lines_only(tmp_path):
    """A 1.5 MiB store: trials, Tune's state and its error files all meet a full disk. Whatever gives first, the
    terminal shows loopstudy's lines (each failed trial with its reason in one line), no traceback."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        proc = loopstudy("run", "tests/specs/tiny.yaml", "--store", str(mnt / "r"), "--no-plot", "--num-cpus", "2",
                         "sweep.max_failures=0", timeout=600)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "no space left on the device" in proc.stderr or "No space left on device" in proc.stderr
    assert all(ln.startswith(("[tiny]", "loopstudy:", "figures:")) for ln in proc.stderr.splitlines() if ln.strip()), \
        proc.stderr[-3000:]


def test_the_end_of_run_release_of_placement_groups_says_what_it_could_not_do_and_never_raises():
    """It runs in fit's finally, after the trials: a cluster gone by then (the driver disconnected) is a line on
    stderr, never an exception that turns a finished run into a failed one, and it starts no Ray of its own."""
    code = ("import ray\n"
            "from study.run.leftovers import release_leftover_placement_groups\n"
            "print('released', release_leftover_placement_groups(grace_s=0), 'ray started', ray.is_initialized())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": ""})
    assert proc.returncode == 0 and proc.stdout.strip() == "released 0 ray started False", proc.stderr[-2000:]
    assert "not connected to the cluster" in proc.stderr
