"""Configuration schema (torch-free, so analysis and spec checks never import torch), trial identity, and
YAML / dotted-key loading.

Every config is a pydantic dataclass that forbids unknown keys; impossible values raise ValueError naming the
dotted key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, get_args, get_type_hints

import yaml
from pydantic import TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as pdataclass

from study.tasks import TASKS

TaskName = Literal[tuple(TASKS)]  # every module in study/tasks/ with a TASK
Rule = Literal["carry_last", "infiloop", "full_attnres", "damped"]
Placement = Literal["none", "inner", "outer", "both"]
RULES = get_args(Rule)

# The deepest test-time rollout a config may ask for: 4x the papers' 24,960 layers. A typo such as 10**9 layers
# would otherwise run for weeks before anyone noticed.
MAX_DEPTH_LAYERS = 100_000
# Upper bounds on sizes, for the same reason: far above any study here or in the papers (9x9 sudoku, hidden 512,
# ~65k steps of batch 768, 16 supervision steps), low enough that a typo fails at once instead of running out of
# memory or time. Keys are "section.field".
MAX_SIZE = {"task.n_train": 10_000_000, "task.n_test": 1_000_000, "task.length": 100_000, "task.test_size": 1_000,
            "model.hidden": 16_384, "model.heads": 1_024, "model.n_layers": 1_024, "train.steps": 10_000_000,
            "train.batch_size": 1_000_000, "train.n_sup": 1_024, "eval.batch_size": 1_000_000}

# Study names become folder names (<root>/<table>/study=<name>/) and Hive partition values: letters, digits and
# '_', '.', '-' only, starting with a letter or digit. No '/' or '..' (a path outside the root), no '%' (pyarrow's
# Hive reader URL-decodes it, Polars' does not: the same file would read back under two names), no spaces or '='.
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


class ConfigError(ValueError):
    """A configuration problem, with the file and key in the message."""


def is_study_name(name: object) -> bool:
    """Whether `name` may name a study (see STUDY_NAME)."""
    return isinstance(name, str) and bool(STUDY_NAME.fullmatch(name)) and ".." not in name


def check_study_name(name: str) -> str:
    """The one rule for study names, applied by the spec and by every command that takes one (via Store)."""
    if not is_study_name(name):
        raise ConfigError(f"study name {name!r} is not allowed: use 1-100 letters, digits, '_', '.' or '-', "
                          "starting with a letter or digit (no '/', '..', '%', spaces or '=')")
    return name


def check_positive(prefix: str, obj: Any, names: tuple[str, ...], least: int = 1) -> None:
    """Each named field of obj must be >= least (an int count such as steps or a batch size) and, where MAX_SIZE
    names it, at most its maximum."""
    for name in names:
        v = getattr(obj, name)
        if v is not None and v < least:
            raise ValueError(f"{prefix}.{name}={v} is not allowed; it must be >= {least}")
        most = MAX_SIZE.get(f"{prefix}.{name}")
        if v is not None and most is not None and v > most:
            raise ValueError(f"{prefix}.{name}={v} is not allowed; at most {most:,} (loopstudy's sanity bound)")


@pdataclass(config={"extra": "forbid"})
class CarryConfig:
    """The loop rule and where it goes. Axes not named by `placement` use carry_last.

    reset_inner: whether the inner axis's InfiLoop accumulators (log D, h) restart at every outer cycle. Default
    False: the inner axis keeps one decayed history over the whole rollout. Resetting would make the first inner
    step of each cycle a hard carry-last (gamma = 1) and throw away the accumulated evidence.
    """

    rule: Rule = "carry_last"
    placement: Placement = "both"
    beta_init: float = 0.55
    learn_beta: bool = True
    content_score: bool = True
    clip: float = 8.0
    reset_inner: bool = False

    def __post_init__(self):
        if not self.beta_init > 0:
            raise ValueError(f"model.carry.beta_init={self.beta_init} is not allowed; beta must be > 0")
        if not self.clip > 0:
            raise ValueError(f"model.carry.clip={self.clip} is not allowed; it must be > 0")

    def rule_for(self, axis: str) -> str:
        """The rule applied on `axis` ('inner', 'outer' or 'flat')."""
        if axis == "flat":
            return self.rule
        return self.rule if self.placement in (axis, "both") else "carry_last"




def check_tau_gamma(prefix: str, tau: float | None, gamma: float | None) -> None:
    """Halting threshold tau > 0 and FPOpt decay gamma in (0, 1]; None is not checked. prefix names the section."""
    if tau is not None and not tau > 0:
        raise ValueError(f"{prefix}.tau={tau} is not allowed; tau must be > 0")
    if gamma is not None and not 0 < gamma <= 1:
        raise ValueError(f"{prefix}.gamma={gamma} is not allowed; it must lie in (0, 1]")


@pdataclass(config={"extra": "forbid"})
class HaltingConfig:
    """enabled: halted samples freeze (state and effective layers). FPOpt's eta runs either way (damped rule)."""

    enabled: bool = False
    tau: float = 0.1
    gamma: float = 0.9
    patience: int = 5
    eta0: float = 1.0
    eta_min: float = 1e-3
    eps: float = 1e-6

    def __post_init__(self):
        check_tau_gamma("model.halting", self.tau, self.gamma)
        if self.patience < 1:
            raise ValueError(f"model.halting.patience={self.patience} is not allowed; it must be >= 1")
        if not 0 < self.eta0 <= 1:
            raise ValueError(f"model.halting.eta0={self.eta0} is not allowed; it must lie in (0, 1]")




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

    kind: Literal["nested", "flat"] = "nested"
    hidden: int = 64
    heads: int = 4
    n_layers: int = 2
    expansion: float = 4.0
    norm: Literal["pre", "post"] = "post"
    conv: bool = True
    residual_scaling: bool = False
    a1_init: float = 0.75
    a2_init: float = 0.25
    H: int = 3
    L: int = 6
    grad_steps: int = 1
    recall: bool = True
    pos: Literal["learned", "none"] = "learned"
    carry: CarryConfig = field(default_factory=CarryConfig)
    halting: HaltingConfig = field(default_factory=HaltingConfig)

    def __post_init__(self):
        check_positive("model", self, ("hidden", "heads", "n_layers", "H", "L", "grad_steps"))
        if not self.expansion > 0:
            raise ValueError(f"model.expansion={self.expansion} is not allowed; it must be > 0")
        if self.layers_per_update > MAX_DEPTH_LAYERS:
            raise ValueError(f"model.H={self.H}, model.L={self.L}, model.n_layers={self.n_layers} make "
                             f"{self.layers_per_update} layers per update; at most {MAX_DEPTH_LAYERS} are allowed")
        if self.grad_steps > self.H:
            raise ValueError(f"model.grad_steps={self.grad_steps} is not allowed; it must be <= model.H={self.H}")
        if self.hidden % self.heads:
            raise ValueError(f"model.hidden={self.hidden} must be divisible by model.heads={self.heads}")
        for name in ("a1_init", "a2_init"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ValueError(f"model.{name}={v} is not allowed; it must lie in [0, 1)")
        if self.residual_scaling and self.norm != "pre":
            raise ValueError("model.residual_scaling=True needs model.norm='pre' (FPRM's pre-norm scaling)")
        if self.pos == "none" and not self.conv:
            raise ValueError("model.pos=none needs model.conv=true: without positions the conv's locality is the "
                             "only order the model sees")

    @property
    def layers_per_step(self) -> int:
        """Executed layers per outer cycle (nested) or per iteration (flat)."""
        return (self.L + 1) * self.n_layers if self.kind == "nested" else self.n_layers

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




# Task settings only some tasks read: set for another task, they are refused rather than silently ignored.
TASK_ONLY = {"test_size": ("maze",), "min_length": ("prefix_sums",), "test_lengths": ("prefix_sums",)}


@pdataclass(config={"extra": "forbid"})
class TaskConfig:
    """name: sudoku | maze | state_tracking | prefix_sums. size: board side (sudoku 4/6/9, maze N); test_size: a
    maze side for the test set (extrapolation: train small, test larger). blanks: [min, max] blanks per sudoku
    (test_blanks: another range for the test set). length: sequence length (state tracking; prefix sums: the
    longest training string, min_length the shortest); test_lengths: prefix-sum test lengths (default: length).
    csv / test_csv: Sudoku-Extreme files instead of generated puzzles (relative paths are read against the spec's
    folder; a trial's identity holds their contents); with csv and no test_csv the last n_test of the first
    n_train + n_test puzzles of csv are held out as the test set. data_seed fixes the data for every trial seed
    (the trial seed drives init and order)."""

    name: TaskName = "sudoku"
    size: int = 4
    blanks: tuple[int, int] = (8, 10)
    test_blanks: tuple[int, int] | None = None
    min_path: int = 10
    loop_frac: float = 0.1
    group: Literal["S5", "A5"] = "A5"
    length: int = 16
    min_length: int | None = None
    test_lengths: list[int] | None = None
    test_size: int | None = None
    n_train: int = 2000
    n_test: int = 256
    data_seed: int = 0
    augment: bool = True
    csv: str | None = None
    test_csv: str | None = None
    cache_dir: str | None = None

    def __post_init__(self):
        for key, tasks in TASK_ONLY.items():
            if getattr(self, key) is not None and self.name not in tasks:
                raise ValueError(f"task.{key} is for {', '.join(tasks)}; task.name is {self.name!r}")
        check_positive("task", self, ("n_train", "n_test", "length", "min_length", "test_size"))
        TASKS[self.name].check(self)
        if not 0 <= self.loop_frac <= 1:
            raise ValueError(f"task.loop_frac={self.loop_frac} is not allowed; it must lie in [0, 1]")
        for key in ("csv", "test_csv"):
            path = getattr(self, key)
            if path is None:
                continue
            if not TASKS[self.name].reads_csv:
                readers = [t for t, d in TASKS.items() if d.reads_csv]
                raise ValueError(f"task.{key} is for {', '.join(readers)} (Sudoku-Extreme's CSV format); task.name "
                                 f"is {self.name!r}")
            if not os.path.isfile(path):
                what = "is a folder, not a file" if os.path.isdir(path) else "does not exist"
                raise ValueError(f"task.{key}={path!r} {what}")
        if self.test_csv and not self.csv:
            raise ValueError("task.test_csv needs task.csv (the training puzzles) as well")




@pdataclass(config={"extra": "forbid"})
class TrainConfig:
    """steps: optimizer steps (each batch gives n_sup of them). device/dtype: 'cpu'|'cuda', 'fp32'|'bf16'.
    progressive: Deep Thinking's progressive loss weight alpha (Bansal et al. 2022): the loss is (1 - alpha) x the
    loss after the update's H steps + alpha x the loss after k steps with gradient that start from n steps run
    without it (n uniform in 0..H-1, k in 1..H-n), which teaches the step to improve any partial state instead of
    counting iterations. 0: off. Needs n_sup 1."""

    steps: int = 600
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    warmup: int = 50
    n_sup: int = 4
    grad_clip: float = 1.0
    ema: float = 0.999
    loss: Literal["softmax", "stablemax"] = "softmax"
    device: str = "cpu"
    dtype: Literal["fp32", "bf16"] = "fp32"
    threads: int = 0  # torch CPU threads; 0 leaves torch's default
    log_every: int = 50
    checkpoint_every: int = 0  # batches between checkpoints; 0: only at the end
    progressive: float = 0.0

    def __post_init__(self):
        check_positive("train", self, ("steps", "batch_size", "n_sup", "log_every"))
        if not 0 <= self.progressive <= 1:
            raise ValueError(f"train.progressive={self.progressive} is not allowed; it must lie in [0, 1]")
        if self.progressive and self.n_sup != 1:
            raise ValueError(f"train.progressive={self.progressive} needs train.n_sup=1 (Deep Thinking trains one "
                             f"update per batch); got train.n_sup={self.n_sup}")
        check_positive("train", self, ("warmup", "threads", "checkpoint_every"), least=0)
        for name in ("weight_decay", "grad_clip"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"train.{name}={getattr(self, name)} is not allowed; it must be >= 0")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"train.betas={list(self.betas)} is not allowed; each must lie in [0, 1)")
        if not self.lr > 0:
            raise ValueError(f"train.lr={self.lr} is not allowed; it must be > 0")
        if not 0 <= self.ema < 1:
            raise ValueError(f"train.ema={self.ema} is not allowed; it must lie in [0, 1)")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"train.device={self.device!r} is not allowed; use 'cpu' or 'cuda[:N]'")




