"""The two loop structures (methods.md section 2), stepped one outer cycle / iteration at a time.

Nested (TRM-style), per outer cycle:      for l in 1..L: z = carry_L(f(z + (y + x)));  y = carry_H(f(y + z))
Flat (FPRM-style), per iteration:         z = carry(a2 * f(z) + b2 * x)   (or carry(f(z + x)) without scaling)
Without recall (model.recall false, Deep Thinking's overthinking architecture) x enters the initial states only
(y0 = y_init + x, z0 = z_init + x) and the steps drop it: z = carry_L(f(z + y)); flat z = carry(a2 * f(z)) or
carry(f(z)).

One *update* (= one deep-supervision step) is H steps; in training only the last `grad_steps` run with gradient
(truncated BPTT). Executed layers are counted exactly: (L + 1) * n_layers per nested outer cycle, n_layers per flat
iteration.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from study.config import ModelConfig
from study.models.block import Block, at_least_float32, rms_norm
from study.models.carry import CarryState, make_carry
from study.models.halting import HaltState, advance_halting, q_says_halt, relative_residual, start_halting
from study.models.init import trunc_lecun_, trunc_normal_
from study.tasks.base import TaskSpec


@dataclass
class LoopState:
    """A rollout's state. `outer.h` is y (nested) or z (flat); `inner.h` is the nested latent z."""

    outer: CarryState
    inner: CarryState | None
    halt: HaltState
    steps: int = 0

    def detach(self) -> LoopState:
        return LoopState(self.outer.detach(), self.inner.detach() if self.inner else None,
                         self.halt, self.steps)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LoopState:
        """Apply `fn` to every per-sample tensor (batch first): slicing, repeating, moving."""

        def carry(c: CarryState | None) -> CarryState | None:
            return None if c is None else CarryState(fn(c.h), {k: fn(v) for k, v in c.aux.items()})

        halt = HaltState(**{f.name: fn(getattr(self.halt, f.name)) for f in dataclasses.fields(HaltState)})
        return LoopState(carry(self.outer), carry(self.inner), halt, self.steps)


