"""Study specs: one YAML file -> validated StudySpec -> the list of resolved trial configs (or an Optuna space).

A spec holds a base trial (sections task/model/train/eval, as for `loopstudy trial`) and a `sweep`:
  grid:      {dotted.key: [values, ...]}          cartesian product
  variants:  [{name: ..., dotted.key: value}, ...] named bundles of overrides (non-cartesian points)
  seeds:     [0, 1, 2]
  optuna:    {metric, mode, num_samples, space: {dotted.key: {type: uniform|loguniform|int|choice, ...}}}
  asha:      {max_t, grace_period, reduction_factor}
  max_concurrent: N
plus `resources: {cpu, gpu}` per trial and `storage` (results root). Every problem is reported before any trial
starts, naming the file, the dotted key and the allowed values. Torch-free and Ray-free.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from study.config import ConfigError, TrialConfig, build_trial, describe_error, load_yaml, set_dotted, trial_id

FINAL_METRICS = ("final_exact_acc", "best_exact_acc", "final_cell_acc")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OptunaParam(Strict):
    type: Literal["uniform", "loguniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
    values: list[Any] | None = None

    def check(self, key: str) -> None:
        if self.type == "choice":
            if not self.values:
                raise ValueError(f"sweep.optuna.space.{key}: type choice needs a non-empty 'values' list")
        elif self.low is None or self.high is None or not self.low < self.high:
            raise ValueError(f"sweep.optuna.space.{key}: type {self.type} needs low < high")
        elif self.type == "loguniform" and self.low <= 0:
            raise ValueError(f"sweep.optuna.space.{key}: loguniform needs low > 0")


class OptunaSpec(Strict):
    metric: Literal["final_exact_acc", "best_exact_acc", "final_cell_acc"] = "final_exact_acc"
    mode: Literal["max", "min"] = "max"
    num_samples: int = 8
    space: dict[str, OptunaParam]


class AshaSpec(Strict):
    """Early stopping on the training exact accuracy reported every log_every steps (time = reports)."""

    max_t: int = 100
    grace_period: int = 2
    reduction_factor: float = 2.0


class SweepSpec(Strict):
    grid: dict[str, list[Any]] = {}
    variants: list[dict[str, Any]] = []
    seeds: list[int] = [0]
    optuna: OptunaSpec | None = None
    asha: AshaSpec | None = None
    max_concurrent: int = 0
    max_failures: int = 2  # retries of a trial whose worker or node died (resumes from its last checkpoint)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("give at least one seed")
        return v


class Resources(Strict):
    cpu: float = 1.0
    gpu: float = 0.0

    @field_validator("cpu", "gpu")
    @classmethod
    def _nonneg(cls, v: float) -> float:
        if v < 0:
            raise ValueError("must be >= 0")
        return v


class StudySpec(Strict):
    name: str
    description: str = ""
    task: dict[str, Any] = {}
    model: dict[str, Any] = {}
    train: dict[str, Any] = {}
    eval: dict[str, Any] = {}
    sweep: SweepSpec = SweepSpec()
    resources: Resources = Resources()
    storage: str = "results"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v or any(c in v for c in "/\\= ") or v.startswith((".", "_")):
            raise ValueError("a study name is a non-empty word without '/', '=', spaces or a leading '.' or '_'")
        return v

    def base(self) -> dict[str, Any]:
        return {"task": self.task, "model": self.model, "train": self.train, "eval": self.eval}


@dataclass
class Study:
    """A validated spec and what it expands to."""

    spec: StudySpec
    source: str
    data: dict[str, Any] = field(default_factory=dict)  # the spec as read, overrides applied
    trials: list[TrialConfig] = field(default_factory=list)  # grid studies: every resolved trial

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_optuna(self) -> bool:
        return self.spec.sweep.optuna is not None


def _with(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in overrides.items():
        set_dotted(out, k, v)
    return out


def grid_points(sweep: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of grid values x variants x seeds, as dotted overrides (with a '_variant' label)."""
    keys = list(sweep.grid)
    combos = list(itertools.product(*[sweep.grid[k] for k in keys])) if keys else [()]
    variants = sweep.variants or [{}]
    points = []
    for combo in combos:
        for var in variants:
            for seed in sweep.seeds:
                over = dict(zip(keys, combo))
                over.update({k: v for k, v in var.items() if k != "name"})
                if "name" in var:
                    over["label"] = str(var["name"])
                over["seed"] = seed
                points.append(over)
    return points


def load_study(path: str | Path, overrides: list[str] | None = None) -> Study:
    """Read and validate a spec; expand grid studies to their trials. Raises ConfigError naming file and key."""
    from study.config import merge, parse_overrides

    source = str(path)
    data = merge(load_yaml(path), parse_overrides(overrides or []))
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_error(e, source)) from None
    sweep = spec.sweep
    if sweep.optuna is not None:
        if sweep.grid or sweep.variants:
            raise ConfigError(
                f"{source}: sweep.grid / sweep.variants cannot be combined with sweep.optuna (Ray Tune's "
                "OptunaSearch refuses grid axes inside its space). Put the grid in separate spec files, or move "
                "the axis into sweep.optuna.space as {type: choice, values: [...]}.")
        if len(sweep.seeds) != 1:
            raise ConfigError(f"{source}: sweep.seeds: an Optuna search takes one seed (got {sweep.seeds}); "
                              "run the best configuration again over seeds as a grid study")
        for key, param in sweep.optuna.space.items():
            try:
                param.check(key)
            except ValueError as e:
                raise ConfigError(f"{source}: {e}") from None
    study = Study(spec, source, data)
    base = spec.base()
    if sweep.optuna is not None:
        # validate the base at both ends of every range and at every choice, so bad values show up now
        def pick(p: OptunaParam, end: int):
            v = p.values[end] if p.type == "choice" else (p.low if end == 0 else p.high)
            return int(v) if p.type == "int" else v

        space = sweep.optuna.space
        samples = [{k: pick(p, end) for k, p in space.items()} for end in (0, -1)]
        for k, p in space.items():
            samples += [{**samples[0], k: v} for v in (p.values or [])]
        for sample in samples:
            build_trial(_with(base, {**sample, "seed": sweep.seeds[0]}), f"{source} (optuna space point {sample})")
        return study
    seen = set()
    for over in grid_points(sweep):
        for k in over:
            if k not in ("seed", "label") and k.split(".")[0] not in ("task", "model", "train", "eval"):
                raise ConfigError(f"{source}: sweep key {k!r} must start with task., model., train. or eval.")
        cfg = build_trial(_with(base, over), f"{source} (sweep point {over})")
        tid = trial_id(cfg)
        if tid not in seen:  # two points that resolve to the same config run once
            seen.add(tid)
            study.trials.append(cfg)
    return study


def check_resources(study: Study, cluster: dict[str, float]) -> None:
    """Refuse what the cluster cannot give, before any trial starts."""
    res = study.spec.resources
    if res.gpu > 0 and cluster.get("GPU", 0) <= 0:
        raise ConfigError(f"{study.source}: resources.gpu={res.gpu} but the cluster has no GPUs; "
                          "allowed here: resources.gpu: 0 (or join a cluster with GPUs via --address)")
    if res.gpu > 0 and any(c.train.device == "cpu" for c in study.trials):
        raise ConfigError(f"{study.source}: resources.gpu={res.gpu} but train.device is 'cpu'; set "
                          "train.device: cuda")
    if res.cpu > cluster.get("CPU", 0):
        raise ConfigError(f"{study.source}: resources.cpu={res.cpu} but the cluster has only "
                          f"{cluster.get('CPU', 0):g} CPUs")