@pdataclass(config={"extra": "forbid"})
class EvalConfig:
    """depths: executed layers at which to read accuracy (each a whole number of outer cycles / iterations).
    H, L: evaluate with other cycle counts than training (the papers evaluate H6 L12); None keeps training's.
    halting: override model.halting.enabled; tau, gamma: override model.halting.tau / .gamma at test time only
    (FPRM's code evaluates with gamma 0.99; a test-time tau sweep needs no retraining of the halting rule).
    stability: (u1, u2) updates. perturb_update: update at which the state is perturbed (None: no perturbation
    test). compile: torch.compile the step of the evaluation rollout ("reduce-overhead", i.e. CUDA graphs, on a
    GPU); same numbers, less per-step overhead, a one-off compile cost. readout: the prediction a depth reading
    scores: the current step's (last), or per sample the most confident step's so far (max_conf: mean over the
    input's tokens of the top softmax probability; a label-free baseline against overthinking)."""

    depths: list[int] | None = None
    H: int | None = None
    L: int | None = None
    halting: bool | None = None
    tau: float | None = None
    gamma: float | None = None
    n_test: int | None = None
    batch_size: int = 256
    stability: tuple[int, int] | None = None
    align_window: int = 6
    perturb_update: int | None = None
    perturb_eps: list[float] = field(default_factory=lambda: [0.0, 1e-4, 1e-3, 1e-2, 0.1, 0.3])
    perturb_updates: int = 36
    perturb_n: int = 64
    compile: bool | None = None  # torch.compile the rollout step (CUDA graphs on a GPU); None/False: eager
    readout: Literal["last", "max_conf"] = "last"

    def __post_init__(self):
        if self.depths is not None and (not self.depths or min(self.depths) < 1):
            raise ValueError(f"eval.depths={self.depths} is not allowed; give positive layer counts")
        check_positive("eval", self, ("H", "L", "n_test", "batch_size", "align_window", "perturb_updates",
                                      "perturb_n"))
        if self.perturb_update is not None and self.perturb_update < 1:
            raise ValueError(f"eval.perturb_update={self.perturb_update} is not allowed; it must be >= 1 (or unset)")
        if self.stability is not None and not 0 < self.stability[0] < self.stability[1]:
            raise ValueError(f"eval.stability={list(self.stability)} is not allowed; need 0 < u1 < u2")
        if any(e < 0 for e in self.perturb_eps):
            raise ValueError(f"eval.perturb_eps={self.perturb_eps} is not allowed; sizes must be >= 0")
        check_tau_gamma("eval", self.tau, self.gamma)  # test-time overrides obey the same rules

    def model_config(self, trained: ModelConfig) -> ModelConfig:
        """The configuration the evaluation runs: training's with H, L and halting (on/off, tau, gamma) overridden."""
        changes = {k: getattr(self, k) for k in ("H", "L") if getattr(self, k) is not None}
        halting = {k: v for k, v in (("enabled", self.halting), ("tau", self.tau), ("gamma", self.gamma))
                   if v is not None}
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
        # depth targets must be whole outer cycles of the *evaluated* model: fail before training starts
        self.eval.resolved_depths(self.eval.model_config(self.model))
        spec = TASKS[self.task.name].spec(self.task)
        if self.model.pos == "learned" and spec.test_shape_differs:
            shape = spec.test_grid if len(spec.grid) > 1 else f"{spec.test_seq_len} tokens"
            raise ValueError(f"the test inputs ({shape}) are larger than training's ({spec.grid}) and model.pos="
                             "learned has no positions for them; set model.pos=none")
        if self.eval.n_test is not None and self.eval.n_test > self.task.n_test:
            raise ValueError(f"eval.n_test={self.eval.n_test} is not allowed; the task has task.n_test="
                             f"{self.task.n_test} test samples")


