"""Plugins by entry point: the example distribution (examples/plugins, installed by the README's test command) on the
3-node loopback cluster, broken plugins refused in one line, and what a plugin's version does to trial identity."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from study.config import build_trial, trial_id
from study.config.rules import FOUND as RULES_FOUND
from study.store import Store

from .conftest import REPO
from .test_ray_studies import add_node, remove_node

SPEC = "examples/plugins/momentum_reverse.yaml"


def loopstudy(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RAY_ADDRESS": "", **(env or {})})


def test_plugins_lists_the_built_ins_and_the_example_with_their_distribution_version_and_settings():
    proc = loopstudy("plugins")
    assert proc.returncode == 0, proc.stderr
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines() if ln.startswith("  ")}
    assert "loopstudy-example-plugins 0.1.0" in lines["momentum"] and "[model.carry.mu]" in lines["momentum"]
    assert "loopstudy_example.momentum:RULE" in lines["momentum"]
    assert "loopstudy-example-plugins 0.1.0" in lines["reverse"] and "task.min_length" in lines["reverse"]
    assert "(built-in)" in lines["infiloop"] and "(built-in)" in lines["sudoku"]
    full = json.loads(loopstudy("schema").stdout)["$defs"]
    own = json.loads(loopstudy("schema", "--own").stdout)["$defs"]
    assert "momentum" in full["CarryConfig"]["properties"]["rule"]["enum"] and "mu" in full["CarryConfig"]["properties"]
    assert "reverse" in full["TaskConfig"]["properties"]["name"]["enum"]
    assert "momentum" not in own["CarryConfig"]["properties"]["rule"]["enum"]
    assert "mu" not in own["CarryConfig"]["properties"]
    assert "reverse" not in own["TaskConfig"]["properties"]["name"]["enum"]


def config(**model):
    return build_trial({"task": {"name": "reverse", "length": 6}, "model": {"pos": "none", **model}})


def test_an_outside_plugins_version_is_part_of_its_trials_identity_and_no_other_trials(monkeypatch):
    momentum = config(carry={"rule": "momentum"})
    plain = config(carry={"rule": "carry_last"})
    # an outside rule's setting a trial does not run changes nothing; one it runs does
    assert trial_id(plain) == trial_id(config(carry={"rule": "carry_last", "mu": 0.9}))
    assert trial_id(momentum) != trial_id(config(carry={"rule": "momentum", "mu": 0.9}))
    before = {"momentum": trial_id(momentum), "plain": trial_id(plain),
              "sudoku": trial_id(build_trial({"task": {"name": "sudoku"}}))}
    infiloop = build_trial({"task": {"name": "sudoku"}, "model": {"carry": {"rule": "infiloop"}}})
    before["infiloop"] = trial_id(infiloop)
    upgraded = dataclasses.replace(RULES_FOUND.origin["momentum"], version="0.2.0")
    monkeypatch.setitem(RULES_FOUND.origin, "momentum", upgraded)
    assert trial_id(momentum) != before["momentum"]  # upgrading the plugin stales the trials that run it
    # the reverse task is a plugin too: its trials carry its version; a built-in task's trial carries none
    assert trial_id(plain) == before["plain"]
    assert trial_id(build_trial({"task": {"name": "sudoku"}})) == before["sudoku"]
    builtin = dataclasses.replace(RULES_FOUND.origin["infiloop"], version="99.0")
    monkeypatch.setitem(RULES_FOUND.origin, "infiloop", builtin)
    assert trial_id(infiloop) == before["infiloop"]  # a built-in's version is in no trial's identity


BROKEN = {
    "loopstudy_broken/__init__.py": "",
    "loopstudy_broken/noimport.py": "raise ImportError('needs torch_scatter, which is not installed')\n",
    "loopstudy_broken/defs.py": """
        from study.config.rules import CarryRuleDef

        NOSTEP = CarryRuleDef("nostep", "loopstudy_broken.rules:NoStep")
        BADSHAPE = CarryRuleDef("badshape", "loopstudy_broken.rules:BadShape")
        NAN = CarryRuleDef("nan", "loopstudy_broken.rules:Nan")
        WRONGNAME = CarryRuleDef("othername", "loopstudy_broken.rules:Nan")
    """,
    "loopstudy_broken/task.py": """
        import numpy as np
        from study.tasks.base import Split, TaskDef, TaskSpec

        def generate(cfg, which, n, seed):  # 3 tokens per sample, where its spec says 5
            return Split(np.zeros((n, 3), dtype=np.int64), np.zeros((n, 3), dtype=np.int64), np.zeros(n, np.int64))

        BADTASK = TaskDef("badtask", spec=lambda cfg: TaskSpec("badtask", 4, 5, (5,)), generate=generate)
    """,
    "loopstudy_broken/rules.py": """
        import torch
        from study.models.carry import CarryRule, CarryState

        class NoStep(CarryRule):
            pass

        class BadShape(CarryRule):
            def step(self, state, z, eta=None, *, in_place=False):
                return CarryState(z[..., :-1])

        class Nan(CarryRule):
            def step(self, state, z, eta=None, *, in_place=False):
                return CarryState(z * float("nan"))
    """,
    "loopstudy_broken-0.1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: loopstudy-broken\nVersion: 0.1.0\n",
    "loopstudy_broken-0.1.0.dist-info/entry_points.txt": """
        [loopstudy.carry_rules]
        noimport = loopstudy_broken.noimport:RULE
        nostep = loopstudy_broken.defs:NOSTEP
        badshape = loopstudy_broken.defs:BADSHAPE
        nan = loopstudy_broken.defs:NAN
        wrongname = loopstudy_broken.defs:WRONGNAME
        [loopstudy.tasks]
        badtask = loopstudy_broken.task:BADTASK
    """,
}


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory):
    """A folder on PYTHONPATH holding a distribution of broken plugins (its dist-info: entry points as pip writes
    them)."""
    site = tmp_path_factory.mktemp("site")
    for rel, text in BROKEN.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text).lstrip())
    return site


@pytest.mark.parametrize("rule,task,needle", [
    ("noimport", "sudoku", "does not import: ImportError: needs torch_scatter"),
    ("nostep", "sudoku", "lacks step"),
    ("badshape", "sudoku", "returned a state of shape (2, 3, 7)"),
    ("nan", "sudoku", "non-finite state"),
    ("wrongname", "sudoku", "defines the name 'othername'"),
    ("carry_last", "badtask", "its train split has inputs (4, 3)"),
])
def test_a_broken_plugin_is_refused_in_one_line_naming_it_and_its_entry_point(broken_site, tmp_path, rule, task,
                                                                               needle):
    trial = tmp_path / "t.yaml"
    trial.write_text(f"task: {{name: {task}, size: 4}}\nmodel: {{carry: {{rule: {rule}}}}}\ntrain: {{steps: 1}}\n"
                     if task == "sudoku" else f"task: {{name: {task}}}\ntrain: {{steps: 1}}\n")
    proc = loopstudy("trial", str(trial), "--store", str(tmp_path / "r"), env={"PYTHONPATH": str(broken_site)})
    err = proc.stderr.strip()
    assert proc.returncode == 2 and needle in err and err.count("\n") == 0, err
    name = rule if task == "sudoku" else task
    assert f"{name!r}" in err and "entry point loopstudy." in err and f"{name} = loopstudy_broken." in err, err
    assert not (tmp_path / "r").exists()


def test_broken_plugins_installed_beside_others_leave_every_other_part_working(broken_site):
    env = {"PYTHONPATH": str(broken_site)}
    listed = loopstudy("plugins", env=env)
    assert listed.returncode == 0
    assert "noimport" in listed.stdout and "BROKEN" in listed.stdout and "momentum " in listed.stdout
    assert loopstudy("schema", env=env).returncode == 0


def test_a_plugin_study_runs_on_the_cluster_and_every_reader_names_the_plugins_settings(ray_cluster, tmp_path):
    overrides = ["train.steps=30", "sweep.optuna.num_samples=3", "task.n_train=256", "task.n_test=32"]
    proc = loopstudy("run", SPEC, *overrides, "--address", ray_cluster["address"], "--store", str(tmp_path),
                     "--figures", str(tmp_path / "figures"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = pl.from_arrow(Store(tmp_path).read("trials", "momentum_reverse"))
    assert trials.height == 3 and (trials["status"] == "complete").all()
    assert set(trials["model.carry.rule"]) == {"momentum"} and set(trials["task.name"]) == {"reverse"}
    assert trials["model.carry.mu"].n_unique() == 3  # Optuna drew the plugin's hyperparameter
    # named in the fewest digits (at least 3) that keep the samples apart; the stored value stays whole
    from study.run.naming import float_labels

    labels = float_labels(trials["model.carry.mu"].to_list())
    settings = sorted(f"mu={labels[mu]}" for mu in trials["model.carry.mu"])
    assert all(len(s) < 12 for s in settings), settings
    query = loopstudy("query", "SELECT \"model.carry.mu\" AS mu FROM trials ORDER BY mu", "--study",
                      "momentum_reverse", "--store", str(tmp_path), "--format", "json")
    assert query.returncode == 0, query.stderr
    assert [r["mu"] for r in json.loads(query.stdout)] == sorted(trials["model.carry.mu"].to_list())
    for kind in ("depth", "pareto"):
        table = loopstudy("table", kind, "--study", "momentum_reverse", "--store", str(tmp_path), "--format", "csv")
        assert table.returncode == 0, table.stderr
        assert sorted(set(pl.read_csv(table.stdout.encode())["setting"])) == settings
    compare = loopstudy("table", "compare", "--study", "momentum_reverse", "--store", str(tmp_path), "--baseline",
                        settings[0])
    assert compare.returncode == 0 and settings[1] in compare.stdout, compare.stderr
    report = loopstudy("report", "momentum_reverse", "--store", str(tmp_path), "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0 and all(s in (tmp_path / "r.html").read_text() for s in settings)
    assert {p.name for p in (tmp_path / "figures").glob("*.png")} >= {"momentum_reverse_depth.png",
                                                                      "momentum_reverse_pareto.png"}


def test_a_node_with_another_version_of_a_plugin_is_refused_by_name_before_any_trial(ray_cluster, tmp_path):
    old = tmp_path / "old-site"  # an older install of the example on this node: its metadata first on its path
    info = old / "loopstudy_example_plugins-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: loopstudy-example-plugins\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[loopstudy.carry_rules]\nmomentum = loopstudy_example.momentum:RULE\n"
                                           "[loopstudy.tasks]\nreverse = loopstudy_example.reverse:TASK\n")
    add_node("old", {"PYTHONPATH": str(old)})  # (removed again below: the next test's preflight must not meet it)
    try:
        proc = loopstudy("run", SPEC, "train.steps=10", "--address", ray_cluster["address"], "--store",
                         str(tmp_path / "r"), "--no-plot")
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "has loopstudy-example-plugins==0.0.1 for plugin" in err[-1] and "127.0.0.1" in err[-1], err[-1]
        assert "runs loopstudy-example-plugins==0.1.0" in err[-1]
        assert not (tmp_path / "r" / "trials").exists()
    finally:
        remove_node("old", ray_cluster["dashboard"])


def test_the_example_distribution_is_what_the_readme_installs():
    readme = (REPO / "README.md").read_text()
    assert "-e examples/plugins" in readme
    assert Path(REPO / "examples" / "plugins" / "pyproject.toml").is_file()


MIX = {
    "loopstudy_mix/__init__.py": "",
    "loopstudy_mix/defs.py": """
        from dataclasses import dataclass

        from study.config.rules import CarryRuleDef

        @dataclass
        class Settings:
            mix_init: float = 0.5  # the share of the new candidate in the carried state

        RULE = CarryRuleDef("mix", "loopstudy_mix.rule:Mix", Settings)
    """,
    "loopstudy_mix/rule.py": """
        from study.models.carry import CarryRule, CarryState

        class Mix(CarryRule):
            def __init__(self, d, cfg):
                super().__init__(d, cfg)
                self.mix = cfg.settings_of("mix").mix_init

            def step(self, state, z, eta=None, *, in_place=False):
                return CarryState(self.mix * z + (1 - self.mix) * state.h)
    """,
    "loopstudy_mix-0.1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: loopstudy-mix\nVersion: 0.1.0\n",
    "loopstudy_mix-0.1.0.dist-info/entry_points.txt": "[loopstudy.carry_rules]\nmix = loopstudy_mix.defs:RULE\n",
}


def test_a_stored_study_names_the_same_settings_with_its_plugin_uninstalled(tmp_path):
    """Two trials that differ only in a plugin rule's setting are two settings to every reader, whether the plugin
    is installed or not: the store's own columns name them, not the installed config."""
    site = tmp_path / "site"
    for rel, text in MIX.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text).lstrip())
    installed = {"PYTHONPATH": str(site)}
    trial = tmp_path / "t.yaml"
    trial.write_text("task: {name: sudoku, size: 4, n_train: 32, n_test: 8}\nmodel: {hidden: 16, heads: 2, "
                     "n_layers: 1, H: 1, L: 1, carry: {rule: mix}}\ntrain: {steps: 2, batch_size: 8, warmup: 1}\n"
                     "eval: {depths: [2, 6]}\n")
    store = str(tmp_path / "r")
    for mix in (0.2, 0.8):
        proc = loopstudy("trial", str(trial), f"model.carry.mix_init={mix}", "--store", store, "--study", "m",
                         env=installed)
        assert proc.returncode == 0, proc.stderr[-2000:]
    said = {}
    for name, env in (("installed", installed), ("uninstalled", {"PYTHONPATH": ""})):
        table = loopstudy("table", "depth", "--store", store, "--study", "m", "--format", "csv", env=env)
        assert table.returncode == 0, table.stderr[-2000:]
        said[name] = pl.read_csv(table.stdout.encode())
        api = subprocess.run([sys.executable, "-c", "from study.analysis.tables import load_context; "
                              "from study.store import Store; import sys; "
                              "print(sorted(load_context(Store(sys.argv[1]), 'm').trials['setting']))", store],
                             cwd=REPO, capture_output=True, text=True, env={**os.environ, **env})
        assert api.returncode == 0 and api.stdout.strip() == "['mix_init=0.2', 'mix_init=0.8']", api.stdout + \
            api.stderr[-2000:]
    plugins = loopstudy("plugins", env={"PYTHONPATH": ""})
    assert "mix" not in plugins.stdout.split()  # uninstalled indeed
    assert sorted(set(said["installed"]["setting"])) == ["mix_init=0.2", "mix_init=0.8"]
    assert said["uninstalled"].equals(said["installed"])
