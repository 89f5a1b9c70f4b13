"""Evaluation: one rollout read at many depths = separate rollouts; stability diagnostics on a hand-built case."""

import numpy as np
import pytest
import torch

from study.config import CarryConfig, EvalConfig, HaltingConfig, ModelConfig, TaskConfig
from study.evaluate import Trajectory, dynamics_rows, evaluate, stability
from study.models.reasoner import build_reasoner
from study.tasks.loader import load_task


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return load_task(TaskConfig(name="sudoku", size=4, blanks=(6, 10), n_train=10, n_test=40,
                                cache_dir=str(tmp_path_factory.mktemp("cache"))))


@pytest.mark.parametrize("rule", ["carry_last", "infiloop"])
def test_one_rollout_read_at_several_depths_equals_separate_rollouts(task, rule):
    torch.manual_seed(0)
    cfg = ModelConfig(hidden=16, heads=2, n_layers=1, H=2, L=1, carry=CarryConfig(rule=rule))
    model = build_reasoner(cfg, task.spec)
    depths = [2, 6, 10, 20]
    together = evaluate(model, task, EvalConfig(depths=depths, batch_size=16))
    for d in depths:
        alone = evaluate(model, task, EvalConfig(depths=[d], batch_size=16))
        a = [(r.difficulty, r.n, r.exact_acc, r.cell_acc) for r in together.depth if r.depth_layers == d]
        b = [(r.difficulty, r.n, r.exact_acc, r.cell_acc) for r in alone.depth]
        assert a == b


def test_evaluation_reports_progress_over_every_step_of_every_batch(task):
    cfg = ModelConfig(hidden=16, heads=2, n_layers=1, H=2, L=1)
    model = build_reasoner(cfg, task.spec)
    seen = []
    evaluate(model, task, EvalConfig(depths=[2, 10], batch_size=16), on_progress=lambda d, t: seen.append((d, t)))
    total = seen[-1][1]
    assert [d for d, _ in seen] == list(range(1, total + 1))  # 40 puzzles in 3 batches, every step counted once
    assert total == 3 * 5 and {t for _, t in seen} == {total}


def test_evaluation_with_other_cycle_counts_and_bad_depths(task):
    cfg = ModelConfig(hidden=16, heads=2, n_layers=2, H=2, L=1)
    model = build_reasoner(cfg, task.spec)
    res = evaluate(model, task, EvalConfig(depths=[26, 52], L=12, H=1))
    assert sorted({r.outer_cycles for r in res.depth}) == [1, 2]
    with pytest.raises(ValueError, match=r"eval.depths=27.*\[26, 52\]"):
        evaluate(model, task, EvalConfig(depths=[27], L=12))


def hand_trajectory():
    """Two puzzles, 4 cells, all blank; labels 1..4. Updates 1..4."""
    labels = np.array([[1, 2, 3, 4], [1, 2, 3, 4]])
    preds = np.array([
        [[1, 2, 3, 4], [1, 2, 0, 0]],  # u1: p0 solved; p1 2 wrong
        [[1, 2, 3, 0], [1, 2, 3, 0]],  # u2: p0 loses a cell; p1 1 wrong
        [[1, 2, 3, 4], [1, 0, 3, 4]],  # u3: p0 solved again; p1 flips cell 1 (right at u1) to wrong
        [[1, 2, 3, 4], [1, 2, 3, 4]],  # u4: both solved
    ])
    return Trajectory(preds=preds, labels=labels, free=np.ones((2, 4), bool))


def test_stability_diagnostics_match_hand_computed_values():
    st = stability(hand_trajectory(), 1, 4)
    # changes per update, per puzzle: p0: 1 (u2) + 1 (u3) + 0 = 2; p1: 1 + 2 + 1 = 4 -> mean 3
    assert st["changed"] == 3.0
    # wrong cells u1 -> u4: p0 0 -> 0, p1 2 -> 0: mean delta -1
    assert st["wrong_delta"] == -1.0
    # cells right at u1: p0 4, p1 2 (cells 0, 1) = 6; flipped wrong later: p0 cell 3 (u2), p1 cell 1 (u3) = 2
    assert st["flipped"] == pytest.approx(2 / 6)
    # solved at u1: only p0, and it is lost at u2
    assert st["lost"] == 1.0


def test_per_update_dynamics_rows_on_the_hand_trajectory():
    traj = hand_trajectory()
    traj.gamma = {"outer": np.array([[0.5, 0.4], [0.3, 0.2], [0.9, 0.8], [0.6, 0.95]])}
    traj.score = {"outer": np.array([[8.0, 1.0], [2.0, 3.0], [8.0, 4.0], [8.0, 8.0]])}
    rows = dynamics_rows(traj, ["outer"], EvalConfig(stability=(1, 4), align_window=2))
    upd = [r for r in rows if r.kind == "update"]
    assert [r.solved for r in upd] == [0.5, 0.0, 0.5, 1.0]
    assert [r.lost for r in upd] == [None, 0.5, 0.0, 0.0]
    assert [r.wrong_cells for r in upd] == [1.0, 1.0, 0.5, 0.0]
    aligned = {r.offset: r.gamma_mean for r in rows if r.kind == "aligned"}
    # p0 first solved at u1 (index 0: no earlier update, excluded); p1 first solved at u4 (index 3)
    assert aligned[0] == pytest.approx(0.95) and aligned[-1] == pytest.approx(0.8)
    by_wrong = {r.wrong_cells: r.score_median for r in rows if r.kind == "score_vs_wrong"}
    assert by_wrong[0.0] == 8.0
    (stab,) = [r for r in rows if r.kind == "stability"]
    assert stab.lost == 1.0 and stab.from_update == 1 and stab.update == 4


def test_perturbation_rows_cover_every_eps_and_reference_has_zero_distance(task):
    torch.manual_seed(0)
    cfg = ModelConfig(hidden=16, heads=2, n_layers=1, H=2, L=1, carry=CarryConfig(rule="infiloop"))
    model = build_reasoner(cfg, task.spec)
    res = evaluate(model, task, EvalConfig(depths=[4], perturb_update=1, perturb_updates=3, perturb_n=8,
                                           perturb_eps=[0.0, 1e-3, 0.3]))
    assert len(res.perturbation) == 3 * 3
    zero = [r for r in res.perturbation if r.eps == 0.0]
    assert all(r.rel_distance == 0.0 for r in zero)
    big = [r.rel_distance for r in res.perturbation if r.eps == 0.3]
    small = [r.rel_distance for r in res.perturbation if r.eps == 1e-3]
    assert big[0] > small[0] > 0


def test_perturbed_copies_of_a_halted_state_iterate_again(task):
    # tau far above any residual: every sample has halted by the snapshot. Frozen copies would sit exactly eps away
    # from the reference; restarted ones take a step and move.
    torch.manual_seed(0)
    cfg = ModelConfig(kind="flat", norm="pre", residual_scaling=True, hidden=16, heads=2, n_layers=1, H=2,
                      carry=CarryConfig(rule="damped"), halting=HaltingConfig(enabled=True, tau=1e6))
    model = build_reasoner(cfg, task.spec)
    res = evaluate(model, task, EvalConfig(depths=[4], perturb_update=1, perturb_updates=2, perturb_n=8,
                                           perturb_eps=[1e-2]))
    assert all(abs(r.rel_distance - 1e-2) > 1e-4 for r in res.perturbation)
