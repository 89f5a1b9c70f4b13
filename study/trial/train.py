"""Training (methods.md section 5): deep supervision, truncated BPTT, AdamW with warmup (ARC's puzzle embedding:
its own optimizer, study.trial.optimizers), EMA, checkpoints.

Each batch is supervised `n_sup` times: one update (H steps, gradient through the last `grad_steps`), a loss on
the logits, one optimizer step, then the loop state is detached and carried into the next update. Deep Thinking's
training is n_sup 1 with grad_steps = H (the loss at the last iteration, gradient through every one), optionally
mixed with its progressive loss (train.progressive). With train.act (TRM's ACT, study.trial.act) a batch is one
optimizer step instead: each sample keeps its state from step to step until the Q head halts it. A checkpoint holds
model, optimizer, EMA, every RNG, the step and ACT's carried batch, and is taken between batches, so a resumed run
continues exactly as an uninterrupted one.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from study.config import TrainConfig
from study.errors import TrainingError
from study.models import precision
from study.models.reasoner import LoopState, Reasoner
from study.paths import atomic_target
from study.rows import TrainLog
from study.tasks import IGNORE, Split, accuracies
from study.tasks.loader import Task
from study.trial import act
from study.trial.data_parallel import DataParallel
from study.trial.loss import act_loss, cell_loss
from study.trial.optimizers import optimizers


def lr_at(cfg: TrainConfig, step: int) -> float:
    return cfg.lr * min(1.0, (step + 1) / max(cfg.warmup, 1))


class EMA:
    """Exponential moving average of the weights, used for evaluation."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        for k, v in model.state_dict().items():
            if v.dtype.is_floating_point:
                self.shadow[k].lerp_(v, 1 - self.decay)
            else:
                self.shadow[k].copy_(v)

    def copy_to(self, model: torch.nn.Module) -> torch.nn.Module:
        """A copy of `model` carrying the EMA weights."""
        clone = copy.deepcopy(model)
        clone.load_state_dict(self.shadow)
        return clone


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast(cfg: TrainConfig):
    return precision.autocast(cfg.device, cfg.dtype)


