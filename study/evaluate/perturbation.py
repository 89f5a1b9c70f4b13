"""The perturbation test (methods.md section 7): from a snapshot of the state at update u, copies perturbed with
noise of relative size eps (all eps in one batch) continue beside an unperturbed reference."""

from __future__ import annotations

import torch

from study.config import EvalConfig
from study.models.halting import start_halting
from study.models.reasoner import LoopState, Reasoner
from study.rows import PerturbationRow
from study.tasks import Split, accuracies


@torch.no_grad()
def perturbation_rows(model: Reasoner, snap: LoopState, x: torch.Tensor, batch: Split,
                      cfg: EvalConfig) -> list[PerturbationRow]:
    """From the snapshot at update u: one copy per eps (eps = 0 is the unperturbed reference), all in one batch;
    per update after: solved puzzles kept (of those solved at u) and ||y - y_ref|| / ||y_ref||."""
    B = x.shape[0]
    eps_all = [0.0, *cfg.perturb_eps]  # index 0: the reference continuation
    reps = len(eps_all)
    state = snap.map(lambda t: t.repeat(reps, *([1] * (t.dim() - 1))))
    xs = x.repeat(reps, 1, 1)
    gen = torch.Generator(device="cpu").manual_seed(0)
    scale = torch.tensor(eps_all, device=x.device).repeat_interleave(B).view(-1, 1, 1)

    def perturb(h: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(h.shape, generator=gen).to(h)
        norm = h.flatten(1).norm(dim=1).view(-1, 1, 1)
        return h + scale * norm * noise / noise.flatten(1).norm(dim=1).view(-1, 1, 1)

    state.outer.h = perturb(state.outer.h)
    if state.inner is not None:
        state.inner.h = perturb(state.inner.h)
    if model.cfg.halting.enabled:
        # A halted sample never steps again: the perturbed copies would stay where the noise put them. Restart
        # halting (reference included) so each copy iterates until it is at a fixed point again.
        state.halt = start_halting(model.cfg.halting, B * reps, x.device)
    labels = batch.labels
    pred0 = model.logits(snap).argmax(-1).cpu().numpy()
    solved_u = accuracies(pred0, labels)[0]
    rows = []
    for k in range(1, cfg.perturb_updates + 1):
        for _ in range(model.cfg.H):
            state = model.step(state, xs)
        y = state.outer.h.view(reps, B, *state.outer.h.shape[1:])
        pred = model.logits(state).argmax(-1).cpu().numpy().reshape(reps, B, -1)
        ref = y[0]
        for e in range(1, reps):
            solved_now = accuracies(pred[e], labels)[0]
            dist = ((y[e] - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1).clamp_min(1e-12)).mean()
            rows.append(PerturbationRow(
                eps=eps_all[e], update=cfg.perturb_update, updates_after=k, n_solved=int(solved_u.sum()),
                solved_kept=float((solved_now & solved_u).sum() / solved_u.sum()) if solved_u.any() else None,
                rel_distance=float(dist)))
    return rows
