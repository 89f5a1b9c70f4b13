"""Carry rules: how one loop axis passes its state to the next iteration (methods.md section 3).

The contract, one for the built-ins and for plugins (its torch-free half, the registration and the settings, is
study.config.rules.CarryRuleDef): a rule is a `CarryRule`, an `nn.Module` built as `Rule(d, cfg)` (d: the state's
width; cfg: the `model.carry` section, `cfg.settings_of(name)` its own settings) that owns the axis's parameters,
with two calls:
  state = rule.start(h0)            the axis's state before its first candidate (h0: the initial state, (B, S, d))
  state = rule.step(state, z, eta)  take candidate z_t (a block output, (B, S, d)); `state.h` (B, S, d) is what the
                                    loop carries on; eta (B,) is FPOpt's damping factor (halting) or None
`step(..., in_place=True)` says the caller drops `state` and nothing else reads it (an inner loop's own
intermediate states): a rule may then write the new state into its buffers. A reading (no gradient) calls
`state, inp = rule.step_and_input(state, z, addend, eta)` where the next block reads the new `state.h + addend`;
its default is `step` and the sum, and a rule may compute both in one pass (InfiLoop's fused step).
The per-iteration state lives in a `CarryState` (never in the module): `h` and an `aux` dict of tensors with the
batch first, so rollouts are re-entrant, can be detached between updates and frozen per sample when halting.
`no_weight_decay = True` exempts the rule's parameters from weight decay. Its FLOPs are counted by running it
(study.evaluate.compute), like every other part of the model. `make_carry` builds a rule by name; `probe_rule`
runs one on a tiny input, which is how a broken plugin is refused before any trial.
"""

from __future__ import annotations

import abc
import importlib
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from study.config import CARRY_RULES, RULES, CarryConfig
from study.errors import first_line
from study.models.block import RMS_EPS, rms_norm
from study.models.infiloop_kernel import FLOATS, fused_step


