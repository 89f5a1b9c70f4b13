"""ARC's puzzle embedding trained as TRM trains it: sparse sign-SGD on the rows a batch used, against a dense
reference; the rest of the table untouched and no optimizer state; AdamW kept as an option; the keys refused where
no puzzle embedding exists."""

import pytest
import torch
from torch import nn

from study.config import TrainConfig, build_trial, trial_id
from study.errors import ConfigError
from study.spec import load_study
from study.tasks.loader import load_task
from study.trial.optimizers import SparseSignSGD
from study.trial.train import Trainer

from .conftest import REPO


def test_sparse_sign_sgd_equals_a_dense_reference_and_leaves_other_rows_alone():
    torch.manual_seed(0)
    sparse, dense = nn.Embedding(50, 8, sparse=True), nn.Embedding(50, 8)
    dense.load_state_dict(sparse.state_dict())
    ids = torch.tensor([3, 7, 3, 41, 7, 7, 0])  # repeated ids: their gradients add up before the sign
    target = torch.randn(len(ids), 8)
    lr, wd = 0.01, 0.1
    opt = SparseSignSGD([sparse.weight], lr=lr, weight_decay=wd)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        ((sparse(ids) - target) ** 2).sum().backward()
        opt.step()
        # the reference: the dense gradient, and sign-SGD with decoupled decay on the used rows only
        dense.zero_grad(set_to_none=True)
        ((dense(ids) - target) ** 2).sum().backward()
        with torch.no_grad():
            rows = ids.unique()
            w = dense.weight[rows] * (1 - lr * wd) - lr * dense.weight.grad[rows].sign()
            dense.weight[rows] = w
    assert torch.equal(sparse.weight, dense.weight)
    assert not opt.state  # no moments: nothing beside the table
    torch.manual_seed(0)
    before = nn.Embedding(50, 8).weight.detach()  # the same initial table
    untouched = [i for i in range(50) if i not in (0, 3, 7, 41)]
    assert torch.equal(sparse.weight[untouched], before[untouched])


def arc_trainer(tmp_path, **train):
    cfg = build_trial({"task": {"name": "arc", "size": 6, "n_train": 8, "n_test": 4, "n_aug": 2,
                                "cache_dir": str(tmp_path / "cache")},
                       "model": {"hidden": 16, "heads": 2, "n_layers": 1, "H": 2, "L": 1},
                       "train": {"steps": 2, "batch_size": 4, "n_sup": 1, "warmup": 1, **train}})
    from study.models import build_reasoner

    task = load_task(cfg.task)
    torch.manual_seed(0)
    return Trainer(build_reasoner(cfg.model, task.spec), task, cfg.train, seed=0), cfg


def test_an_arc_trainer_moves_only_the_puzzle_rows_of_its_batches(tmp_path):
    trainer, _ = arc_trainer(tmp_path)
    table = trainer.model.puzzle.weight
    table.data.normal_()  # (zero at the start, as TRM's: give the rows values to tell them apart)
    before = table.detach().clone()
    used = set()
    batch = trainer.next_batch

    def recording():
        b = batch()
        used.update(b.inputs[:, -1].tolist())
        return b

    trainer.next_batch = recording
    trainer.fit()
    changed = {i for i in range(len(table)) if not torch.equal(table[i], before[i])}
    assert changed and changed <= used and len(table) > len(used)
    assert all(table is not p for g in trainer.opt.param_groups for p in g["params"])  # not in the model's AdamW
    assert not trainer.puzzle_opt.state


def test_adamw_for_the_puzzle_embedding_is_an_option_with_its_own_lr(tmp_path):
    trainer, _ = arc_trainer(tmp_path, puzzle_optimizer="adamw", puzzle_lr=0.05, puzzle_weight_decay=0.0)
    group = trainer.puzzle_opt.param_groups[0]
    assert isinstance(trainer.puzzle_opt, torch.optim.AdamW) and group["weight_decay"] == 0.0
    trainer.fit()
    assert group["lr"] == pytest.approx(0.05)  # past the warmup: the peak it was given


def test_the_puzzle_keys_keep_stored_trial_ids_and_are_refused_where_no_table_exists(tmp_path):
    assert TrainConfig().puzzle_optimizer == "sign_sgd" and TrainConfig().puzzle_lr == 1e-2
    assert trial_id(build_trial({"train": {"puzzle_lr": 1e-2}})) == trial_id(build_trial({}))
    spec = tmp_path / "s.yaml"
    spec.write_text((REPO / "search_spaces" / "smoke.yaml").read_text().replace(
        "  seeds: [0]", "  grid: {train.puzzle_lr: [0.01, 0.02]}\n  seeds: [0]"))
    with pytest.raises(ConfigError, match="the model has no puzzle embedding"):
        load_study(spec)


def test_a_model_without_a_puzzle_embedding_clips_its_parameters_in_their_own_order(tmp_path):
    """The clip's norm is a float sum whose order shows in the last bits, and 320 steps later in the accuracy: a
    model without a puzzle table must clip exactly the parameters, in exactly the order, it always has."""
    from study.models import build_reasoner

    cfg = build_trial({"task": {"name": "sudoku", "size": 4, "n_train": 16, "n_test": 4,
                                "cache_dir": str(tmp_path / "cache")}})
    task = load_task(cfg.task)
    model = build_reasoner(cfg.model, task.spec)
    trainer = Trainer(model, task, cfg.train, seed=0)
    assert trainer.clipped == list(model.parameters()) and trainer.puzzle_opt is None
