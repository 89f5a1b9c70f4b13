"""TRM's ACT in training (train.act; shared/spec/reference_models.md, "Training (ACT)").

The trainer carries a batch of B samples across optimizer steps. Each step:
  1. rows that halted at the previous step take the rows of a freshly drawn batch, and the model's initial state;
     the other rows keep their state (detached) and their data;
  2. one update (H steps) of every row, its logits and the Q head's (halt, continue) logits;
  3. a row has had one more update; it halts at train.n_sup updates (TRM's halt_max_steps), or when the Q head
     says so (no_continue: q_halt > 0; continue: q_halt > q_continue), but not before a minimum that it draws anew
     every step: with probability train.halt_exploration a number from 2 to n_sup, else none.
The loss is study.trial.loss.act_loss; with `continue` (HRM) q_continue learns a Q-learning target from one more
update of the same rows without gradient. The exploration draws come from the trainer's data RNG for the global
batch, so data-parallel workers and a resumed run draw what one uninterrupted worker draws.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from study.config import TrainConfig
from study.models.halting import HaltState
from study.models.reasoner import LoopState, Reasoner
from study.tasks import Split


@dataclass
class ActCarry:
    """The carried batch: each row's data, loop state (None before the first step), updates so far, halted."""

    tokens: torch.Tensor  # (B, S)
    labels: torch.Tensor  # (B, S)
    state: LoopState | None
    updates: torch.Tensor  # (B,) long
    halted: torch.Tensor  # (B,) bool


def exploration(rng: np.random.Generator, cfg: TrainConfig, batch_size: int) -> np.ndarray:
    """Each row's minimum number of updates before it may halt, drawn anew every step (0: no minimum)."""
    if cfg.n_sup < 2:  # every row halts after its one update
        return np.zeros(batch_size, dtype=np.int64)
    explore = rng.random(batch_size) < cfg.halt_exploration
    return explore * rng.integers(2, cfg.n_sup + 1, size=batch_size)


def refill(carry: ActCarry | None, fresh: Split, device: torch.device) -> ActCarry:
    """The carry with the halted rows' data replaced by `fresh`'s rows and their updates set to 0 (every row at
    the first step)."""
    tokens = torch.as_tensor(fresh.inputs, device=device)
    labels = torch.as_tensor(fresh.labels, device=device)
    if carry is None:
        n = len(tokens)
        return ActCarry(tokens, labels, None, torch.zeros(n, dtype=torch.long, device=device),
                        torch.ones(n, dtype=torch.bool, device=device))
    reset = carry.halted
    row = reset[:, None]
    return ActCarry(torch.where(row, tokens, carry.tokens), torch.where(row, labels, carry.labels), carry.state,
                    torch.where(reset, 0, carry.updates), reset)


def start_state(model: Reasoner, x: torch.Tensor, carry: ActCarry) -> LoopState:
    """Each row's state before this step's update: the initial state where it was reset, its carried state
    (detached) elsewhere."""
    fresh = model.init_state(x)
    if carry.state is None:
        return fresh
    kept, reset = carry.state.detach(), carry.halted
    if bool(reset.all()):
        return fresh

    def rows(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        return torch.where(reset.view(-1, *([1] * (new.dim() - 1))), new, old)

    halt = HaltState(**{f.name: rows(getattr(fresh.halt, f.name), getattr(kept.halt, f.name))
                        for f in dataclasses.fields(HaltState)})
    inner = fresh.inner.select(~reset, kept.inner) if fresh.inner is not None else None
    return LoopState(fresh.outer.select(~reset, kept.outer), inner, halt, kept.steps)


@torch.no_grad()
def halts(updates: torch.Tensor, q_halt: torch.Tensor, q_continue: torch.Tensor, minimum: torch.Tensor,
          cfg: TrainConfig) -> torch.Tensor:
    """Which rows halt after this step, given their updates so far (this one included)."""
    halted = updates >= cfg.n_sup
    if cfg.n_sup > 1:
        halted = halted | ((q_halt > 0) if cfg.act == "no_continue" else (q_halt > q_continue))
        halted = halted & (updates >= minimum)
    return halted


@torch.no_grad()
def continue_target(model: Reasoner, x: torch.Tensor, state: LoopState, updates: torch.Tensor,
                    cfg: TrainConfig) -> torch.Tensor:
    """HRM's Q-learning target for q_continue: sigmoid of the next update's halt logit at a row's last update,
    else of the larger of the next update's two logits."""
    nxt_halt, nxt_continue = model.q_logits(model.update(x, state.detach()))
    return torch.sigmoid(torch.where(updates >= cfg.n_sup, nxt_halt, torch.maximum(nxt_halt, nxt_continue)))
