"""bench/gpu_check.py at tiny size on CPU (--cpu-smoke): every part of the GPU check runs, so it cannot rot before
a GPU is at hand. Also the evaluation's bf16 path, which only GPUs use for speed."""

import json
import subprocess
import sys

import pytest

from .conftest import REPO


def test_gpu_check_cpu_smoke_runs_every_part_and_ends_with_a_json_line():
    """(Part 3's two-trial run starts an embedded Ray, as the check does on a GPU machine.)"""
    proc = subprocess.run([sys.executable, "bench/gpu_check.py", "--cpu-smoke"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    roll = out["rollout"]
    assert roll["flops_per_step"] > 0 and roll["carry_last"]["layers_per_s"] > 0 and roll["infiloop_time_ratio"] > 0
    assert out["training"]["steps"] >= 3 and out["training"]["tflops"] > 0
    assert out["shared_gpu_run"]["ok"] and out["shared_gpu_run"]["trials"] == 2
    comp = out["eval_compile"]
    assert comp["compiled"]["exact_acc"] == comp["eager"]["exact_acc"]  # compiling changes speed, not numbers
    assert out["peak_bf16_tflops"] is None  # no GPU here: no fraction of a peak is claimed


def test_bf16_evaluation_reads_the_same_numbers_within_rounding():
    import torch

    from study.config import CarryConfig, EvalConfig, ModelConfig, TaskConfig
    from study.evaluate import evaluate
    from study.models.reasoner import build_reasoner
    from study.tasks.loader import load_task

    task = load_task(TaskConfig(size=4, blanks=(6, 8), n_train=16, n_test=8))
    torch.manual_seed(0)
    model = build_reasoner(ModelConfig(hidden=32, heads=2, n_layers=1, H=2, L=2, carry=CarryConfig(rule="infiloop")),
                           task.spec)
    ev = EvalConfig(depths=[12, 24], stability=(1, 2), perturb_update=1, perturb_updates=2, perturb_n=4)
    fp32, bf16 = evaluate(model, task, ev), evaluate(model, task, ev, dtype="bf16")
    assert [(r.depth_layers, r.difficulty, r.n) for r in fp32.depth] == [(r.depth_layers, r.difficulty, r.n)
                                                                         for r in bf16.depth]
    # the same readings, numbers within bf16's rounding: at most a few cells of 8 boards read differently
    for a, b in zip(fp32.depth, bf16.depth):
        assert abs(a.cell_acc - b.cell_acc) <= 0.1 and a.eff_layers == b.eff_layers and a.halted_frac == b.halted_frac
    assert [(r.kind, r.axis, r.update) for r in fp32.dynamics] == [(r.kind, r.axis, r.update) for r in bf16.dynamics]
    assert [(r.eps, r.updates_after) for r in fp32.perturbation] == [(r.eps, r.updates_after)
                                                                      for r in bf16.perturbation]
    assert max(abs(a.rel_distance - b.rel_distance) for a, b in zip(fp32.perturbation, bf16.perturbation)) < 0.05


def test_a_reading_takes_its_own_precision_and_a_cpu_without_bf16_units_is_named():
    from study.config import EvalConfig, TrainConfig, TrialConfig, trial_id
    from study.models.precision import has_bf16_units

    fp32 = TrialConfig(train=TrainConfig(dtype="fp32"))
    read_bf16 = TrialConfig(train=TrainConfig(dtype="fp32"), eval=EvalConfig(dtype="bf16"))
    assert trial_id(fp32) == "d2789f012f68" != trial_id(read_bf16)  # a reading in bf16 is another trial
    bf16_trained = TrialConfig(train=TrainConfig(dtype="bf16"))
    assert (read_bf16.reading_dtype, fp32.reading_dtype, bf16_trained.reading_dtype) == ("bf16", "fp32", "bf16")
    assert has_bf16_units("flags : fpu sse avx512f avx512_bf16 amx_tile") and has_bf16_units("flags: amx_bf16")
    assert not has_bf16_units("flags : fpu sse avx2 avx512f avx512_vnni")


@pytest.mark.parametrize("rule", ["carry_last", "infiloop", "full_attnres", "damped"])
def test_a_bf16_reading_to_24960_layers_stays_finite_with_the_carry_accumulators_in_float32(rule):
    """A bf16 reading runs a bf16 copy of the model (TRM's forward dtype); the carry rules, their parameters and
    InfiLoop's running sums stay in float32, and the state stays finite to the papers' deepest reading."""
    import torch

    from study.config import CarryConfig, HaltingConfig, ModelConfig
    from study.models.precision import reading_model
    from study.models.reasoner import build_reasoner
    from study.tasks.base import TaskSpec

    torch.manual_seed(0)
    cfg = ModelConfig(hidden=8, heads=1, n_layers=1, H=1, L=51, conv=False, expansion=2,
                      carry=CarryConfig(rule=rule, placement="outer"), halting=HaltingConfig(patience=2, gamma=0.9))
    model = reading_model(build_reasoner(cfg, TaskSpec("sudoku", 6, 4, (2, 2))).eval(), "cpu", "bf16")
    assert model.tok.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.carry_outer.parameters())
    steps = 24_960 // cfg.layers_per_step  # the papers' deepest reading
    assert steps * cfg.layers_per_step == 24_960
    state = model.rollout(torch.randint(1, 6, (1, 4)), steps)
    if rule == "infiloop":
        assert state.outer.h.dtype == torch.float32 and state.outer.aux["log_d"].dtype == torch.float32
    logits = model.logits(state)
    assert logits.dtype == torch.bfloat16 and bool(torch.isfinite(logits.float()).all())
    assert bool(torch.isfinite(state.outer.h.float()).all()) and bool(torch.isfinite(state.inner.h.float()).all())
