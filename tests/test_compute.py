"""Test-time compute per reading: FLOPs per sample counted once per model and width, exact for every carry rule,
the steps each sample actually ran (halting shows), stored beside eff_layers, and rows from before read as null."""

import dataclasses

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from study.config import EvalConfig, ModelConfig, TaskConfig
from study.evaluate import evaluate
from study.evaluate.compute import RolloutFlops
from study.metrics import METRICS, summary_metrics
from study.models import build_reasoner
from study.store import Store
from study.tasks import TaskSpec
from study.tasks.loader import load_task

SPEC = TaskSpec("test", 5, 6, (6,))


def model_for(rule: str, kind: str = "nested", **kw):
    torch.manual_seed(0)
    carry = dataclasses.replace(ModelConfig().carry, rule=rule)
    cfg = ModelConfig(kind=kind, hidden=16, heads=2, n_layers=1, H=2, L=2, carry=carry, **kw)
    return build_reasoner(cfg, SPEC).eval()


def counted_rollout(model, tokens, n: int) -> int:
    """FLOPs of a real n-step rollout of one sample plus one readout, counted step by step."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        x = model.embed(tokens)
        state = model.init_state(x)
        for _ in range(n):
            state = model.step(state, x)
        model.logits(state)
    return counter.get_total_flops()


@pytest.mark.parametrize("rule,kind", [("carry_last", "nested"), ("infiloop", "nested"), ("full_attnres", "nested"),
                                       ("damped", "flat"), ("full_attnres", "flat")])
def test_flops_per_sample_equal_a_counted_rollout_for_every_carry_rule(rule, kind):
    model = model_for(rule, kind)
    tokens = torch.randint(0, 5, (3, 6))
    flops = RolloutFlops(model)
    for n in (1, 2, 3, 7, 20):
        assert flops.per_sample(tokens, np.array([n]))[0] == counted_rollout(model, tokens[:1], n)


def test_full_attention_residuals_cost_grows_with_the_steps_and_the_others_do_not():
    tokens = torch.randint(0, 5, (1, 6))
    per_step = {}
    for rule in ("carry_last", "infiloop", "full_attnres"):
        f = RolloutFlops(model_for(rule)).per_sample(tokens, np.array([10, 20, 40]))
        per_step[rule] = np.diff(f) / np.array([10, 20])  # FLOPs per extra step, from 10 to 20 and 20 to 40
    assert per_step["carry_last"][0] == per_step["carry_last"][1]
    assert per_step["infiloop"][0] == per_step["infiloop"][1]
    assert per_step["full_attnres"][1] > per_step["full_attnres"][0]


def test_a_width_is_counted_once_and_each_width_separately():
    flops = RolloutFlops(model_for("carry_last"))
    narrow, wide = torch.randint(0, 5, (2, 4)), torch.randint(0, 5, (2, 6))
    assert flops.per_sample(narrow, np.array([5, 5]))[0] < flops.per_sample(wide, np.array([5, 5]))[0]
    assert set(flops._counts) == {4, 6}


def test_depth_rows_carry_flops_of_the_steps_each_sample_ran_so_halting_shows(tmp_path):
    task = load_task(TaskConfig(name="sudoku", size=4, blanks=(8, 10), n_train=64, n_test=16, cache_dir=str(tmp_path)))
    torch.manual_seed(0)
    cfg = ModelConfig(kind="flat", hidden=16, heads=2, n_layers=2, H=2, norm="pre", residual_scaling=True,
                      carry=dataclasses.replace(ModelConfig().carry, rule="damped"))
    model = build_reasoner(cfg, task.spec)
    full = [r for r in evaluate(model, task, EvalConfig(depths=[4, 8, 40])).depth if r.difficulty is None]
    per_layer = (full[1].flops - full[0].flops) / 4  # readout once per reading, the rest per executed layer
    assert full[2].flops - full[1].flops == pytest.approx(per_layer * 32)
    assert all(r.rollout_s > 0 for r in full) and full[0].rollout_s <= full[-1].rollout_s
    # halting at a loose tau: samples stop early, and a reading costs only the layers they ran
    halted = evaluate(model, task, EvalConfig(depths=[4, 8, 40], halting=True, tau=0.5)).depth
    deep = next(r for r in halted if r.difficulty is None and r.depth_layers == 40)
    assert deep.eff_layers < 40 and deep.flops < full[-1].flops
    assert summary_metrics(halted, None)["final_flops"] == deep.flops
    assert METRICS["final_flops"].mode == "min" and METRICS["final_flops"].searchable


def test_depth_rows_stored_before_flops_were_counted_read_with_nulls(tmp_path):
    old = pa.table({"trial_id": ["t1"], "schema_version": pa.array([1], pa.int32()), "depth_layers": [12],
                    "outer_cycles": [2], "difficulty": pa.array([None], pa.int64()), "n": [8], "exact_acc": [0.5],
                    "cell_acc": [0.7], "halted_frac": [0.0], "eff_layers": [12.0]})
    folder = tmp_path / "depth_eval" / "study=old"
    folder.mkdir(parents=True)
    pq.write_table(old, folder / "t1.parquet")
    got = pl.from_arrow(Store(str(tmp_path)).read("depth_eval", "old"))
    assert got["flops"].to_list() == [None] and got["rollout_s"].to_list() == [None]
    assert got["exact_acc"].to_list() == [0.5]
    assert "final_flops" not in summary_metrics(got.to_dicts(), None)
