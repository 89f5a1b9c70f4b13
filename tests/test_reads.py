"""The statement of which fields a trial reads (study.config.usage): complete, true of the model, and used to
refuse sweeps that cannot change anything."""

import dataclasses

import pytest
import torch

from study.config import TrialConfig, flatten, to_dict
from study.config.usage import ALWAYS_READ, READ_WHEN, unread
from study.errors import ConfigError
from study.models.reasoner import build_reasoner
from study.spec import load_study
from study.tasks import COMMON_FIELDS, TASKS, TaskSpec

BASE = "name: inert\ntask: {name: sudoku, size: 4, n_test: 16}\n"


def test_every_field_of_the_schema_is_placed_in_the_statement():
    fields = set(flatten(to_dict(TrialConfig())))
    task_fields = {f"task.{k}" for d in TASKS.values() for k in d.reads} | {f"task.{k}" for k in COMMON_FIELDS}
    placed = set(READ_WHEN) | ALWAYS_READ | task_fields
    assert fields - placed == set(), "place these in study/config/usage.py"
    assert set(READ_WHEN) | ALWAYS_READ <= fields  # nothing stale in the statement
    assert set(READ_WHEN).isdisjoint(ALWAYS_READ)


def rollout(cfg: TrialConfig) -> torch.Tensor:
    torch.manual_seed(0)
    model = build_reasoner(cfg.model, TaskSpec("test", 6, 16, (4, 4))).eval()
    tokens = torch.randint(0, 6, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        state = model.rollout(tokens, 4)
    return model.logits(state)


def with_(cfg: TrialConfig, key: str, value) -> TrialConfig:
    section, *rest = key.split(".")
    if len(rest) == 1:
        return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{rest[0]: value})})
    model = cfg.model
    sub = dataclasses.replace(getattr(model, rest[0]), **{rest[1]: value})
    return dataclasses.replace(cfg, model=dataclasses.replace(model, **{rest[0]: sub}))


SMALL = {"hidden": 16, "heads": 2, "n_layers": 1, "H": 2, "L": 2}


@pytest.mark.parametrize("model,key,a,b", [
    ({"carry": {"rule": "carry_last"}}, "model.carry.beta_init", 0.3, 0.9),
    ({"carry": {"rule": "carry_last"}}, "model.carry.placement", "inner", "outer"),
    ({"carry": {"rule": "damped"}}, "model.carry.clip", 2.0, 6.0),
    ({"carry": {"rule": "carry_last"}}, "model.carry.reset_inner", False, True),
    ({"kind": "flat"}, "model.L", 2, 5),
    ({"norm": "pre"}, "model.a2_init", 0.25, 0.75),
    ({"carry": {"rule": "infiloop", "content_score": False}}, "model.carry.clip", 2.0, 6.0),
])
def test_a_field_the_statement_calls_unread_leaves_the_model_unchanged(model, key, a, b):
    from study.config import build_trial

    cfg = build_trial({"model": {**SMALL, **model}})
    assert unread(with_(cfg, key, a), key) is not None
    assert torch.equal(rollout(with_(cfg, key, a)), rollout(with_(cfg, key, b)))


@pytest.mark.parametrize("model,key,a,b", [
    ({"carry": {"rule": "infiloop"}}, "model.carry.beta_init", 0.3, 0.9),
    ({"carry": {"rule": "infiloop"}}, "model.carry.placement", "inner", "outer"),
    ({"kind": "nested"}, "model.L", 2, 5),
    ({"norm": "pre", "residual_scaling": True}, "model.a2_init", 0.25, 0.75),  # b1 depends on a2 (nested too)
])
def test_the_same_field_where_it_is_read_changes_the_model(model, key, a, b):
    from study.config import build_trial

    cfg = build_trial({"model": {**SMALL, **model}})
    assert unread(with_(cfg, key, a), key) is None
    assert not torch.equal(rollout(with_(cfg, key, a)), rollout(with_(cfg, key, b)))


@pytest.mark.parametrize("sweep,needles", [
    ("grid: {model.carry.beta_init: [0.3, 0.7]}", ["model.carry.beta_init is never read", "infiloop"]),
    ("grid: {model.carry.placement: [inner, outer]}", ["model.carry.placement is never read", "carry_last"]),
    ("grid: {model.halting.tau: [0.1, 0.01]}", ["model.halting.tau is never read", "halting"]),
    ("grid: {eval.tau: [0.1, 0.01]}", ["eval.tau is never read", "halts"]),
    ("grid: {model.halting.patience: [2, 5]}", ["model.halting.patience is never read"]),
    ("grid: {eval.perturb_eps: [[0.1], [0.3]]}", ["eval.perturb_eps is never read", "perturb_update"]),
    ("grid: {model.a2_init: [0.25, 0.5]}", ["model.a2_init is never read"]),
    ("variants: [{name: a, model.carry.rule: carry_last, model.carry.beta_init: 0.3},"
     " {name: b, model.carry.rule: carry_last, model.carry.beta_init: 0.7}]",
     ["model.carry.beta_init is never read"]),
    ("variants: [{name: a, model.carry.rule: carry_last, model.carry.beta_init: 0.3},"
     " {name: b, model.carry.rule: carry_last, model.carry.beta_init: 0.7},"
     " {name: c, model.carry.rule: infiloop, model.carry.beta_init: 0.5}]",
     ["are the same trial", "model.carry.beta_init is not read", "'label': 'a'", "'label': 'b'"]),
    ("grid: {model.carry.rule: [carry_last, infiloop], model.carry.beta_init: [0.3, 0.7]}",
     ["are the same trial", "'model.carry.rule': 'carry_last'"]),
])
def test_sweeps_that_cannot_change_anything_are_refused(tmp_path, sweep, needles):
    spec = tmp_path / "inert.yaml"
    spec.write_text(BASE + f"sweep: {{{sweep}}}\n")
    with pytest.raises(ConfigError) as e:
        load_study(spec)
    msg = str(e.value)
    assert "inert.yaml" in msg and "\n" not in msg
    for n in needles:
        assert n in msg, (n, msg)


def test_a_task_field_of_another_task_cannot_be_swept(tmp_path):
    spec = tmp_path / "inert.yaml"
    spec.write_text("name: inert\ntask: {name: maze, size: 5, n_test: 16}\n"
                    "sweep: {grid: {task.blanks: [[4, 6], [6, 8]]}}\n")
    with pytest.raises(ConfigError, match="task.blanks is never read: task 'maze' does not read it"):
        load_study(spec)


def test_sweeps_where_every_value_matters_still_load(tmp_path):
    spec = tmp_path / "fine.yaml"
    spec.write_text(BASE + "model: {carry: {rule: infiloop}, halting: {enabled: true}}\n"
                    "sweep: {grid: {model.carry.beta_init: [0.3, 0.7], eval.tau: [0.1, 0.01]}}\n")
    assert len(load_study(spec).trials) == 4