class Reasoner(nn.Module):
    """Shared parts: input embedding, the block, the output head, updates and rollouts."""

    def __init__(self, cfg: ModelConfig, vocab: int, seq_len: int, grid: tuple[int, ...], puzzles: int = 0):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden
        self.scale = math.sqrt(d)  # TRM: embeddings at unit scale per element
        self.tok = nn.Embedding(vocab, d)
        # The puzzle embedding (methods.md 8.5), zero at the start as TRM's. ARC's last column holds a puzzle id; it
        # is read as one more token, or with model.puzzle_prefix laid out as TRM's prefix of that many positions
        # before the tokens (a task without puzzle ids then has one row, id 0, as TRM's Sudoku and Maze).
        self.prefix = cfg.puzzle_prefix
        rows = puzzles or (1 if self.prefix else 0)
        self.puzzle = nn.Embedding(rows, d) if rows else None
        if self.puzzle is not None:
            nn.init.zeros_(self.puzzle.weight)
        self.ids_in_tokens = puzzles > 0  # the sequence's last column is the puzzle id
        self.seq_len = seq_len
        # the positions the block sees: the tokens, with the prefix in place of a puzzle-id column
        self.block_positions = seq_len + self.prefix - (1 if self.prefix and self.ids_in_tokens else 0)
        self.pos = nn.Parameter(torch.randn(self.block_positions, d) / self.scale) if cfg.pos == "learned" else None
        nn.init.normal_(self.tok.weight, std=1 / self.scale)  # (here: the draws' order fixes a seed's weights)
        self.block = Block(cfg, grid, self.block_positions)
        self.head = nn.Linear(d, vocab, bias=False)
        # TRM's Q head: (halt, continue) logits from the state's first position (the puzzle prefix's first)
        self.q_head = nn.Linear(d, 2, bias=True) if cfg.q_head else None

    def initialise(self) -> None:
        """Called once the model is built. model.init trunc_lecun: TRM's truncated LeCun normal on every linear
        layer and a truncated normal token embedding (study.models.init); torch: PyTorch's defaults, the token
        embedding normal of std 1/sqrt(hidden). The Q head starts at zero weight and bias -5 (TRM: it says
        "continue" until it has learned otherwise)."""
        if self.cfg.init == "trunc_lecun":
            trunc_lecun_(self)
            trunc_normal_(self.tok.weight, 1 / self.scale)
        if self.q_head is not None:
            nn.init.zeros_(self.q_head.weight)
            nn.init.constant_(self.q_head.bias, -5.0)

    def initial_vector(self, name: str) -> None:
        """An initial state vector: a learned parameter, or with model.init_states fixed a buffer drawn once from
        the truncated normal of std 1 (TRM's H_init / L_init), saved with the weights."""
        if self.cfg.init_states == "fixed":
            self.register_buffer(name, trunc_normal_(torch.empty(self.cfg.hidden), 1.0))
        else:
            setattr(self, name, nn.Parameter(torch.randn(self.cfg.hidden)))

    @property
    def layers_per_step(self) -> int:
        return self.cfg.layers_per_step

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW's parameter groups: weight decay on the weight matrices, none on vectors and scalars (norm-free
        biases, FPRM's residual scalars, the carry rules' q and beta) nor on any parameter of a module that
        declares `no_weight_decay` (ResidualScaling, the carry rules): the model says which, not its names."""
        exempt = {id(p) for m in self.modules() if getattr(m, "no_weight_decay", False) for p in m.parameters()}
        decay, no_decay = [], []
        for p in self.parameters():
            if p.requires_grad:
                (no_decay if p.dim() < 2 or id(p) in exempt else decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.prefix:
            e = self.with_prefix(tokens)
        elif self.puzzle is None:
            e = self.tok(tokens)
        else:
            e = torch.cat([self.tok(tokens[:, :-1]), self.puzzle(tokens[:, -1:])], 1)
        if self.pos is None:
            return self.scale * e
        if e.shape[1] > self.pos.shape[0]:
            raise ValueError(f"{tokens.shape[1]} tokens, but model.pos=learned has positions for {self.seq_len}; "
                             "use model.pos=none or rope to read longer inputs")
        return self.scale * (e + self.pos[: e.shape[1]])

    def with_prefix(self, tokens: torch.Tensor) -> torch.Tensor:
        """TRM's layout: the puzzle's embedding row, zero-padded to prefix * hidden values, as `prefix` positions
        before the tokens' embeddings (with puzzle_emb_ndim = hidden: the first holds it, the rest are zero)."""
        B, d = tokens.shape[0], self.cfg.hidden
        if self.ids_in_tokens:
            ids, tokens = tokens[:, -1], tokens[:, :-1]
        else:
            ids = torch.zeros(B, dtype=torch.long, device=tokens.device)
        row = self.puzzle(ids)
        pre = torch.cat([row, row.new_zeros(B, (self.prefix - 1) * d)], -1).view(B, self.prefix, d)
        return torch.cat([pre, self.tok(tokens)], 1)

    def injected(self, x: torch.Tensor) -> torch.Tensor | None:
        """What a step adds of the input: x with recall, nothing without."""
        return x if self.cfg.recall else None

    def initial(self, init: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """A learned initial state; without recall the input enters here, and only here."""
        h0 = init.expand_as(x)
        return (h0 + x if not self.cfg.recall else h0).contiguous()

    def logits(self, state: LoopState) -> torch.Tensor:
        """The output head on the outer state (normalised again with model.head_norm; TRM reads its post-norm
        state as it is), one row per token: the puzzle prefix is dropped (with ARC's puzzle-id column, a row of zeros
        stands in its place)."""
        h = state.outer.h.to(self.head.weight.dtype)
        out = self.head(rms_norm(h) if self.cfg.head_norm else h)
        if not self.prefix:
            return out
        out = out[:, self.prefix:]
        if self.ids_in_tokens:  # the puzzle-id column's place, which the prefix took (its label is never scored)
            out = torch.cat([out, out.new_zeros(out.shape[0], 1, out.shape[2])], 1)
        return out

    def q_logits(self, state: LoopState) -> tuple[torch.Tensor, torch.Tensor]:
        """TRM's Q head in float32 (float64 for a float64 model) from the outer state's first position: (halt,
        continue) logits per sample."""
        w = self.q_head.weight
        q = self.q_head(state.outer.h[:, 0].to(w.dtype)).to(at_least_float32(w.dtype))
        return q[:, 0], q[:, 1]

    def init_state(self, x: torch.Tensor) -> LoopState:
        raise NotImplementedError

    def _step(self, state: LoopState, x: torch.Tensor) -> tuple[LoopState, torch.Tensor]:
        """One step; returns the new state and the per-sample fixed-point residual."""
        raise NotImplementedError

    def step(self, state: LoopState, x: torch.Tensor) -> LoopState:
        """One outer cycle / iteration with halting: halted samples keep their state frozen."""
        if self.cfg.halting.enabled and not torch.is_grad_enabled() and bool(state.halt.halted.all()):
            # Every sample is frozen: the step would change nothing but the count. Skipping the block makes a
            # halting model's deep readings (up to 24,960 layers) cost only the layers it actually executes.
            # (Not with gradient: the loss must keep its path to the parameters, even if it carries zeros.)
            return LoopState(state.outer, state.inner, state.halt, state.steps + 1)
        new, residual = self._step(state, x)
        halt = advance_halting(self.cfg.halting, state.halt, residual, self.layers_per_step, self.q_halt(new))
        outer, inner = new.outer, new.inner
        if self.cfg.halting.enabled:  # without halting nothing is frozen: skip the per-step device sync
            frozen = state.halt.halted
            outer = outer.select(frozen, state.outer)
            inner = inner.select(frozen, state.inner) if inner is not None else None
        return LoopState(outer, inner, halt, state.steps + 1)

    def q_halt(self, new: LoopState) -> torch.Tensor | None:
        """With the q_head halting rule at test time: after each whole update (H steps), which samples the Q head
        halts (None on other steps, in training, and under the residual rule)."""
        cfg = self.cfg.halting
        steps = new.steps + 1
        if not cfg.enabled or cfg.rule != "q_head" or torch.is_grad_enabled() or steps % self.cfg.H:
            return None
        return q_says_halt(cfg, *self.q_logits(new), steps // self.cfg.H)

    def update(self, x: torch.Tensor, state: LoopState) -> LoopState:
        """One deep-supervision update: H steps, gradient only through the last `grad_steps` (section 2, 5)."""
        H, k = self.cfg.H, self.cfg.grad_steps
        grad_on = torch.is_grad_enabled()
        for i in range(H):
            with torch.set_grad_enabled(grad_on and i >= H - k):
                state = self.step(state, x)
        return state

    @torch.no_grad()
    def rollout(
        self, tokens: torch.Tensor, n_steps: int, on_step: Callable[[LoopState], None] | None = None
    ) -> LoopState:
        """Run `n_steps` steps from a fresh state without gradient, calling on_step after each."""
        x = self.embed(tokens)
        state = self.init_state(x)
        for _ in range(n_steps):
            state = self.step(state, x)
            if on_step is not None:
                on_step(state)
        return state


class NestedReasoner(Reasoner):
    """TRM-style H/L reasoner with a carry rule per axis."""

    def __init__(self, cfg: ModelConfig, vocab: int, seq_len: int, grid: tuple[int, ...], puzzles: int = 0):
        super().__init__(cfg, vocab, seq_len, grid, puzzles)
        d = cfg.hidden
        self.initial_vector("y_init")
        self.initial_vector("z_init")
        # HRM: the outer (H-level) update has a block of its own, of model.h_layers layers (TRM: the one block)
        self.h_block = Block(cfg, grid, self.block_positions, cfg.h_layers) if cfg.h_layers else None
        self.carry_inner = make_carry(cfg.carry.rule_for("inner"), d, cfg.carry)
        self.carry_outer = make_carry(cfg.carry.rule_for("outer"), d, cfg.carry)

    def init_state(self, x: torch.Tensor) -> LoopState:
        y0 = self.initial(self.y_init, x)
        z0 = self.initial(self.z_init, x)
        halt = start_halting(self.cfg.halting, x.shape[0], x.device)
        return LoopState(self.carry_outer.start(y0), self.carry_inner.start(z0), halt)

    def _step(self, state: LoopState, x: torch.Tensor) -> tuple[LoopState, torch.Tensor]:
        eta = state.halt.eta
        y = state.outer.h
        inner = self.carry_inner.start(state.inner.h) if self.cfg.carry.reset_inner else state.inner
        x = self.injected(x)
        L, graded = self.cfg.L, self.cfg.inner_grad_steps or self.cfg.L
        grad_on = torch.is_grad_enabled()
        # TRM's order, z_L + (z_H + x): y + x is fixed over the inner loop, so it is summed once
        yx = y if x is None else y + x
        inp = inner.h + yx
        for i in range(L):
            addend = yx if i < L - 1 else y  # the next block reads the new inner state plus this
            # model.inner_grad_steps: only the last inner steps keep gradient (HRM's one-step gradient: 1)
            with torch.set_grad_enabled(grad_on and i >= L - graded):
                # From the second inner step on, `inner` is this loop's own: the step may overwrite it.
                z = self.block(inp)
                if not grad_on:  # a reading: the rule may write the next input in the pass that writes its state
                    inner, inp = self.carry_inner.step_and_input(inner, z, addend, eta, in_place=i > 0)
                    continue
                inner = self.carry_inner.step(inner, z, eta, in_place=i > 0)
            inp = inner.h + addend  # (outside: the sum keeps its gradient to y and x where the step has none)
        cand = (self.h_block if self.h_block is not None else self.block)(inp)
        residual = relative_residual(y, cand, self.cfg.halting.eps)
        outer = self.carry_outer.step(state.outer, cand, eta)
        return LoopState(outer, inner, state.halt, state.steps), residual


class FlatReasoner(Reasoner):
    """FPRM-style single-state reasoner; with residual scaling the input enters as a2 * f(z) + b2 * x."""

    def __init__(self, cfg: ModelConfig, vocab: int, seq_len: int, grid: tuple[int, ...], puzzles: int = 0):
        super().__init__(cfg, vocab, seq_len, grid, puzzles)
        self.initial_vector("z_init")
        self.carry_outer = make_carry(cfg.carry.rule_for("flat"), cfg.hidden, cfg.carry)

    def init_state(self, x: torch.Tensor) -> LoopState:
        z0 = self.initial(self.z_init, x)
        halt = start_halting(self.cfg.halting, x.shape[0], x.device)
        return LoopState(self.carry_outer.start(z0), None, halt)

    def _step(self, state: LoopState, x: torch.Tensor) -> tuple[LoopState, torch.Tensor]:
        z = state.outer.h
        x = self.injected(x)
        if self.block.scaling is not None:
            _, _, a2, b2 = self.block.scaling.coefficients()
            cand = a2 * self.block(z) if x is None else a2 * self.block(z) + b2 * x
        else:
            cand = self.block(z if x is None else z + x)
        residual = relative_residual(z, cand, self.cfg.halting.eps)
        outer = self.carry_outer.step(state.outer, cand, state.halt.eta)
        return LoopState(outer, None, state.halt, state.steps), residual


def build_reasoner(cfg: ModelConfig, task: TaskSpec) -> Reasoner:
    """The one way to build a model: the reasoner `cfg` describes, shaped for the task (its vocab and length; its
    grid shapes the depthwise conv, (rows, cols) or (length,); puzzles > 0 adds a puzzle embedding read from the
    last column)."""
    cls = FlatReasoner if cfg.kind == "flat" else NestedReasoner
    model = cls(cfg, task.vocab, task.seq_len, task.grid, task.puzzles)
    model.initialise()
    return model

