"""The training losses: the cell loss of deep supervision (methods.md section 5) and TRM's ACT loss head
(reference_models.md, "Training (ACT)"), over softmax or TRM's stablemax."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from study.tasks import IGNORE

Q_WEIGHT = 0.5  # TRM's weight on the Q head's BCE terms (its ACTLossHead)


def stablemax_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """TRM's stablemax: s(x) = x + 1 for x >= 0, 1 / (1 - x) otherwise; log(s / sum s).

    The unused branch is computed at a clamped x: at x = 1 exactly, 1 / (1 - x) is inf and its gradient, times the
    where's zero, NaN. bf16 logits land on 1.0 often (a bf16 training diverged at its second step)."""
    s = torch.where(logits >= 0, logits + 1, 1 / (1 - logits.clamp(max=0)))
    return torch.log(s / s.sum(-1, keepdim=True))


def token_losses(logits: torch.Tensor, labels: torch.Tensor, kind: str, reduction: str = "none") -> torch.Tensor:
    """Per-token losses (B, S), zero where the label is IGNORE, or their torch `reduction` over the scored cells;
    stablemax in float64, as TRM computes it."""
    flat, target = logits.float().flatten(0, 1), labels.flatten()
    if kind == "stablemax":
        loss = F.nll_loss(stablemax_log_probs(flat.double()).float(), target, ignore_index=IGNORE, reduction=reduction)
    else:
        loss = F.cross_entropy(flat, target, ignore_index=IGNORE, reduction=reduction)
    return loss.view(labels.shape) if reduction == "none" else loss


def cell_loss(logits: torch.Tensor, labels: torch.Tensor, kind: str, scored: int | None = None) -> torch.Tensor:
    """The mean loss over the scored cells; with `scored` (a data-parallel worker's rows: study.trial.data_parallel),
    the rows' summed loss over that many cells of the global batch."""
    if scored is None:
        return token_losses(logits, labels, kind, "mean")
    return token_losses(logits, labels, kind, "sum") / max(scored, 1)


def act_loss(logits: torch.Tensor, labels: torch.Tensor, q_halt: torch.Tensor, q_continue: torch.Tensor,
             target_continue: torch.Tensor | None, kind: str, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TRM's ACT loss over these rows, divided by the global `batch_size` (its pretrain.py scales by 1 / global
    batch): per sample the token losses summed over its count of scored cells, summed over samples, plus
    Q_WEIGHT x (BCE(q_halt, the sample is exactly right) + BCE(q_continue, target_continue) when given), summed.
    Returns (the loss, which rows are exactly right)."""
    scored = labels != IGNORE
    count = scored.sum(-1)
    lm = (token_losses(logits, labels, kind).sum(-1) / count.clamp_min(1)).sum()
    solved = ((logits.detach().argmax(-1) == labels) & scored).sum(-1) == count
    q = F.binary_cross_entropy_with_logits(q_halt, solved.to(q_halt.dtype), reduction="sum")
    if target_continue is not None:
        q = q + F.binary_cross_entropy_with_logits(q_continue, target_continue, reduction="sum")
    return (lm + Q_WEIGHT * q) / batch_size, solved