class Trainer:
    """Holds everything a run needs to continue: model, optimizer, EMA, data RNG, step. parallel: this worker's
    place when several train the trial (study.trial.data_parallel); None: one worker, the whole batch."""

    def __init__(self, model: Reasoner, task: Task, cfg: TrainConfig, seed: int,
                 parallel: DataParallel | None = None):
        self.model, self.task, self.cfg, self.seed, self.parallel = model, task, cfg, seed, parallel
        self.device = torch.device(cfg.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.model.to(self.device)
        self.opt, self.puzzle_opt = optimizers(model, cfg)  # ARC's puzzle table: its own
        # clipped in the model's own order (the norm's float sum depends on it): the puzzle table is not clipped
        table = self.model.puzzle.weight if getattr(self.model, "puzzle", None) is not None else None
        self.clipped = [p for p in self.model.parameters() if p is not table]
        # what data-parallel workers sum over, the table too (study.trial.data_parallel)
        self.exchange = parallel.exchange(list(self.model.parameters())) if parallel is not None else None
        self.ema = EMA(model, cfg.ema)
        self.data_rng = np.random.default_rng(seed)
        self.carry: act.ActCarry | None = None  # train.act's carried batch
        self.step = 0
        self.batches = 0
        self.history: list[TrainLog] = []

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(), "opt": self.opt.state_dict(), "ema": self.ema.shadow,
            "puzzle_opt": self.puzzle_opt.state_dict() if self.puzzle_opt else None,
            "data_rng": self.data_rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy_rng": np.random.get_state(), "python_rng": random.getstate(),
            "step": self.step, "batches": self.batches, "history": [vars(h) for h in self.history],
            "act_carry": self.carry,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["opt"])
        if self.puzzle_opt is not None and sd.get("puzzle_opt") is not None:
            self.puzzle_opt.load_state_dict(sd["puzzle_opt"])
        self.ema.shadow = {k: v.to(self.device) for k, v in sd["ema"].items()}
        self.data_rng.bit_generator.state = sd["data_rng"]
        torch.set_rng_state(sd["torch_rng"])
        if sd["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(sd["cuda_rng"])
        np.random.set_state(sd["numpy_rng"])
        random.setstate(sd["python_rng"])
        self.step, self.batches = sd["step"], sd["batches"]
        self.carry = sd.get("act_carry")
        self.history = [TrainLog(**h) for h in sd["history"]]

    def save(self, path: str | Path) -> None:
        """Atomically (study.paths): a reader, or a resume after a crash, sees the old checkpoint or the new."""
        with atomic_target(str(Path(path).resolve())) as tmp:
            torch.save(self.state_dict(), tmp)

    def load(self, path: str | Path) -> None:
        self.load_state_dict(torch.load(path, map_location=self.device, weights_only=False))

    # -- training ------------------------------------------------------------------------------------------------
    def next_batch(self) -> Split:
        idx = self.data_rng.integers(0, len(self.task.train), size=self.cfg.batch_size)
        return self.task.augment(self.task.train.take(idx), self.data_rng)

    def train_batch(self) -> TrainLog:
        """One batch: n_sup supervised updates, an optimizer step after each (with train.act: one ACT step)."""
        cfg, model = self.cfg, self.model
        if cfg.act != "off":
            return self.act_batch()
        model.train()
        batch, scored = self.next_batch(), None
        if self.parallel is not None:  # the global batch's scored cells, then this worker's rows of it
            scored = int((batch.labels != IGNORE).sum())
            batch = batch.take(self.parallel.rows(len(batch)))
        tokens = torch.as_tensor(batch.inputs, device=self.device)
        labels = torch.as_tensor(batch.labels, device=self.device)
        state = None
        t0 = time.perf_counter()
        losses, exact_sum, cell_sum = [], 0.0, 0.0
        for _ in range(cfg.n_sup):
            if self.step >= cfg.steps:
                break
            state, (loss, exact_sum, cell_sum) = self.update(tokens, labels, state, scored)
            losses.append(loss)
        self.batches += 1
        exact_acc, cell_acc = exact_sum / cfg.batch_size, cell_sum / cfg.batch_size  # over the global batch
        log = TrainLog(self.step, float(np.mean(losses)), cell_acc, exact_acc, lr_at(cfg, self.step - 1),
                       time.perf_counter() - t0)
        self.history.append(log)
        return log

    def update(self, tokens: torch.Tensor, labels: torch.Tensor, state: LoopState | None,
               scored: int | None) -> tuple[LoopState, tuple[float, float, float]]:
        """One supervised update from `state` (None: a fresh one) and its optimizer step; returns the state and, over
        the global batch, (the loss, the exactly solved samples, the sum of per-sample cell accuracies). scored: see
        cell_loss."""
        cfg, model = self.cfg, self.model
        self.set_lr()
        with autocast(cfg):
            x = model.embed(tokens)
            state = model.init_state(x) if state is None else state.detach()
            state = model.update(x, state)
            logits = model.logits(state)
            prog = self.progressive_logits(x) if cfg.progressive else None
        loss = cell_loss(logits, labels, cfg.loss, scored)
        if prog is not None:
            loss = (1 - cfg.progressive) * loss + cfg.progressive * cell_loss(prog, labels, cfg.loss, scored)
        return state, self.optimizer_step(loss, logits, labels)

    def act_batch(self) -> TrainLog:
        """One optimizer step of TRM's ACT (study.trial.act): halted rows take fresh samples, every row one update."""
        cfg, model = self.cfg, self.model
        model.train()
        batch = self.next_batch()
        minimum = act.exploration(self.data_rng, cfg, len(batch))
        if self.parallel is not None:
            rows = self.parallel.rows(len(batch))
            batch, minimum = batch.take(rows), minimum[rows]
        t0 = time.perf_counter()
        carry = act.refill(self.carry, batch, self.device)
        updates = carry.updates + 1
        self.set_lr()
        with autocast(cfg):
            x = model.embed(carry.tokens)
            state = model.update(x, act.start_state(model, x, carry))
            logits = model.logits(state)
            q_halt, q_continue = model.q_logits(state)
            target = act.continue_target(model, x, state, updates, cfg) if cfg.act == "continue" else None
        loss, _ = act_loss(logits, carry.labels, q_halt, q_continue, target, cfg.loss, cfg.batch_size)
        loss_sum, exact_sum, cell_sum = self.optimizer_step(loss, logits, carry.labels)
        minimum = torch.as_tensor(minimum, device=self.device)
        halted = act.halts(updates, q_halt.detach(), q_continue.detach(), minimum, cfg)
        self.carry = act.ActCarry(carry.tokens, carry.labels, state.detach(), updates, halted)
        self.batches += 1
        log = TrainLog(self.step, loss_sum, cell_sum / cfg.batch_size, exact_sum / cfg.batch_size,
                       lr_at(cfg, self.step - 1), time.perf_counter() - t0)
        self.history.append(log)
        return log

    def set_lr(self) -> None:
        """The warmup schedule's learning rate for this step, on the model's optimizer and the puzzle table's."""
        cfg = self.cfg
        for g in self.opt.param_groups:
            g["lr"] = lr_at(cfg, self.step)
        if self.puzzle_opt is not None:  # the same warmup, from its own peak
            for g in self.puzzle_opt.param_groups:
                g["lr"] = cfg.puzzle_lr * lr_at(cfg, self.step) / cfg.lr

    def optimizer_step(self, loss: torch.Tensor, logits: torch.Tensor,
                       labels: torch.Tensor) -> tuple[float, float, float]:
        """Backward, the gradient exchange, clipping, the optimizer and EMA steps; returns, over the global batch, (the
        loss, the exactly solved samples, the sum of per-sample cell accuracies)."""
        cfg, model = self.cfg, self.model
        exact, cell = accuracies(logits.detach().argmax(-1).cpu().numpy(), labels.cpu().numpy())
        values = [float(loss.detach()), float(exact.sum()), float(cell.sum())]
        # Summed over the workers while backward runs: the step waits for the sums once, with the gradients.
        totals = self.parallel.total(values, self.device) if self.parallel is not None else lambda: values
        self.opt.zero_grad(set_to_none=True)
        if self.puzzle_opt is not None:
            self.puzzle_opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.exchange is not None:
            self.exchange.finish()
        values = totals()
        if not math.isfinite(values[0]):  # the global loss: every worker sees it, so all of them stop together
            raise TrainingError(f"the training loss became {values[0]:.4g} at step {self.step + 1} (lr "
                                f"{lr_at(cfg, self.step):.3g}): training diverged, so the trial stores no "
                                "results. Lower train.lr, or clip gradients (train.grad_clip)")
        if cfg.grad_clip:  # the model's parameters (sign-SGD does not see a gradient's scale)
            torch.nn.utils.clip_grad_norm_(self.clipped, cfg.grad_clip)
        self.opt.step()
        if self.puzzle_opt is not None:
            self.puzzle_opt.step()
        self.ema.update(model)
        self.step += 1
        return tuple(values)

    def progressive_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The logits Deep Thinking's progressive loss (train.progressive) scores: from a fresh state, n steps without
        gradient, then k with it, n uniform in 0..H-1 and k in 1..H-n (drawn from the data RNG, so a resumed run
        draws the same)."""
        model, H = self.model, self.model.cfg.H
        n = int(self.data_rng.integers(0, H))
        k = int(self.data_rng.integers(1, H - n + 1))
        state = model.init_state(x)
        if n:  # (n = 0: the state keeps its path to the embedding, as DT's does)
            with torch.no_grad():
                for _ in range(n):
                    state = model.step(state, x)
            state = state.detach()
        for _ in range(k):
            state = model.step(state, x)
        return model.logits(state)

    def fit(self, on_log: Callable[[TrainLog], None] | None = None,
            checkpoint: Callable[[Trainer], None] | None = None) -> list[TrainLog]:
        """Train until cfg.steps; `on_log` every log_every steps; `checkpoint` every checkpoint_every batches."""
        cfg = self.cfg
        while self.step < cfg.steps:
            before = self.step
            log = self.train_batch()
            if on_log is not None and (log.step // cfg.log_every > before // cfg.log_every
                                       or log.step >= cfg.steps):
                on_log(log)
            if checkpoint is not None and cfg.checkpoint_every and self.batches % cfg.checkpoint_every == 0:
                checkpoint(self)
        return self.history

    def eval_model(self) -> Reasoner:
        """The EMA weights in evaluation mode."""
        return self.ema.copy_to(self.model).eval()