# Fields that do not change a trial's results, so they stay out of its identity.
NON_IDENTITY = {("task", "cache_dir"), ("train", "log_every"), ("train", "checkpoint_every"), ("train", "threads")}
# Fields added after results were stored, with the value that reproduces the behaviour from before them: left out
# of the hash while they hold it, so a new knob does not give every stored trial a new id (and re-run it). Add a
# field here whenever one joins a config section.
ADDED_LATER: dict[tuple[str, str], Any] = {
    ("eval", "tau"): None, ("eval", "gamma"): None, ("eval", "compile"): None, ("eval", "readout"): "last",
    ("model", "recall"): True, ("model", "pos"): "learned", ("train", "progressive"): 0.0,
    ("task", "min_length"): None, ("task", "test_lengths"): None, ("task", "test_size"): None,
}


def to_dict(cfg: TrialConfig) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'model': {'carry': {'rule': x}}} -> {'model.carry.rule': x}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for i, p in enumerate(parts[:-1]):
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            section = ".".join(parts[:i + 1])
            raise ConfigError(f"{key}: {section} is a section (a mapping of keys), but it is set to {d!r}")
    d[parts[-1]] = value


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: str) -> str:
    """sha256 of a data file's bytes (cached per path, size and mtime: a 10,000-trial study hashes it once)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"data file {path}: {e.strerror}") from None
    return _file_digest(os.path.abspath(path), st.st_size, st.st_mtime_ns)


# Config fields that name data files: a trial's identity holds their contents, not their paths (edit the CSV and
# the trials are new; move it and they are the same).
DATA_FILES = (("task", "csv"), ("task", "test_csv"))


def trial_id(cfg: TrialConfig) -> str:
    """Short hash of the resolved config (seed included), without fields that cannot change results; data files
    enter by content."""
    d = to_dict(cfg)
    for section, name in NON_IDENTITY:
        d[section].pop(name, None)
    for section, name in DATA_FILES:
        if d[section].get(name):
            d[section][name] = "sha256:" + file_digest(d[section][name])
    for (section, name), before in ADDED_LATER.items():
        if d[section].get(name, before) == before:
            d[section].pop(name, None)
    d.pop("label", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def _fields(cls: Any) -> dict[str, Any]:
    """A config class's fields and their types: pydantic dataclasses (trial configs) or models (study specs)."""
    if dataclasses.is_dataclass(cls):
        return get_type_hints(cls)
    if isinstance(cls, type) and hasattr(cls, "model_fields"):
        return {name: f.annotation for name, f in cls.model_fields.items()}
    return {}


