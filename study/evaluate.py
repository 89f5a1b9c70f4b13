"""Evaluation at test-time depth (methods.md sections 6-7).

One rollout per batch to the deepest target, with a reading each time the rollout passes a target depth (never
re-run from scratch per depth). Along the way, per update (H steps): predictions and, for InfiLoop axes, the step
size gamma_t and content score s_t, from which the diagnostics are computed: stability between two updates,
gamma aligned to the solving update, content score against wrong cells, residual / eta trajectories. The
perturbation test restarts from a snapshot at update u with noise of relative size eps, all eps in one batch.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from study.config import EvalConfig, ModelConfig
from study.models.halting import start_halting
from study.models.reasoner import LoopState, Reasoner, build_reasoner
from study.tasks import Split, accuracies
from study.tasks.loader import Task


@dataclass
class DepthRow:
    depth_layers: int
    outer_cycles: int
    difficulty: int | None  # None: all samples
    n: int
    exact_acc: float
    cell_acc: float
    halted_frac: float
    eff_layers: float


@dataclass
class DynamicsRow:
    """kind: 'update' (per update), 'stability' (u1 -> u2 summary; update = u2, from_update = u1),
    'aligned' (gamma around the solving update; offset), 'score_vs_wrong' (score by wrong cells)."""

    kind: str
    axis: str
    update: int | None = None
    from_update: int | None = None
    offset: int | None = None
    wrong_cells: float | None = None
    gamma_mean: float | None = None
    gamma_p10: float | None = None
    gamma_p90: float | None = None
    score_median: float | None = None
    score_p25: float | None = None
    score_p75: float | None = None
    changed: float | None = None
    wrong_delta: float | None = None
    flipped: float | None = None
    solved: float | None = None
    lost: float | None = None
    residual_mean: float | None = None
    eta_mean: float | None = None
    n: int = 0


@dataclass
class PerturbationRow:
    eps: float
    update: int
    updates_after: int
    n_solved: int
    solved_kept: float | None  # None when no puzzle was solved at the perturbed update
    rel_distance: float


@dataclass
class EvalResult:
    depth: list[DepthRow]
    dynamics: list[DynamicsRow]
    perturbation: list[PerturbationRow]


@dataclass
class Trajectory:
    """Per-update records over the evaluation set: preds (U, N, S), gamma / score (axis -> (U, N)),
    residual and eta (U, N). Update u is index u - 1."""

    preds: np.ndarray
    labels: np.ndarray
    free: np.ndarray  # (N, S) cells to be filled (sudoku blanks; every scored cell elsewhere)
    gamma: dict[str, np.ndarray] = field(default_factory=dict)
    score: dict[str, np.ndarray] = field(default_factory=dict)
    residual: np.ndarray | None = None
    eta: np.ndarray | None = None


def infiloop_axes(model: Reasoner) -> list[str]:
    return [axis for axis in ("outer", "inner") if getattr(getattr(model, f"carry_{axis}", None), "name", "")
            == "infiloop"]


def axis_state(state: LoopState, axis: str):
    return state.outer if axis == "outer" else state.inner


# -- the rollout -------------------------------------------------------------------------------------------------
@dataclass
class RolloutPlan:
    """What one evaluation reads along each batch's rollout: step -> depth reading, the updates whose predictions
    and loop statistics make the trajectory, and the update at which the state is snapshot for perturbation."""

    total_steps: int
    target_steps: dict[int, int]  # step -> depth_layers
    H: int
    last_update: int
    axes: list[str]
    perturb_step: int | None
    perturb_n: int
    readout: str = "last"  # eval.readout: what a depth reading scores
    pad: int | None = None  # the task's padding token: trailing all-padding columns are not rolled out


@dataclass
class BatchReadings:
    """One batch's rollout: per-depth readings (pred, halted, eff_layers), the trajectory parts and a snapshot."""

    readings: dict[int, tuple]
    part: dict[str, np.ndarray]
    snapshot: tuple[LoopState, torch.Tensor, Split] | None


