"""One trial trained by several data-parallel workers (resources.workers; the process group is Ray Train's, set up
by study.run.workers: gloo on CPU, NCCL on GPUs).

Every worker draws the same global batch from the same data RNG, so data order, augmentation and the progressive
loss's draws follow the global step whatever the worker count, and trains on its own rows of it (rank r of N: rows
r*B/N .. (r+1)*B/N). Its loss is its rows' summed cell loss over the global batch's scored cells, so the workers'
gradients add up to the one-worker gradient of the mean. Then one exchange per update:

- the model's dense gradients: all-reduces (sum) of flattened buckets, each launched while backward still runs;
- ARC's puzzle embedding under sign-SGD (study.trial.optimizers): rows only. Each worker's sparse gradient names
  the few hundred rows its batch used; the workers all-gather those ids and row gradients and sum repeated rows, so
  the 730,155-row table is never reduced densely.

Every worker then holds the same gradient and takes the same optimizer, EMA and clipping steps: the replicas stay
equal without a broadcast. Rank 0 checkpoints and stores (study.trial.execute). Evaluation is split by batches
(study.evaluate): each worker rolls out every world-th batch of the test set and rank 0 gathers and merges them in
the order one worker would have taken them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DataParallel:
    """This worker's place among the trial's data-parallel workers."""

    rank: int
    world: int

    def rows(self, batch_size: int) -> slice:
        """This worker's rows of a global batch (train.batch_size is a multiple of the worker count:
        study.run.preflight)."""
        per = batch_size // self.world
        return slice(self.rank * per, (self.rank + 1) * per)

    def total(self, values: list[float], device: torch.device) -> Callable[[], list[float]]:
        """Each value summed over the workers (a loss, counts for the training log), started asynchronously: the
        returned call waits for the sums."""
        t = torch.tensor(values, dtype=torch.float64, device=device)
        work = dist.all_reduce(t, async_op=True)

        def sums() -> list[float]:
            work.wait()
            return t.tolist()

        return sums

    def gather(self, obj: Any) -> list[Any] | None:
        """Every worker's `obj` (picklable) in rank order on rank 0; None on the others."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def exchange(self, params: list[torch.nn.Parameter]) -> GradientExchange:
        """What sums `params`' gradients over the workers in every backward (see GradientExchange)."""
        return GradientExchange(self, params)

    def gather_rows(self, grad: torch.Tensor) -> torch.Tensor:
        """A sparse row gradient summed over the workers: all-gather of ids and rows (padded to the longest,
        trimmed back), repeated rows added by coalesce."""
        grad = grad.coalesce()
        ids, rows = grad.indices()[0], grad.values()
        count = torch.tensor([ids.numel()], device=ids.device)
        counts = [torch.zeros_like(count) for _ in range(self.world)]
        dist.all_gather(counts, count)
        counts = [int(c) for c in counts]
        longest = max(counts)
        padded_ids = torch.zeros(longest, dtype=ids.dtype, device=ids.device)
        padded_rows = torch.zeros((longest, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        padded_ids[:len(ids)], padded_rows[:len(rows)] = ids, rows
        all_ids = [torch.empty_like(padded_ids) for _ in range(self.world)]
        all_rows = [torch.empty_like(padded_rows) for _ in range(self.world)]
        dist.all_gather(all_ids, padded_ids)
        dist.all_gather(all_rows, padded_rows)
        ids = torch.cat([t[:n] for t, n in zip(all_ids, counts, strict=True)])
        rows = torch.cat([t[:n] for t, n in zip(all_rows, counts, strict=True)])
        return torch.sparse_coo_tensor(ids[None], rows, grad.shape).coalesce()


class GradientExchange:
    """Sums a model's gradients over the workers in every backward, in place. The dense ones are all-reduced in
    buckets of about BUCKET_NUMEL elements, each launched (asynchronously) as soon as backward has produced its
    gradients, so the exchange overlaps the rest of backward; `finish()` after backward waits for them and then
    exchanges the sparse one (the puzzle table's) by its rows. Backward produces the gradients in the same order on
    every worker, so every worker forms the same buckets."""

    BUCKET_NUMEL = 1 << 20  # 4 MB of fp32 per all-reduce

    def __init__(self, parallel: DataParallel, params: list[torch.nn.Parameter]):
        self.parallel, self.params = parallel, params
        self.pending: list[torch.Tensor] = []
        self.pending_numel = 0
        self.inflight: list[tuple] = []
        for p in params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.ready)

    def ready(self, p: torch.nn.Parameter) -> None:
        if p.grad is None or p.grad.is_sparse:
            return
        self.pending.append(p.grad)
        self.pending_numel += p.grad.numel()
        if self.pending_numel >= self.BUCKET_NUMEL:
            self.launch()

    def launch(self) -> None:
        if self.pending:
            flat = torch.cat([g.reshape(-1) for g in self.pending])
            self.inflight.append((dist.all_reduce(flat, async_op=True), flat, self.pending))
            self.pending, self.pending_numel = [], 0

    def finish(self) -> None:
        """After backward: every gradient summed over the workers."""
        self.launch()
        for work, flat, grads in self.inflight:
            work.wait()
            for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(part.view_as(g))
        self.inflight = []
        for p in self.params:
            if p.grad is not None and p.grad.is_sparse:
                p.grad = self.parallel.gather_rows(p.grad)
