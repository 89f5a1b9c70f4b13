"""Fixed-point halting and FPOpt damping (methods.md section 4), or the Q head's halting (TRM / HRM's ACT).

Per sample: relative residual r_i = ||z_i - f(z_i)||_inf / (||f(z_i)||_inf + eps). A sample halts when r_i < tau.
FPOpt: eta starts at eta0; when r has not improved for `patience` steps and is still >= tau, eta <- gamma * eta;
a sample whose eta falls below eta_min stops too. With model.halting.rule q_head the Q head decides instead
(`q_says_halt`, read by the reasoner after each whole update). Effective layers = layers executed before the sample
halted.
All state is tensors of shape (B,), updated functionally, so it works for both reasoners and inside no_grad.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from study.config import HaltingConfig


@dataclass
class HaltState:
    eta: torch.Tensor  # (B,) damping factor
    best: torch.Tensor  # (B,) best residual so far
    since_best: torch.Tensor  # (B,) steps since the residual last improved
    halted: torch.Tensor  # (B,) bool
    eff_layers: torch.Tensor  # (B,) layers executed while not halted
    residual: torch.Tensor  # (B,) last residual


def relative_residual(prev: torch.Tensor, new: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """||prev - new||_inf / (||new||_inf + eps) per sample (batch first)."""
    prev, new = prev.detach().float().flatten(1), new.detach().float().flatten(1)
    return (prev - new).abs().amax(1) / (new.abs().amax(1) + eps)


def start_halting(cfg: HaltingConfig, batch: int, device: torch.device | str) -> HaltState:
    return HaltState(
        eta=torch.full((batch,), cfg.eta0, device=device),
        best=torch.full((batch,), float("inf"), device=device),
        since_best=torch.zeros(batch, dtype=torch.long, device=device),
        halted=torch.zeros(batch, dtype=torch.bool, device=device),
        eff_layers=torch.zeros(batch, dtype=torch.long, device=device),
        residual=torch.full((batch,), float("inf"), device=device),
    )


def q_says_halt(cfg: HaltingConfig, q_halt: torch.Tensor, q_continue: torch.Tensor, updates: int) -> torch.Tensor:
    """Per sample, whether the Q head halts it after its `updates`-th update, as ACT halts it (shared/spec/
    reference_models.md): q_halt > 0 (TRM) or q_halt > q_continue (HRM), and every sample at max_updates."""
    says = q_halt > 0 if cfg.q_compare == "zero" else q_halt > q_continue
    if cfg.max_updates is not None and updates >= cfg.max_updates:
        says = torch.ones_like(says)
    return says


def advance_halting(cfg: HaltingConfig, st: HaltState, residual: torch.Tensor, layers: int,
                    q_halt: torch.Tensor | None = None) -> HaltState:
    """Account for one step of `layers` executed layers whose residual was `residual`; with the q_head rule
    `q_halt` says which samples the Q head halts now (None: the step ends no update)."""
    active = ~st.halted
    improved = residual < st.best
    best = torch.where(active & improved, residual, st.best)
    since = torch.where(active, torch.where(improved, 0, st.since_best + 1), st.since_best)
    decay = active & (since >= cfg.patience) & (residual >= cfg.tau)
    eta = torch.where(decay, st.eta * cfg.gamma, st.eta)
    since = torch.where(decay, 0, since)
    halted = st.halted
    if cfg.enabled and cfg.rule == "residual":
        halted = halted | (active & ((residual < cfg.tau) | (eta < cfg.eta_min)))
    elif cfg.enabled and q_halt is not None:
        halted = halted | (active & q_halt)
    return HaltState(
        eta=eta,
        best=best,
        since_best=since,
        halted=halted,
        eff_layers=st.eff_layers + layers * active.long(),
        residual=torch.where(active, residual, st.residual),
    )
