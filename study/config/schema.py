"""The trial configuration schema: one pydantic dataclass per section (model, train, eval; the task section is put
together from the tasks' own settings, study.tasks.settings), each forbidding unknown keys, with every allowed
range declared beside its field (study.bounds) and the few rules that tie fields together in __post_init__.
Torch-free, so analysis and spec checks never import torch.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from typing import Annotated, Literal

from pydantic.dataclasses import dataclass as pdataclass

from study.bounds import MAX_DEPTH_LAYERS, Bound, check_bounds
from study.config.rules import CarryConfig
from study.tasks import TASKS, TaskConfig

Unit = Annotated[float, Bound(ge=0, lt=1)]  # FPRM's a1, a2 initialisations


def layers_per_step(kind: str, L: int, n_layers: int, h_layers: int | None = None) -> int:
    """Executed layers per step: a nested outer cycle runs the block L + 1 times (L inner, 1 outer; HRM's outer
    update runs its own block of h_layers), a flat iteration once (methods.md section 2). The one statement of the
    count; tables read stored trials with it."""
    return L * n_layers + (h_layers or n_layers) if kind == "nested" else n_layers

# Halting's threshold and FPOpt's decay, in training and as test-time overrides (EvalConfig): one statement each.
Tau = Annotated[float, Bound(gt=0)]
Gamma = Annotated[float, Bound(gt=0, le=1)]


@pdataclass(config={"extra": "forbid"})
class HaltingConfig:
    """enabled: halted samples freeze (state and effective layers). FPOpt's eta runs either way (damped rule).
    rule: what halts a sample: its fixed-point residual (FPRM: below tau, or FPOpt's eta below eta_min), or the
    model's Q head read after each whole update as TRM's and HRM's ACT reads it (at test time; in training
    train.act halts)."""

    enabled: bool = False
    # what halts a sample: its fixed-point residual (residual, FPRM) or the Q head (q_head, TRM / HRM ACT)
    rule: Literal["residual", "q_head"] = "residual"
    # q_head: halt when q_halt > 0 (zero: TRM, no_ACT_continue) or when q_halt > q_continue (continue: HRM)
    q_compare: Literal["zero", "continue"] = "zero"
    # q_head: the most updates a sample runs (TRM's halt_max_steps; null: as many as the reading's depth)
    max_updates: Annotated[int, Bound(ge=1)] | None = None
    # a sample halts once its relative fixed-point residual is below tau
    tau: Tau = 0.1
    # FPOpt: eta <- gamma * eta when the residual has not improved for `patience` steps
    gamma: Gamma = 0.9
    # steps without improvement before FPOpt damps eta
    patience: Annotated[int, Bound(ge=1)] = 5
    # FPOpt's initial damping factor eta (1: no damping)
    eta0: Annotated[float, Bound(gt=0, le=1)] = 1.0
    # a sample whose eta falls below this stops too
    eta_min: Annotated[float, Bound(ge=0)] = 1e-3
    # added to the residual's denominator, ||f(z)||_inf + eps
    eps: Annotated[float, Bound(gt=0)] = 1e-6

    def __post_init__(self):
        check_bounds("model.halting", self)


@pdataclass(config={"extra": "forbid"})
class ModelConfig:
    """Everything that defines a reasoner except the task's vocab, length and grid (known at build time).

    H: steps per update (outer cycles for nested, iterations for flat). L: inner cycles (nested only).
    grad_steps: steps per update that get gradient (TRM: 1; FPRM's truncated BPTT: k = 6; = H with train.n_sup 1:
    the loss at the last iteration with gradient through all of them, as Deep Thinking trains).
    recall: the input is re-injected at every step (TRM, FPRM, DT "recall"); False: it enters the initial state
    only (DT without recall, the architecture that overthinks). pos: learned absolute positions, or none (the
    conv's locality alone orders tokens; the model then reads other lengths / board sides at test time).
    """

    # nested (TRM-style H/L loops over two states) or flat (FPRM-style, one state)
    kind: Literal["nested", "flat"] = "nested"
    # width d of the states and the block
    hidden: Annotated[int, Bound(ge=1, most=16_384)] = 64
    # attention heads (hidden must be divisible by heads)
    heads: Annotated[int, Bound(ge=1, most=1_024)] = 4
    # transformer layers in the block one step applies
    n_layers: Annotated[int, Bound(ge=1, most=1_024)] = 2
    # SwiGLU hidden size as a multiple of `hidden`
    expansion: Annotated[float, Bound(gt=0)] = 4.0
    # post-norm (TRM) or pre-norm (FPRM)
    norm: Literal["pre", "post"] = "post"
    # a depthwise grid convolution in the block (locality on boards and strings)
    conv: bool = True
    # FPRM's tied residual scaling (a1, a2 and their coupling); needs norm pre
    residual_scaling: bool = False
    # FPRM's a1 at the start (in [0, 1))
    a1_init: Unit = 0.75
    # FPRM's a2 at the start (in [0, 1))
    a2_init: Unit = 0.25
    # steps per update: outer cycles (nested) or iterations (flat)
    H: Annotated[int, Bound(ge=1)] = 3
    # inner cycles per outer cycle (nested only)
    L: Annotated[int, Bound(ge=1)] = 6
    grad_steps: Annotated[int, Bound(ge=1)] = 1
    # inner cycles of each graded outer cycle that get gradient (nested only; null: all L, as TRM; 1: HRM's
    # one-step gradient, through the last inner update and the outer update only)
    inner_grad_steps: Annotated[int, Bound(ge=1)] | None = None
    recall: bool = True
    # learned absolute positions, none (the conv's locality alone orders tokens), or rotary (TRM's and HRM's RoPE,
    # theta 10000, on queries and keys)
    pos: Literal["learned", "none", "rope"] = "learned"
    # token mixing: attention (with the conv when model.conv), or TRM-MLP's SwiGLU over the token axis
    mixer: Literal["attention", "mlp"] = "attention"
    # HRM: the outer update's own block of this many layers (null: one block for both updates, as TRM)
    h_layers: Annotated[int, Bound(ge=1, most=1_024)] | None = None
    # the SwiGLU width's rounding multiple (TRM: 256 at every size; null: 256, or 16 below hidden 256)
    swiglu_multiple: Annotated[int, Bound(ge=1, most=4_096)] | None = None
    # weight init: PyTorch's defaults, or TRM's truncated LeCun normal (linear layers) and truncated normal embedding
    init: Literal["torch", "trunc_lecun"] = "torch"
    # the initial states: learned vectors, or TRM's fixed vectors (truncated normal, std 1, never trained)
    init_states: Literal["learned", "fixed"] = "learned"
    # normalise the outer state again before the output head (TRM reads its post-norm state as it is: false)
    head_norm: bool = True
    # TRM's puzzle-embedding prefix: this many positions before the tokens hold the puzzle's embedding, zero-padded
    # (0: loopstudy's layout, ARC's puzzle id read as one more token at the end)
    puzzle_prefix: Annotated[int, Bound(ge=0, most=1_024)] = 0
    # TRM's Q head: (halt, continue) logits from the outer state's first position
    q_head: bool = False
    # the weights to start from: trm:PATH (a TinyRecursiveModels / HRM checkpoint; the model keys left out come
    # from it) or STUDY/TRIAL_ID (another study's stored weights in the same store; the model keys its weights mean
    # come from that trial the same way); null: a fresh init
    init_from: str | None = None
    carry: CarryConfig = field(default_factory=CarryConfig)
    halting: HaltingConfig = field(default_factory=HaltingConfig)

    def __post_init__(self):
        check_bounds("model", self)
        if self.layers_per_update > MAX_DEPTH_LAYERS:
            raise ValueError(f"model.H={self.H}, model.L={self.L}, model.n_layers={self.n_layers} make "
                             f"{self.layers_per_update} layers per update; at most {MAX_DEPTH_LAYERS} are allowed")
        if self.grad_steps > self.H:
            raise ValueError(f"model.grad_steps={self.grad_steps} is not allowed; it must be <= model.H={self.H}")
        if self.inner_grad_steps is not None and self.inner_grad_steps > self.L:
            raise ValueError(f"model.inner_grad_steps={self.inner_grad_steps} is not allowed; it must be <= "
                             f"model.L={self.L}")
        if self.hidden % self.heads:
            raise ValueError(f"model.hidden={self.hidden} must be divisible by model.heads={self.heads}")
        if self.residual_scaling and self.norm != "pre":
            raise ValueError("model.residual_scaling=True needs model.norm='pre' (FPRM's pre-norm scaling)")
        if self.pos == "none" and not self.conv and self.mixer == "attention":
            raise ValueError("model.pos=none needs model.conv=true: without positions the conv's locality is the "
                             "only order the model sees")
        if self.puzzle_prefix and self.conv:
            raise ValueError("model.puzzle_prefix needs model.conv=false: the conv reads the token grid, which the "
                             "prefix would shift (TRM has no conv)")
        if self.mixer == "mlp" and self.pos == "learned":
            raise ValueError("model.mixer=mlp mixes fixed positions itself: use model.pos none (TRM-MLP) or rope")
        if self.init_from is not None and not (self.init_from.startswith("trm:") and len(self.init_from) > 4
                                               or re.fullmatch(r"[^/\s]+/[0-9a-f]{12}", self.init_from)):
            raise ValueError(f"model.init_from={self.init_from!r} is not allowed; give trm:PATH (a TRM or HRM "
                             "checkpoint) or STUDY/TRIAL_ID (a trial's stored weights)")
        if self.halting.rule == "q_head" and not self.q_head:
            raise ValueError("model.halting.rule=q_head needs model.q_head=true (the Q head it reads)")
        if self.h_layers is not None and (self.kind != "nested" or self.residual_scaling):
            raise ValueError("model.h_layers (HRM's outer block) needs model.kind=nested without "
                             "model.residual_scaling")

    @property
    def rules(self) -> set[str]:
        """The carry rules the model's loop axes run (inner and outer, or the flat loop's)."""
        axes = ("flat",) if self.kind == "flat" else ("inner", "outer")
        return {self.carry.rule_for(a) for a in axes}

    @property
    def layers_per_step(self) -> int:
        """Executed layers per outer cycle (nested) or per iteration (flat)."""
        return layers_per_step(self.kind, self.L, self.n_layers, self.h_layers)

    @property
    def layers_per_update(self) -> int:
        return self.H * self.layers_per_step

    def steps_for_depth(self, depth_layers: int, what: str = "depth") -> int:
        """Whole steps that execute exactly `depth_layers` layers; ValueError naming the nearest valid depths."""
        per = self.layers_per_step
        if depth_layers < per or depth_layers % per:
            lo = (depth_layers // per) * per
            nearest = [v for v in (lo, lo + per) if v >= per]
            raise ValueError(
                f"{what}={depth_layers} layers is not a whole number of "
                f"{'outer cycles' if self.kind == 'nested' else 'iterations'} of {per} layers "
                f"(L={self.L}, n_layers={self.n_layers}); nearest valid depths: {nearest}"
            )
        return depth_layers // per


@pdataclass(config={"extra": "forbid"})
class TrainConfig:
    """steps: optimizer steps (each batch gives n_sup of them).
    progressive: Deep Thinking's progressive loss weight alpha (Bansal et al. 2022): the loss is (1 - alpha) x the
    loss after the update's H steps + alpha x the loss after k steps with gradient that start from n steps run
    without it (n uniform in 0..H-1, k in 1..H-n), which teaches the step to improve any partial state instead of
    counting iterations. 0: off. Needs n_sup 1."""

    steps: Annotated[int, Bound(ge=0, most=10_000_000)] = 600  # 0: read model.init_from's weights only
    # training samples per batch
    batch_size: Annotated[int, Bound(ge=1, most=1_000_000)] = 64
    # the model's optimizer: AdamW, or TRM's Adam-atan2 (no epsilon; study/trial/adam_atan2.py)
    optimizer: Literal["adamw", "adam_atan2"] = "adamw"
    # the optimizer's peak learning rate (after the linear warmup)
    lr: Annotated[float, Bound(gt=0)] = 1e-3
    # the optimizer's decoupled weight decay
    weight_decay: Annotated[float, Bound(ge=0)] = 0.1
    # which parameters decay: the weight matrices (vectors, scalars and the carry rules' own exempt), or all (TRM)
    weight_decay_on: Literal["matrices", "all"] = "matrices"
    # the optimizer's (beta1, beta2)
    betas: Annotated[tuple[float, float], Bound(ge=0, lt=1)] = (0.9, 0.95)
    # optimizer steps of linear learning-rate warmup
    warmup: Annotated[int, Bound(ge=0)] = 50
    # deep-supervision updates per batch, an optimizer step after each (with train.act: the most a sample gets,
    # TRM's halt_max_steps)
    n_sup: Annotated[int, Bound(ge=1, most=1_024)] = 4
    # TRM's ACT (study/trial/act.py): each sample keeps its state across optimizer steps until the Q head halts it
    # (no_continue: q_halt > 0, TRM; continue: q_halt > q_continue with its Q-learning target, HRM), then a fresh
    # sample takes its place; the loss adds 0.5 x the Q head's BCE. off: every batch gets n_sup updates. Needs
    # model.q_head
    act: Literal["off", "no_continue", "continue"] = "off"
    # ACT's exploration: the probability that a sample draws a minimum number of updates (2 .. n_sup) before it may
    # halt
    halt_exploration: Annotated[float, Bound(ge=0, le=1)] = 0.1
    # gradient norm clip on the model's parameters (0: none)
    grad_clip: Annotated[float, Bound(ge=0)] = 1.0
    # decay of the weights' exponential moving average, which the evaluation reads
    ema: Annotated[float, Bound(ge=0, lt=1)] = 0.999
    # cross-entropy over softmax, or TRM's stablemax
    loss: Literal["softmax", "stablemax"] = "softmax"
    # cpu or cuda[:N] (cuda needs resources.gpu)
    device: str = "cpu"
    # fp32, or bf16 autocast
    dtype: Literal["fp32", "bf16"] = "fp32"
    threads: Annotated[int, Bound(ge=0)] = 0  # torch CPU threads; 0 leaves torch's default
    # optimizer steps between training logs (and Tune reports)
    log_every: Annotated[int, Bound(ge=1)] = 50
    checkpoint_every: Annotated[int, Bound(ge=0)] = 0  # batches between checkpoints; 0: only at the end
    # keep the (EMA) weights of every keep_checkpoints-th checkpoint in the results store, for `loopstudy evaluate
    # --checkpoints`; 0: only the final weights
    keep_checkpoints: Annotated[int, Bound(ge=0)] = 0
    progressive: Annotated[float, Bound(ge=0, le=1)] = 0.0
    # ARC's puzzle embedding (study/trial/optimizers.py): TRM's sparse sign-SGD (lr 1e-2, weight decay 0.1) on
    # the rows a batch used, or AdamW in a group of its own; puzzle_lr is the peak of the model's warmup schedule
    puzzle_optimizer: Literal["sign_sgd", "adamw"] = "sign_sgd"
    puzzle_lr: Annotated[float, Bound(gt=0)] = 1e-2  # the puzzle embedding's peak learning rate
    puzzle_weight_decay: Annotated[float, Bound(ge=0)] = 0.1  # the puzzle embedding's decoupled weight decay

    def __post_init__(self):
        check_bounds("train", self)
        if self.progressive and self.n_sup != 1:
            raise ValueError(f"train.progressive={self.progressive} needs train.n_sup=1 (Deep Thinking trains one "
                             f"update per batch); got train.n_sup={self.n_sup}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"train.device={self.device!r} is not allowed; use 'cpu' or 'cuda[:N]'")
        if self.keep_checkpoints and not self.checkpoint_every:
            raise ValueError(f"train.keep_checkpoints={self.keep_checkpoints} keeps every Nth checkpoint, and "
                             "train.checkpoint_every=0 takes none along training; set train.checkpoint_every "
                             "(batches between checkpoints) as well")


@pdataclass(config={"extra": "forbid"})
class EvalConfig:
    """depths: executed layers at which to read accuracy (each a whole number of outer cycles / iterations).
    H, L: evaluate with other cycle counts than training (the papers evaluate H6 L12); None keeps training's.
    halting: override model.halting.enabled; halting_rule, tau, gamma: override model.halting.rule / .tau / .gamma
    at test time only (FPRM's code evaluates with gamma 0.99; a test-time tau sweep needs no retraining of the
    halting rule; one set of weights is read with fixed depth, FPRM's halting and the Q head's).
    stability: (u1, u2) updates. perturb_update: update at which the state is perturbed (None: no perturbation
    test). compile: torch.compile the step of the evaluation rollout ("reduce-overhead", i.e. CUDA graphs, on a
    GPU); same numbers, less per-step overhead, a one-off compile cost. readout: the prediction a depth reading
    scores: the current step's (last), or per sample the most confident step's so far (max_conf: mean over the
    input's tokens of the top softmax probability; a label-free baseline against overthinking)."""

    depths: Annotated[list[int] | None, Bound(ge=1)] = None
    # outer cycles per update at test time (the papers evaluate H6 L12); null keeps training's
    H: Annotated[int | None, Bound(ge=1)] = None
    # inner cycles at test time; null keeps training's
    L: Annotated[int | None, Bound(ge=1)] = None
    halting: bool | None = None
    # the halting rule at test time (residual or q_head); null keeps model.halting.rule
    halting_rule: Literal["residual", "q_head"] | None = None
    tau: Tau | None = None
    gamma: Gamma | None = None
    # evaluate the first n_test test samples only (null: all)
    n_test: Annotated[int | None, Bound(ge=1)] = None
    # samples per evaluation rollout
    batch_size: Annotated[int, Bound(ge=1, most=1_000_000)] = 256
    stability: tuple[int, int] | None = None
    # updates either side of the solving update in the aligned gamma record
    align_window: Annotated[int, Bound(ge=1)] = 6
    perturb_update: Annotated[int | None, Bound(ge=1)] = None
    # relative sizes of the state perturbations
    perturb_eps: Annotated[list[float], Bound(ge=0)] = field(default_factory=lambda: [0.0, 1e-4, 1e-3, 1e-2, 0.1, 0.3])
    # updates to run after the perturbation
    perturb_updates: Annotated[int, Bound(ge=1)] = 36
    # samples of the first batch the perturbation test uses
    perturb_n: Annotated[int, Bound(ge=1)] = 64
    compile: bool | None = None  # torch.compile the rollout step (CUDA graphs on a GPU); None/False: eager
    # what a depth reading scores: the current step's prediction (last) or the most confident so far (max_conf)
    readout: Literal["last", "max_conf"] = "last"
    # the readings' precision: fp32, or bf16 as TRM's forward runs (null: train.dtype's), whatever the weights were in
    dtype: Literal["fp32", "bf16"] | None = None

    def __post_init__(self):
        check_bounds("eval", self)
        if self.depths is not None and not self.depths:
            raise ValueError("eval.depths=[] is not allowed; give positive layer counts (or leave it unset)")
        if self.stability is not None and not 0 < self.stability[0] < self.stability[1]:
            raise ValueError(f"eval.stability={list(self.stability)} is not allowed; need 0 < u1 < u2")

    def model_config(self, trained: ModelConfig) -> ModelConfig:
        """The configuration the evaluation runs: training's with H, L and halting (on/off, tau, gamma) overridden."""
        changes = {k: getattr(self, k) for k in ("H", "L") if getattr(self, k) is not None}
        halting = {k: v for k, v in (("enabled", self.halting), ("rule", self.halting_rule), ("tau", self.tau),
                                     ("gamma", self.gamma)) if v is not None}
        if halting:
            changes["halting"] = dataclasses.replace(trained.halting, **halting)
        if changes.get("H") is not None and trained.grad_steps > changes["H"]:
            changes["grad_steps"] = changes["H"]
        return dataclasses.replace(trained, **changes)

    def resolved_depths(self, cfg: ModelConfig) -> list[int]:
        """The depth targets, checked against cfg; default: 1, 2, 4 and 8 updates."""
        depths = self.depths or [cfg.layers_per_update * k for k in (1, 2, 4, 8)]
        for d in depths:
            cfg.steps_for_depth(d, "eval.depths")
        # the diagnostics roll out to their own updates too: the same cap holds for them
        for key, update in (("eval.stability", self.stability and self.stability[1]),
                            ("eval.perturb_update + eval.perturb_updates",
                             self.perturb_update and self.perturb_update + self.perturb_updates)):
            if update and update * cfg.layers_per_update > MAX_DEPTH_LAYERS:
                raise ValueError(f"{key} reaches update {update} = {update * cfg.layers_per_update} layers; at most "
                                 f"{MAX_DEPTH_LAYERS} layers are allowed")
        if max(depths) > MAX_DEPTH_LAYERS:
            raise ValueError(f"eval.depths={max(depths)} layers is not allowed; at most {MAX_DEPTH_LAYERS} "
                             "(4x the papers' deepest reading, 24,960)")
        return sorted(set(depths))


@pdataclass(config={"extra": "forbid"})
class TrialConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0
    label: str = ""  # the sweep variant's name; a display name, not part of the trial's identity

    def __post_init__(self):
        if self.train.steps == 0 and self.model.init_from is None:
            raise ValueError("train.steps=0 trains nothing: it reads model.init_from's weights, and needs it")
        self.check_act()
        # depth targets must be whole outer cycles of the *evaluated* model: fail before training starts
        self.eval.resolved_depths(self.eval.model_config(self.model))
        spec = TASKS[self.task.name].spec(self.task)
        if self.model.pos == "learned" and spec.test_shape_differs:
            shape = spec.test_grid if len(spec.grid) > 1 else f"{spec.test_seq_len} tokens"
            raise ValueError(f"the test inputs ({shape}) are larger than training's ({spec.grid}) and model.pos="
                             "learned has no positions for them; set model.pos=none")
        if self.model.mixer == "mlp" and spec.test_shape_differs:
            raise ValueError("the test inputs are longer than training's and model.mixer=mlp mixes a fixed number "
                             "of positions; use model.mixer=attention")
        if self.eval.n_test is not None and self.eval.n_test > self.task.n_test:
            raise ValueError(f"eval.n_test={self.eval.n_test} is not allowed; the task has task.n_test="
                             f"{self.task.n_test} test samples")

    @property
    def reading_dtype(self) -> str:
        """The precision the trial's readings run in: eval.dtype, else train.dtype."""
        return self.eval.dtype or self.train.dtype

    def check_act(self) -> None:
        """train.act's needs: a Q head to halt with, and a state every sample can carry at its own step."""
        act = self.train.act
        if act == "off":
            return
        if not self.model.q_head:
            raise ValueError(f"train.act={act} halts samples with TRM's Q head; set model.q_head=true")
        if self.train.progressive:
            raise ValueError(f"train.act={act} and train.progressive={self.train.progressive} both decide how many "
                             "updates a sample gets; set train.progressive=0")
        if "full_attnres" in self.model.rules:
            raise ValueError(f"train.act={act} carries samples at different steps in one batch, and "
                             "full_attnres's candidate list has one length per batch; use another model.carry.rule")