def rollout_batch(model: Reasoner, batch: Split, plan: RolloutPlan, device: str,
                  on_step: Callable[[int], None] | None = None) -> BatchReadings:
    """Roll one batch out to plan.total_steps (Reasoner.rollout) and take every reading the plan asks for.

    Columns that are padding in every sample (a batch of short strings in a test set padded to its longest) are
    cut before the rollout, so a model without positions sees each string as it would alone; predictions come
    back at full width (padding is never scored). With readout max_conf each reading is, per sample, the
    prediction of the most confident step so far; the trajectory (the dynamics) keeps every step's own.
    """
    width = batch.inputs.shape[1]
    if plan.pad is not None:
        cut = max(1, int(input_widths(batch.inputs, plan.pad).max()))
        batch = Split(batch.inputs[:, :cut], batch.labels[:, :cut], batch.difficulty)

    def full(pred: np.ndarray) -> np.ndarray:
        return pred if pred.shape[1] == width else np.pad(pred, ((0, 0), (0, width - pred.shape[1])))

    tokens = torch.as_tensor(batch.inputs, device=device)
    real = (tokens != plan.pad) if plan.pad is not None else torch.ones_like(tokens, dtype=torch.bool)
    best_conf = torch.full((len(batch),), -1.0, device=device)
    best_pred = torch.zeros_like(tokens)
    axes, H = plan.axes, plan.H
    readings: dict[int, tuple] = {}
    part: dict[str, list] = {"preds": [], "residual": [], "eta": [], **{f"gamma_{a}": [] for a in axes},
                             **{f"score_{a}": [] for a in axes}}
    snapshot = []
    step = 0

    def read(state: LoopState) -> None:
        nonlocal step
        step += 1
        if on_step is not None:
            on_step(step)
        target = step in plan.target_steps
        traced = step % H == 0 and step // H <= plan.last_update
        # once per step, for every reading below (none on steps nothing reads)
        logits = model.logits(state) if target or traced or plan.readout == "max_conf" else None
        if plan.readout == "max_conf":
            probs = logits.float().softmax(-1)
            conf = (probs.amax(-1) * real).sum(1) / real.sum(1).clamp_min(1)
            better = conf > best_conf  # strictly: the earliest of equally confident steps
            best_conf.copy_(torch.where(better, conf, best_conf))
            best_pred.copy_(torch.where(better[:, None], probs.argmax(-1), best_pred))
        if target:
            # (a copy: on the CPU .numpy() shares memory, and best_pred changes in place afterwards)
            pred = best_pred.clone() if plan.readout == "max_conf" else logits.argmax(-1)
            readings[plan.target_steps[step]] = (full(pred.cpu().numpy()), state.halt.halted.cpu().numpy(),
                                                 state.halt.eff_layers.float().cpu().numpy())
        if traced:
            part["preds"].append(full(logits.argmax(-1).to(torch.int16).cpu().numpy()))
            part["residual"].append(state.halt.residual.float().cpu().numpy())  # float: bf16 has no numpy
            part["eta"].append(state.halt.eta.float().cpu().numpy())
            for a in axes:
                aux = axis_state(state, a).aux
                part[f"gamma_{a}"].append(aux["gamma"].float().mean((1, 2)).cpu().numpy())
                part[f"score_{a}"].append(aux["score"].float().flatten(1).median(1).values.cpu().numpy())
        if plan.perturb_step is not None and step == plan.perturb_step:
            k = min(plan.perturb_n, len(batch))
            x = model.embed(tokens)  # the rollout's input injection, recomputed (deterministic) for the copies
            snapshot.append((state.map(lambda t, k=k: t[:k].clone()), x[:k], batch.take(slice(0, k))))

    model.rollout(tokens, plan.total_steps, on_step=read)
    return BatchReadings(readings, {k: np.stack(v, 0) for k, v in part.items() if v},
                         snapshot[0] if snapshot else None)