@dataclass
class CarryState:
    """An axis's state: `h` (B, S, d) is carried on; `aux` holds rule-specific tensors with batch first."""

    h: torch.Tensor
    aux: dict[str, torch.Tensor] = field(default_factory=dict)

    def detach(self) -> CarryState:
        return CarryState(self.h.detach(), {k: v.detach() for k, v in self.aux.items()})

    def select(self, keep: torch.Tensor, old: CarryState) -> CarryState:
        """Per sample: `old` where keep[b] is True (a halted sample stays frozen), self elsewhere."""
        if keep is None or not bool(keep.any()):
            return self

        def pick(new: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
            if new.shape != prev.shape:  # full_attnres candidate list grew: frozen samples keep the new length
                return new
            return torch.where(keep.view(-1, *([1] * (new.dim() - 1))), prev, new)

        aux = {k: pick(v, old.aux[k]) if k in old.aux else v for k, v in self.aux.items()}
        return CarryState(pick(self.h, old.h), aux)


def infiloop_update(
    h_prev: torch.Tensor,
    log_d_prev: torch.Tensor,
    z: torch.Tensor,
    q: torch.Tensor | None,
    log_beta: torch.Tensor,
    clip: float = 8.0,
    in_place: bool = False,
    addend: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One step of the InfiLoop recursion in log space (methods.md section 3).

    s_t = min(q . RMSNorm(z_t), clip); log D_t = logaddexp(log beta + log D_{t-1}, s_t);
    gamma_t = exp(s_t - log D_t) = e_t / (beta D_{t-1} + e_t);  h_t = h_{t-1} + gamma_t (z_t - h_{t-1}).
    Carrying (h, log D) instead of raw (N, D) keeps it finite for beta >= 1 over any number of steps.
    q=None drops the content score (s_t = 0: decay-only weights, an ablation point).
    Returns (h_t, log D_t, gamma_t, s_t, next); gamma and s have a trailing dim of 1; next is h_t + addend, the next
    block's input (None without an addend). Without gradient on the CPU this is one fused kernel
    (infiloop_kernel.py), which in_place writes h_t and log D_t over h_prev and log_d_prev and writes next rounded
    to z's dtype, as the block would round it; elsewhere the eager ops of `infiloop_update_eager`, out of place.
    """
    # The accumulators stay at >= float32 under bf16. The fused step widens a bf16 z as it reads it; the eager
    # one gets a float32 copy (checked, not converted, at float32: this runs every layer, and even a no-op
    # conversion is a trip through the dispatcher).
    fused = fused_step(h_prev, log_d_prev, z, q, log_beta, clip, RMS_EPS, in_place, addend)
    if fused is not None:
        return fused if addend is None or fused[4] is not None else (*fused[:4], fused[0] + addend)
    h, log_d, gamma, s = infiloop_update_eager(h_prev, log_d_prev, z if z.dtype in FLOATS else z.float(), q,
                                               log_beta, clip)
    return h, log_d, gamma, s, None if addend is None else h + addend


def infiloop_update_eager(
    h_prev: torch.Tensor,
    log_d_prev: torch.Tensor,
    z: torch.Tensor,
    q: torch.Tensor | None,
    log_beta: torch.Tensor,
    clip: float = 8.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`infiloop_update` in PyTorch ops (differentiable, any device); z at >= float32."""
    if q is None:
        s = torch.zeros_like(z[..., :1])
    else:
        # q . RMSNorm(z) = (q . z) / rms(z): a mat-vec and one fused norm over (B, S, d), the rest on (B, S, 1),
        # instead of materialising the normalised (B, S, d) tensor (fewer kernels: this runs every layer).
        # Out of place: the norm's backward needs its result.
        num = z @ q.to(z.dtype).unsqueeze(-1)
        mean_sq = torch.linalg.vector_norm(z, dim=-1, keepdim=True).square() / z.shape[-1]
        s = (num * torch.rsqrt(mean_sq + RMS_EPS)).clamp(max=clip)
    log_d = torch.logaddexp(log_d_prev + log_beta, s)
    gamma = torch.exp(s - log_d)
    h = torch.lerp(h_prev, z, gamma)  # h_{t-1} + gamma_t (z_t - h_{t-1})
    return h, log_d, gamma, s


def infiloop_scan(
    z: torch.Tensor, q: torch.Tensor | None, beta: float | torch.Tensor, clip: float = 8.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference streaming scan over a stack of candidates z of shape (T, ..., d).

    Returns (h, gamma): every h_t (T, ..., d) and gamma_t (T, ..., 1). Memory beyond the outputs is O(d) per token.
    """
    beta = torch.as_tensor(beta, dtype=torch.float64 if z.dtype == torch.float64 else torch.float32)
    log_beta = torch.log(beta)
    h = torch.zeros_like(z[0])
    log_d = torch.full_like(z[0][..., :1], -math.inf)
    hs, gammas = [], []
    for t in range(z.shape[0]):
        h, log_d, gamma, _, _ = infiloop_update(h, log_d, z[t], q, log_beta, clip)
        h = h.to(z.dtype)
        hs.append(h)
        gammas.append(gamma)
    return torch.stack(hs), torch.stack(gammas)


class CarryRule(nn.Module, metaclass=abc.ABCMeta):
    """A carry rule (see the module docstring for the contract)."""

    no_weight_decay = False  # True: none of the rule's parameters decay (Reasoner.param_groups)
    keeps_float32 = True  # a bf16 reading keeps the rule's few parameters in float32 (study.models.precision)
    name = ""  # the name it is registered under (make_carry sets it)

    def __init__(self, d: int, cfg: CarryConfig):
        super().__init__()

    def start(self, h0: torch.Tensor) -> CarryState:
        return CarryState(h0)

    @abc.abstractmethod
    def step(self, state: CarryState, z: torch.Tensor, eta: torch.Tensor | None = None, *,
             in_place: bool = False) -> CarryState:
        """The axis's state after candidate z (see the module docstring)."""

    def step_and_input(self, state: CarryState, z: torch.Tensor, addend: torch.Tensor,
                       eta: torch.Tensor | None = None, *, in_place: bool = False) -> tuple[CarryState, torch.Tensor]:
        """`step`, and the next block's input, the new `state.h + addend` (see the module docstring)."""
        new = self.step(state, z, eta, in_place=in_place)
        return new, new.h + addend


class CarryLast(CarryRule):
    """TRM: the next state is the newest block output."""

    def step(self, state: CarryState, z: torch.Tensor, eta: torch.Tensor | None = None, *,
             in_place: bool = False) -> CarryState:
        return CarryState(z)


class InfiLoop(CarryRule):
    """Loop-native attention residual: learned pseudo-query q (d) and decay beta = exp(-lambda) (1 scalar)."""

    no_weight_decay = True  # q and beta (Reasoner.param_groups)

    def __init__(self, d: int, cfg: CarryConfig):
        super().__init__(d, cfg)
        self.clip = cfg.clip
        # q starts at zero: weights are then pure decay (gamma -> 1 - beta) until the content score is learned.
        self.q = nn.Parameter(torch.zeros(d)) if cfg.content_score else None
        self.log_beta = nn.Parameter(torch.tensor(math.log(cfg.beta_init)), requires_grad=cfg.learn_beta)

    @property
    def beta(self) -> float:
        return float(self.log_beta.detach().exp())

    def start(self, h0: torch.Tensor) -> CarryState:
        h0 = h0 if h0.dtype in FLOATS else h0.float()  # float32 sums under bf16, float64 in a float64 model
        log_d = torch.full_like(h0[..., :1], -math.inf)
        zeros = torch.zeros_like(log_d)
        return CarryState(h0, {"log_d": log_d, "gamma": zeros, "score": zeros})

    def step(self, state: CarryState, z: torch.Tensor, eta: torch.Tensor | None = None, *,
             in_place: bool = False) -> CarryState:
        return self._update(state, z, in_place, None)[0]

    def step_and_input(self, state: CarryState, z: torch.Tensor, addend: torch.Tensor,
                       eta: torch.Tensor | None = None, *, in_place: bool = False) -> tuple[CarryState, torch.Tensor]:
        return self._update(state, z, in_place, addend)  # the fused step writes the input with the state

    def _update(self, state: CarryState, z: torch.Tensor, in_place: bool, addend: torch.Tensor | None
                ) -> tuple[CarryState, torch.Tensor | None]:
        h, log_d, gamma, s, nxt = infiloop_update(state.h, state.aux["log_d"], z, self.q, self.log_beta, self.clip,
                                                  in_place, addend)
        return CarryState(h, {"log_d": log_d, "gamma": gamma, "score": s}), nxt


class FullAttnRes(CarryRule):
    """Full Attention Residuals (cost baseline): step t's query attends over all t candidates of the axis.

    Query q_t = q * RMSNorm(z_t) (d params); scores against RMSNorm(z_i), capped at `clip`. O(t d) memory per
    token at step t and O(T^2 d) work over a rollout: the cost InfiLoop's recursion avoids.
    """

    no_weight_decay = True  # q (Reasoner.param_groups)

    def __init__(self, d: int, cfg: CarryConfig):
        super().__init__(d, cfg)
        self.clip = cfg.clip
        self.q = nn.Parameter(torch.ones(d))

    def start(self, h0: torch.Tensor) -> CarryState:
        h0 = h0 if h0.dtype in FLOATS else h0.float()  # (its candidates are kept at >= float32, as InfiLoop's sums)
        return CarryState(h0, {"cands": h0.new_zeros(*h0.shape[:-1], 0, h0.shape[-1])})

    def step(self, state: CarryState, z: torch.Tensor, eta: torch.Tensor | None = None, *,
             in_place: bool = False) -> CarryState:
        z = z if z.dtype in FLOATS else z.float()
        cands = torch.cat([state.aux["cands"], z.unsqueeze(-2)], dim=-2)  # (B, S, t, d)
        query = self.q * rms_norm(z) / math.sqrt(z.shape[-1])
        scores = torch.einsum("...td,...d->...t", rms_norm(cands), query).clamp(max=self.clip)
        h = torch.einsum("...t,...td->...d", scores.softmax(-1), cands)
        return CarryState(h, {"cands": cands})


class Damped(CarryRule):
    """Fixed-point damping h_t = eta z_t + (1 - eta) h_{t-1}; eta (B,) comes from FPOpt (halting.py)."""

    def step(self, state: CarryState, z: torch.Tensor, eta: torch.Tensor | None = None, *,
             in_place: bool = False) -> CarryState:
        if eta is None:
            return CarryState(z)
        e = eta.to(z.dtype).view(-1, *([1] * (z.dim() - 1)))
        return CarryState(e * z + (1 - e) * state.h)


class RuleError(ValueError):
    """A carry rule that cannot run: its one line names the rule and its entry point."""


def rule_class(rule: str) -> type[CarryRule]:
    """The CarryRule subclass a registered rule's definition names (imported now)."""
    if rule not in CARRY_RULES:
        from study.config.rules import FOUND

        raise RuleError(FOUND.broken.get(rule) or f"model.carry.rule={rule!r} is not allowed; use one of {RULES}")
    defn, where = CARRY_RULES[rule], rule_origin(rule)
    module, _, attr = defn.module.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except Exception as e:  # noqa: BLE001 - someone else's module: its error, in one line
        raise RuleError(f"{where}: its module {defn.module} does not import: {type(e).__name__}: {first_line(e)}") \
            from None
    if not (isinstance(cls, type) and issubclass(cls, CarryRule)):
        raise RuleError(f"{where}: {defn.module} is not a study.models.carry.CarryRule subclass")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise RuleError(f"{where}: {defn.module} lacks {', '.join(missing)}")
    return cls


def rule_origin(rule: str) -> str:
    from study.config.rules import FOUND

    return FOUND.origin[rule].where if rule in FOUND.origin else f"carry rule {rule!r}"


def make_carry(rule: str, d: int, cfg: CarryConfig) -> CarryRule:
    """Build the module for one axis."""
    module = rule_class(rule)(d, cfg)
    module.name = rule
    return module


def probe_rule(rule: str, cfg: CarryConfig, d: int = 8) -> None:
    """Run the rule on a tiny input (3 steps, with and without eta): RuleError naming it and its entry point when it
    fails to build, raises, or returns a state of another shape or with a non-finite value."""
    where = rule_origin(rule)
    gen = torch.Generator().manual_seed(0)
    h0 = torch.randn(2, 3, d, generator=gen)
    try:
        module = make_carry(rule, d, cfg)
        state = module.start(h0)
        for i in range(3):
            z = torch.randn(2, 3, d, generator=gen)
            state = module.step(state, z, torch.full((2,), 0.5) if i == 2 else None)
            if not isinstance(state, CarryState):
                raise RuleError(f"{where}: step returned a {type(state).__name__}, not a CarryState")
            if tuple(state.h.shape) != (2, 3, d):
                raise RuleError(f"{where}: step returned a state of shape {tuple(state.h.shape)} for candidates of "
                                f"shape {(2, 3, d)}")
            if not bool(torch.isfinite(state.h).all()):
                raise RuleError(f"{where}: step returned a non-finite state (NaN or inf) on a tiny random input")
    except RuleError:
        raise
    except Exception as e:  # noqa: BLE001 - someone else's code: its error, in one line
        raise RuleError(f"{where} fails on a tiny input: {type(e).__name__}: {first_line(e)}") from None