def allowed_keys(loc: tuple, root: Any = None) -> list[str]:
    """Field names of the config section at `loc` under `root` (default TrialConfig), for 'unknown key' messages.
    A spec's trial sections (task/model/...) are free-form dicts there: they resolve to TrialConfig's sections."""
    cls: Any = root or TrialConfig
    for part in loc[:-1]:
        tp = _fields(cls).get(part)
        if tp is None or not _fields(tp):
            tp = get_type_hints(TrialConfig).get(part) if cls is not TrialConfig else None
        if tp is None:
            return []
        cls = tp
    return list(_fields(cls))


def describe_error(err: ValidationError, source: str, root: Any = None) -> str:
    """One line per problem: file, dotted key, what is wrong and what is allowed (keys of `root`'s sections)."""
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if isinstance(p, str))
        key = ".".join(loc)
        msg = e["msg"]
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            allowed = allowed_keys(loc, root)
            msg = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        elif e["type"] == "literal_error" and "expected" in e.get("ctx", {}):
            msg = f"{e.get('input')!r} is not allowed; allowed: {e['ctx']['expected']}"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if not key or msg.startswith((f"{key}.", f"{key}=")):  # the message names its own dotted key
            lines.append(f"{source}: {msg}")
        else:
            lines.append(f"{source}: {key}: {msg}")
    return "\n".join(lines)