@torch.no_grad()
def evaluate(model: Reasoner, task: Task, cfg: EvalConfig, device: str = "cpu",
             on_progress: Callable[[int, int], None] | None = None, dtype: str = "fp32") -> EvalResult:
    """Readings at every target depth from one rollout per batch, plus the diagnostics.

    on_progress(done, total) is called after every step, counting steps over all batches (a rollout to 24,960
    layers is minutes on a CPU: callers turn this into progress reports). dtype 'bf16' runs the rollouts under
    bfloat16 autocast, as training did.
    """
    mcfg = cfg.model_config(model.cfg)
    if mcfg != model.cfg:  # same weights, other cycle counts / halting
        spec = task.spec
        evm = build_reasoner(mcfg, spec.vocab, spec.seq_len, spec.grid)
        evm.load_state_dict(model.state_dict())
        model = evm
    model = model.to(device).eval()
    if cfg.compile:  # on a shallow copy (same weights): Reasoner.rollout then runs the compiled step, the caller's
        model = copy.copy(model)  # model keeps its own
        model.step = torch.compile(model.step, mode="reduce-overhead" if device.startswith("cuda") else None)
    amp = torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16,
                         enabled=dtype == "bf16")
    depths = cfg.resolved_depths(mcfg)
    target_steps = {mcfg.steps_for_depth(d): d for d in depths}
    H = mcfg.H
    last_update = max(1, max(target_steps) // H)  # at least one update: the dynamics need one
    if cfg.stability:
        last_update = max(last_update, cfg.stability[1])
    plan = RolloutPlan(total_steps=max(max(target_steps), last_update * H), target_steps=target_steps, H=H,
                       last_update=last_update, axes=infiloop_axes(model),
                       perturb_step=cfg.perturb_update * H if cfg.perturb_update else None, perturb_n=cfg.perturb_n,
                       readout=cfg.readout, pad=task.spec.pad)
    data = task.test if cfg.n_test is None else task.test.take(slice(0, cfg.n_test))
    axes = plan.axes

    readings: dict[int, list[tuple]] = {d: [] for d in depths}
    traj_parts: list[dict] = []
    snapshots: list[tuple[LoopState, torch.Tensor, Split]] = []
    batches = batch_slices(data, cfg.batch_size, task.spec.pad)
    n_batches = len(batches)
    later = dataclasses.replace(plan, perturb_step=None)  # the perturbation test uses the first batch only
    for b, rows in enumerate(batches):
        def progress(step: int, b: int = b) -> None:
            on_progress(b * plan.total_steps + step, n_batches * plan.total_steps)

        batch = data.take(rows)
        with amp:
            got = rollout_batch(model, batch, plan if b == 0 else later, device,
                                progress if on_progress is not None else None)
        for depth, reading in got.readings.items():
            readings[depth].append(reading)
        traj_parts.append(got.part)
        if got.snapshot is not None:
            snapshots.append(got.snapshot)

    depth_rows = depth_table(readings, data, target_steps, mcfg)
    traj = Trajectory(
        preds=np.concatenate([p["preds"] for p in traj_parts], 1),
        labels=data.labels,
        free=task_free_cells(task, data),
        gamma={a: np.concatenate([p[f"gamma_{a}"] for p in traj_parts], 1) for a in axes},
        score={a: np.concatenate([p[f"score_{a}"] for p in traj_parts], 1) for a in axes},
        residual=np.concatenate([p["residual"] for p in traj_parts], 1),
        eta=np.concatenate([p["eta"] for p in traj_parts], 1),
    )
    dynamics = dynamics_rows(traj, axes or ["none"], cfg)
    perturbation = []
    if snapshots:
        snap, x, batch = snapshots[0]
        with amp:
            perturbation = perturbation_rows(model, snap, x, batch, cfg)
    return EvalResult(depth_rows, dynamics, perturbation)


def input_widths(inputs: np.ndarray, pad: int) -> np.ndarray:
    """Per sample, the columns up to its last token that is not padding (0 for an all-padding row)."""
    used = inputs != pad
    return np.where(used.any(1), used.shape[1] - np.argmax(used[:, ::-1], axis=1), 0)


def batch_slices(data: Split, batch_size: int, pad: int | None) -> list[slice]:
    """Consecutive batches of at most batch_size samples. For a padded task a batch never spans two input widths
    (a test set ordered by length): with the trailing padding cut, every string is then read at its own length,
    as it would be alone, never beside padding it did not see in training."""
    if pad is None:
        return [slice(s, min(s + batch_size, len(data))) for s in range(0, len(data), batch_size)]
    cuts = [0, *(np.flatnonzero(np.diff(input_widths(data.inputs, pad))) + 1).tolist(), len(data)]
    return [slice(s, min(s + batch_size, hi)) for lo, hi in zip(cuts, cuts[1:]) for s in range(lo, hi, batch_size)]


def task_free_cells(task: Task, data: Split) -> np.ndarray:
    if task.cfg.name == "sudoku":
        return data.inputs == 1  # blank token
    return data.labels >= 0


def depth_table(readings: dict[int, list[tuple]], data: Split, target_steps: dict[int, int],
                mcfg: ModelConfig) -> list[DepthRow]:
    rows = []
    steps_of = {d: s for s, d in target_steps.items()}
    for depth, parts in readings.items():
        pred = np.concatenate([p[0] for p in parts])
        halted = np.concatenate([p[1] for p in parts])
        eff = np.concatenate([p[2] for p in parts])
        exact, cell = accuracies(pred, data.labels)
        cycles = steps_of[depth]  # outer cycles (nested) or iterations (flat)
        groups = [(None, np.ones(len(pred), bool))]
        groups += [(int(d), data.difficulty == d) for d in np.unique(data.difficulty)]
        for diff, m in groups:
            rows.append(DepthRow(depth, cycles, diff, int(m.sum()), float(exact[m].mean()), float(cell[m].mean()),
                                 float(halted[m].mean()), float(eff[m].mean())))
    return rows


# -- diagnostics (pure functions of a trajectory: unit-testable on hand-built data) -----------------------------
def solved_and_wrong(traj: Trajectory) -> tuple[np.ndarray, np.ndarray]:
    """(U, N) solved flags and wrong-cell counts."""
    scored = traj.labels >= 0
    wrong = ((traj.preds != traj.labels[None]) & scored[None]).sum(-1)
    return wrong == 0, wrong


def stability(traj: Trajectory, u1: int, u2: int) -> dict[str, float]:
    """Between updates u1 and u2 (1-based): predictions changed per puzzle (summed over the updates in (u1, u2]),
    change in wrong cells, share of free cells right at u1 that are wrong at least once in (u1, u2], and share of
    puzzles solved at u1 that are unsolved at least once in (u1, u2]."""
    P = traj.preds[u1 - 1: u2]  # updates u1..u2
    solved, wrong = solved_and_wrong(traj)
    changed = (P[1:] != P[:-1]).sum((0, 2)).mean()
    right_u1 = (P[0] == traj.labels) & traj.free
    ever_wrong = ((P[1:] != traj.labels[None]).any(0)) & right_u1
    s1 = solved[u1 - 1]
    lost = (~solved[u1: u2]).any(0) & s1
    return {
        "changed": float(changed),
        "wrong_delta": float((wrong[u2 - 1] - wrong[u1 - 1]).mean()),
        "flipped": float(ever_wrong.sum() / max(right_u1.sum(), 1)),
        "lost": float(lost.sum() / max(s1.sum(), 1)),
        "n": int(len(traj.labels)),
    }


def pct(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if a.size else None


def dynamics_rows(traj: Trajectory, axes: list[str], cfg: EvalConfig) -> list[DynamicsRow]:
    rows: list[DynamicsRow] = []
    solved, wrong = solved_and_wrong(traj)
    U, N = solved.shape
    for axis in axes:
        g, s = traj.gamma.get(axis), traj.score.get(axis)
        for u in range(U):
            prev = traj.preds[u - 1] if u else None
            rows.append(DynamicsRow(
                kind="update", axis=axis, update=u + 1,
                gamma_mean=float(g[u].mean()) if g is not None else None,
                gamma_p10=pct(g[u], 10) if g is not None else None,
                gamma_p90=pct(g[u], 90) if g is not None else None,
                score_median=pct(s[u], 50) if s is not None else None,
                score_p25=pct(s[u], 25) if s is not None else None,
                score_p75=pct(s[u], 75) if s is not None else None,
                changed=float((traj.preds[u] != prev).sum(-1).mean()) if prev is not None else None,
                wrong_cells=float(wrong[u].mean()),
                wrong_delta=float((wrong[u] - wrong[u - 1]).mean()) if u else None,
                solved=float(solved[u].mean()),
                lost=float((solved[u - 1] & ~solved[u]).mean()) if u else None,
                residual_mean=float(np.nanmean(np.where(np.isfinite(traj.residual[u]), traj.residual[u], np.nan)))
                if traj.residual is not None and np.isfinite(traj.residual[u]).any() else None,
                eta_mean=float(traj.eta[u].mean()) if traj.eta is not None else None,
                n=N,
            ))
        if g is not None:
            rows += aligned_rows(g, solved, axis, cfg.align_window)
            rows += score_vs_wrong_rows(s, wrong, axis)
    if cfg.stability and cfg.stability[1] <= U:
        st = stability(traj, *cfg.stability)
        rows.append(DynamicsRow(kind="stability", axis=axes[0], update=cfg.stability[1],
                                from_update=cfg.stability[0], changed=st["changed"],
                                wrong_delta=st["wrong_delta"], flipped=st["flipped"], lost=st["lost"], n=st["n"]))
    return rows


def aligned_rows(gamma: np.ndarray, solved: np.ndarray, axis: str, window: int) -> list[DynamicsRow]:
    """Mean gamma at offsets -window..+window from each puzzle's first solving update (solved from update 2 on)."""
    U, N = solved.shape
    first = np.where(solved.any(0), solved.argmax(0), -1)
    rows = []
    for off in range(-window, window + 1):
        vals = [gamma[f + off, i] for i, f in enumerate(first) if f > 0 and 0 <= f + off < U]
        if vals:
            v = np.asarray(vals)
            rows.append(DynamicsRow(kind="aligned", axis=axis, offset=off, gamma_mean=float(v.mean()),
                                    gamma_p10=pct(v, 10), gamma_p90=pct(v, 90), n=len(vals)))
    return rows


def score_vs_wrong_rows(score: np.ndarray, wrong: np.ndarray, axis: str) -> list[DynamicsRow]:
    rows = []
    s, w = score.reshape(-1), wrong.reshape(-1)
    for k in np.unique(w):
        v = s[w == k]
        rows.append(DynamicsRow(kind="score_vs_wrong", axis=axis, wrong_cells=float(k), score_median=pct(v, 50),
                                score_p25=pct(v, 25), score_p75=pct(v, 75), n=int(v.size)))
    return rows


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
