"""A trial's optimizers: the model's (train.optimizer: AdamW, or TRM's Adam-atan2, study.trial.adam_atan2) and ARC's
puzzle embedding's (train.puzzle_optimizer), which TRM trains by an optimizer of its own.

The table has a row per puzzle version (730,155 x 512 at the papers' 1,000 versions: 374M parameters, 1.5 GB in
fp32), and a batch uses a few hundred rows. `sign_sgd` (TRM's): the embedding hands back a sparse gradient (only the
rows the batch used, each summed over its uses), and each such row i moves by

    w_i <- w_i (1 - lr * wd) - lr * sign(g_i)

with the other rows untouched and no optimizer state (AdamW's two moments would add 3 GB at paper size). `adamw`:
AdamW in a parameter group of its own (its lr and weight decay), dense as before. Either way the learning rate
follows the model's warmup: train.puzzle_lr is its peak.
"""

from __future__ import annotations

import torch
from torch import nn

from study.trial.adam_atan2 import AdamAtan2


class SparseSignSGD(torch.optim.Optimizer):
    """Sign-SGD with decoupled weight decay on the rows a sparse gradient names (see the module docstring)."""

    def __init__(self, params, lr: float, weight_decay: float):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.coalesce() if p.grad.is_sparse else p.grad.to_sparse(1).coalesce()
                rows = grad.indices()[0]
                p.index_copy_(0, rows, p.index_select(0, rows).mul_(1 - lr * wd).add_(grad.values().sign(), alpha=-lr))


def puzzle_table(model: nn.Module) -> nn.Embedding | None:
    """The model's puzzle embedding, if it has one (ARC)."""
    return getattr(model, "puzzle", None)


def model_optimizer(groups: list[dict], cfg) -> torch.optim.Optimizer:
    """The model's optimizer over `groups` (train.optimizer): AdamW, or TRM's Adam-atan2."""
    if cfg.optimizer == "adam_atan2":
        return AdamAtan2(groups, lr=cfg.lr, betas=cfg.betas)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def optimizers(model: nn.Module, cfg) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer | None]:
    """(the model's optimizer, the puzzle embedding's optimizer or None): the table is in exactly one of them.
    train.weight_decay_on all puts every parameter in one decayed group, as TRM does."""
    table = puzzle_table(model)
    groups = model.param_groups(cfg.weight_decay)
    if cfg.weight_decay_on == "all":
        groups = [{"params": [p for g in groups for p in g["params"]], "weight_decay": cfg.weight_decay}]
    if table is None:
        return model_optimizer(groups, cfg), None
    for g in groups:
        g["params"] = [p for p in g["params"] if p is not table.weight]
    main = model_optimizer(groups, cfg)
    if cfg.puzzle_optimizer == "sign_sgd":
        table.sparse = True  # its backward hands back the batch's rows only
        return main, SparseSignSGD([table.weight], lr=cfg.puzzle_lr, weight_decay=cfg.puzzle_weight_decay)
    table.sparse = False
    return main, torch.optim.AdamW([table.weight], lr=cfg.puzzle_lr, betas=cfg.betas,
                                   weight_decay=cfg.puzzle_weight_decay)
