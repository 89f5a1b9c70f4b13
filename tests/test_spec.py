"""Study specs: every shipped spec validates; bad specs fail before any trial, naming file, key and allowed values."""

from pathlib import Path

import pytest

from study.config import trial_id
from study.errors import ConfigError
from study.run.preflight import check_resources
from study.spec import load_study

from .conftest import REPO

SPECS = sorted((REPO / "search_spaces").rglob("*.yaml"))


def test_the_mission_sweeps_and_their_paper_twins_ship():
    names = {p.relative_to(REPO / "search_spaces").as_posix() for p in SPECS}
    for n in ("smoke", "beta_init", "residual_scaling", "halting", "axis_placement", "depth_scaling", "optuna_hpo",
              "pareto_search"):
        assert f"{n}.yaml" in names and f"paper/{n}.yaml" in names


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.relative_to(REPO / "search_spaces").as_posix())
def test_every_spec_in_search_spaces_validates(path):
    study = load_study(path)
    if study.is_optuna:
        assert study.spec.sweep.optuna.num_samples >= 1
    else:
        ids = [trial_id(c) for c in study.trials]
        assert ids and len(ids) == len(set(ids))


def test_depth_scaling_reads_24960_layers_and_expands_variants_times_seeds():
    study = load_study(REPO / "search_spaces" / "depth_scaling.yaml")
    assert len(study.trials) == 3 * 3
    assert all(max(c.eval.depths) == 24960 for c in study.trials)
    assert {c.label for c in study.trials} == {"trm_carry_last", "infiloop_both", "fprm"}


def test_beta_init_sweep_has_the_papers_points():
    study = load_study(REPO / "search_spaces" / "beta_init.yaml")
    points = {(c.model.carry.beta_init, c.model.carry.learn_beta) for c in study.trials}
    assert points == {(0.10, True), (0.55, True), (0.90, True), (0.55, False), (1.0, False), (1.82, False)}


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


BASE = "name: bad\ntask: {name: sudoku, size: 4}\n"


@pytest.mark.parametrize("text,needles", [
    (BASE + "model: {hiden: 64}\n", ["bad.yaml", "model.hiden", "unknown key"]),
    (BASE + "model: {hidden: lots}\n", ["bad.yaml", "model.hidden", "integer"]),
    (BASE + "model: {carry: {beta_init: 0.0}}\n", ["bad.yaml", "model.carry.beta_init=0.0", "> 0"]),
    (BASE + "sweep: {grid: {model.carry.beta_init: [0.5, -1.0]}}\n", ["bad.yaml", "beta_init=-1.0", "> 0"]),
    (BASE + "model: {carry: {rule: carry_first}}\n", ["bad.yaml", "model.carry.rule", "carry_last"]),
    (BASE + "model: {a1_init: 1.0}\n", ["bad.yaml", "model.a1_init=1.0", "[0, 1)"]),
    (BASE + "eval: {depths: [13]}\n", ["bad.yaml", "eval.depths=13", "nearest valid depths"]),
    (BASE + "sweep: {grid: {model.L: [1, 2]}, optuna: {space: {train.lr: {type: uniform, low: 0.001, high: 0.01}}}}\n",
     ["bad.yaml", "sweep.grid", "optuna", "choice"]),
    (BASE + "resourses: {cpu: 1}\n", ["bad.yaml", "resourses", "unknown key"]),
    (BASE + "sweep: {grid: {seeed: [1]}}\n", ["bad.yaml", "seeed", "must start with"]),
])
def test_bad_specs_fail_naming_file_key_and_allowed_values(tmp_path, text, needles):
    with pytest.raises(ConfigError) as e:
        load_study(write(tmp_path, text))
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_gpus_asked_of_a_cpu_only_cluster_are_refused_before_any_trial(tmp_path):
    study = load_study(write(tmp_path, BASE + "resources: {cpu: 1, gpu: 0.25}\ntrain: {device: cuda}\n"))
    with pytest.raises(ConfigError, match=r"bad.yaml: resources.gpu=0.25 but the cluster has no GPUs; allowed"):
        check_resources(study, {"CPU": 2.0})
    check_resources(study, {"CPU": 2.0, "GPU": 1.0})  # fine where there are GPUs


def test_head_local_storage_with_remote_nodes_is_refused_with_what_to_use(monkeypatch):
    import ray

    from study.run.preflight import check_storage

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.1")  # the driver's node on a real cluster
    nodes = [{"NodeManagerAddress": "10.0.0.1"}, {"NodeManagerAddress": "10.0.0.7"}]
    with pytest.raises(ConfigError, match=r"10.0.0.7.*NFS.*--shared-storage.*s3://"):
        check_storage("/home/me/results", nodes, shared=False)
    check_storage("s3://bucket/results", nodes, shared=False)
    check_storage("/mnt/nfs/results", nodes, shared=True)
    check_storage("/tmp/x", [{"NodeManagerAddress": "10.0.0.1"}], shared=False)
    with pytest.raises(ConfigError, match=r"task data '/home/me/d.csv' is a file on this machine.*10.0.0.7"):
        check_storage("s3://bucket/results", nodes, shared=False, data_files=["/home/me/d.csv"])
    check_storage("s3://bucket/results", nodes, shared=True, data_files=["/mnt/nfs/d.csv"])


def test_identical_sweep_points_resolve_to_one_trial(tmp_path):
    study = load_study(write(tmp_path, BASE + "sweep: {variants: [{name: a, model.L: 2}, {name: b, model.L: 2}]}\n"))
    assert len(study.trials) == 1


def test_knobs_added_later_keep_stored_trial_ids_until_set():
    from study.config import EvalConfig, HaltingConfig, ModelConfig, TrialConfig

    assert trial_id(TrialConfig()) == "d2789f012f68"  # the id results were stored under before eval.tau existed
    assert trial_id(TrialConfig(eval=EvalConfig(tau=0.01))) != "d2789f012f68"
    ev = EvalConfig(halting=True, tau=0.01, gamma=0.99).model_config(ModelConfig(halting=HaltingConfig(tau=0.1)))
    assert (ev.halting.enabled, ev.halting.tau, ev.halting.gamma) == (True, 0.01, 0.99)
    with pytest.raises(ValueError, match="eval.tau=0"):
        EvalConfig(tau=0)


def test_a_corrected_arithmetic_gives_its_trials_new_ids_and_leaves_the_rest():
    from study.config import ModelConfig, TrialConfig

    # TRM-MLP's token norm now runs over the positions: its stored trials (this id) computed another model
    assert trial_id(TrialConfig(model=ModelConfig(mixer="mlp", pos="none"))) != "35b7fb0e077f"
    assert trial_id(TrialConfig()) == "d2789f012f68"  # attention's trials keep theirs


def test_overthinking_readout_variants_share_the_baselines_training():
    """max_conf and test-time halting are read off the very weights of carry_last_no_recall (paired by seed)."""
    study = load_study(REPO / "search_spaces" / "cpu" / "overthinking.yaml")
    by = {(c.label, c.seed): c for c in study.trials}
    for seed in range(5):
        base = by[("carry_last_no_recall", seed)]
        for label in ("carry_last_no_recall_max_conf", "carry_last_no_recall_halting"):
            other = by[(label, seed)]
            assert (other.task, other.model, other.train) == (base.task, base.model, base.train)
            assert other.eval != base.eval