def build_trial(data: dict[str, Any], source: str = "<config>") -> TrialConfig:
    try:
        return TypeAdapter(TrialConfig).validate_python(data)
    except ValidationError as e:
        raise ConfigError(describe_error(e, source)) from None


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """['model.carry.rule=infiloop', 'train.steps=10'] -> nested dict (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} must look like key=value (e.g. model.carry.rule=infiloop)")
        k, v = pair.split("=", 1)
        set_dotted(out, k.strip(), yaml.safe_load(v))
    return out


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def absolute_data_path(value: Any, base: Path) -> Any:
    """A relative data-file path made absolute against `base`, the folder of the file that names it: Ray runs
    trials in another working folder, so a path relative to the shell's folder would not be found there."""
    if isinstance(value, str) and value and "://" not in value:
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else (base / path).resolve())
    return value


def resolve_data_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """task.csv / task.test_csv of a trial dict, made absolute against `base` (in place; returns data)."""
    task = data.get("task")
    if isinstance(task, dict):
        for _, name in DATA_FILES:
            if name in task:
                task[name] = absolute_data_path(task[name], base)
    return data


def check_data_files(configs: list[TrialConfig], source: str) -> None:
    """Read every distinct task CSV the configs name, as a trial would, so bad data (a broken row, an answer that
    breaks the rules, too few puzzles to hold out a test set) is refused before any trial starts."""
    from study.tasks.base import DataError
    from study.tasks.loader import load_csv_splits

    seen = set()
    for cfg in configs:
        t = cfg.task
        key = (t.csv, t.test_csv, t.size, t.n_train, t.n_test)
        if t.csv and key not in seen:
            seen.add(key)
            try:
                load_csv_splits(t)
            except DataError as e:
                raise ConfigError(f"{source}: {e}") from None


def load_trial(path: str | Path, overrides: list[str] | None = None) -> TrialConfig:
    """A trial config from YAML (sections task/model/train/eval/seed) plus dotted key=value overrides. Relative
    data-file paths are read against the YAML file's folder."""
    data = merge(load_yaml(path), parse_overrides(overrides or []))
    cfg = build_trial(resolve_data_paths(data, Path(path).resolve().parent), str(path))
    check_data_files([cfg], str(path))
    return cfg
