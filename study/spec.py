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
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from study.config import (
    DATA_FILES,
    ConfigError,
    TrialConfig,
    absolute_data_path,
    build_trial,
    check_data,
    check_study_name,
    describe_error,
    load_yaml,
    merge,
    parse_overrides,
    resolve_data_paths,
    set_dotted,
    trial_id,
    yamltext,
)
from study.config.reads import unread, unread_fields
from study.metrics import DEFAULT_METRIC, SearchMetric
from study.optuna_storage import check_location, storage_location
from study.paths import is_uri
from study.store.layout import spec_file


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
    metric: SearchMetric = DEFAULT_METRIC
    mode: Literal["max", "min"] = "max"
    num_samples: int = 8
    space: dict[str, OptunaParam]
    storage: str | None = None  # the Optuna study's storage: a journal file or an RDB URL (study/optuna_storage.py)

    @field_validator("num_samples")
    @classmethod
    def _samples(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"{v} is not allowed; an Optuna search needs at least 1 sample")
        return v

    @field_validator("space")
    @classmethod
    def _space(cls, v: dict[str, OptunaParam]) -> dict[str, OptunaParam]:
        if not v:
            raise ValueError("give at least one dotted key to search")
        return v


class AshaSpec(Strict):
    """Early stopping (ASHA) on the training cell accuracy reported every train.log_every steps. Time is the
    training step: rungs at grace_period * reduction_factor^k steps, up to max_t. A trial that passes the last rung
    trains on and is evaluated; a stopped one keeps its rows (status `stopped`)."""

    max_t: int = 100
    grace_period: int = 10
    reduction_factor: float = 2.0

    @model_validator(mode="after")
    def _check(self) -> AshaSpec:
        if self.max_t < 1 or not 1 <= self.grace_period <= self.max_t:
            raise ValueError(f"max_t={self.max_t}, grace_period={self.grace_period} are not allowed; "
                             "need 1 <= grace_period <= max_t")
        if not self.reduction_factor > 1:
            raise ValueError(f"reduction_factor={self.reduction_factor} is not allowed; it must be > 1")
        return self


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

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        empty = [k for k, values in v.items() if not values]
        if empty:
            raise ValueError(f"axis {empty[0]!r} has no values: give at least one (or remove the axis)")
        return v

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names = [str(var["name"]) for var in v if "name" in var]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"variant name(s) {twice} appear more than once: each variant needs its own name")
        return v

    @field_validator("max_concurrent", "max_failures")
    @classmethod
    def _count(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"{v} is not allowed; it must be >= 0 (max_concurrent 0: no limit)")
        return v


class Resources(Strict):
    cpu: float = 1.0
    gpu: float = 0.0

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, v: float) -> float:
        if not 0 < v < math.inf:
            raise ValueError(f"{v} is not allowed; a trial needs cpu > 0 (e.g. 1, or 0.5 to share a core)")
        return v

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: float) -> float:
        if not 0 <= v < math.inf:  # NaN too: Ray would wait forever for a NaN GPU
            raise ValueError(f"{v} is not allowed; it must be >= 0 (a fraction such as 0.5 shares one GPU)")
        return v


class TrackingSpec(Strict):
    """Live tracking through Ray Tune's logger callbacks (study/tracking.py); off unless asked for."""

    tensorboard: bool = False
    mlflow: bool | str = False  # true: an SQLite store in the results root; or a tracking URI (http://..., sqlite:)
    wandb: bool | Literal["offline", "online"] = False  # true = offline (no account needed; `wandb sync` later)
    project: str | None = None  # MLflow's experiment and W&B's project; default: the study's name

    @field_validator("mlflow")
    @classmethod
    def _mlflow(cls, v: bool | str) -> bool | str:
        if isinstance(v, str) and ":" not in v:
            raise ValueError(f"{v!r} is not allowed; give true (an SQLite store beside the results) or a tracking "
                             "URI such as http://HOST:5000 or sqlite:///path/mlflow.db")
        return v

    @property
    def any(self) -> bool:
        return bool(self.tensorboard or self.mlflow or self.wandb)


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
    tracking: TrackingSpec = TrackingSpec()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            return check_study_name(v)
        except ConfigError as e:
            raise ValueError(str(e)) from None

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

    @property
    def spec_hash(self) -> str:
        """The version of what the study runs: its base trial and sweep (not its description, storage, resources,
        concurrency or sample count). Every trial row keeps it; the trials of an Optuna search are those run
        under the current version (study.membership)."""
        sweep = self.spec.sweep.model_dump(exclude={"max_concurrent", "max_failures"})
        if sweep.get("optuna"):
            for where_and_how_many in ("num_samples", "storage"):
                sweep["optuna"].pop(where_and_how_many, None)
        text = json.dumps({**self.spec.base(), "sweep": sweep}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def optuna_storage(self, root: str) -> str:
        """Where this search's Optuna study lives under the results root `root` (study/optuna_storage.py)."""
        return storage_location(self.spec.sweep.optuna.storage, root, self.name)


def _with(base: dict[str, Any], overrides: dict[str, Any], source: str = "<spec>") -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in overrides.items():
        try:
            set_dotted(out, k, v)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
    return out


def grid_points(sweep: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of grid values x variants x seeds, as dotted overrides (a named variant sets `label`)."""
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


def resolve_spec_paths(data: dict[str, Any], base: Path) -> None:
    """Data-file paths anywhere in a spec (base sections, grid axes, variants) made absolute against the spec's
    folder, in place; the saved copy of the spec (status, resume) then finds them from anywhere."""
    resolve_data_paths(data, base)
    sweep = data.get("sweep")
    if not isinstance(sweep, dict):
        return
    optuna = sweep.get("optuna")
    if isinstance(optuna, dict) and isinstance(optuna.get("storage"), str) and not is_uri(optuna["storage"]):
        optuna["storage"] = str(base / Path(optuna["storage"]).expanduser())  # a journal file beside the spec
    keys = {f"{section}.{name}" for section, name in DATA_FILES}
    grid = sweep.get("grid")
    if isinstance(grid, dict):
        for k in keys & set(grid):
            if isinstance(grid[k], list):
                grid[k] = [absolute_data_path(v, base) for v in grid[k]]
    variants = sweep.get("variants")
    for var in variants if isinstance(variants, list) else []:  # malformed sections are refused by validation
        if isinstance(var, dict):
            for k in keys & set(var):
                var[k] = absolute_data_path(var[k], base)


def load_study(path: str | Path, overrides: list[str] | None = None) -> Study:
    """Read and validate a spec; expand grid studies to their trials. Raises ConfigError naming file and key."""
    data = merge(load_yaml(path), parse_overrides(overrides or []))
    resolve_spec_paths(data, Path(path).resolve().parent)
    return study_from_data(data, str(path))


def _saved_data(store, name: str) -> tuple[dict[str, Any], str]:
    """(the saved spec's data, where it is) for a study; ConfigError when the store has no such study."""
    text = store.get_text(spec_file(name))
    if text is None:
        known = ", ".join(store.studies()) or "none"
        raise ConfigError(f"no study named {name!r} was run with results in {store.uri} (studies there: {known})")
    source = f"{store.uri}/{spec_file(name)}"
    data = yamltext.parse(text, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    return data, source


def load_saved_study(store, name: str) -> Study:
    """The spec a study was run with, as saved beside its results (`<root>/_studies/<name>.yaml`; its data paths
    are already absolute), expanded to its trials. ConfigError when the store has no such study."""
    return study_from_data(*_saved_data(store, name))


def saved_spec(store, name: str) -> Study:
    """The saved spec validated as a spec only (its trials not resolved: that needs the data files it names)."""
    data, source = _saved_data(store, name)
    try:
        return Study(StudySpec.model_validate(data), source, data)
    except ValidationError as e:
        raise ConfigError(describe_error(e, source, StudySpec)) from None


def study_from_data(data: dict[str, Any], source: str) -> Study:
    """Validate a spec's data (read from `source`) and expand grid studies to their trials."""
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_error(e, source, StudySpec)) from None
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
        if sweep.optuna.storage is not None:
            check_location(sweep.optuna.storage, source)
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
        checked = [build_trial(_with(base, {**sample, "seed": sweep.seeds[0]}, source),
                               f"{source} (optuna space point {sample})") for sample in samples]
        check_data(checked, source)
        return study
    seen = set()
    points = grid_points(sweep)
    configs = []
    for over in points:
        for k in over:
            if k not in ("seed", "label") and k.split(".")[0] not in ("task", "model", "train", "eval"):
                raise ConfigError(f"{source}: sweep key {k!r} must start with task., model., train. or eval.")
        cfg = build_trial(_with(base, over, source), f"{source} (sweep point {over})")
        configs.append(cfg)
        tid = trial_id(cfg)
        if tid not in seen:  # two points that resolve to the same config run once
            seen.add(tid)
            study.trials.append(cfg)
    check_sweep_reads(points, configs, source)
    check_data(study.trials, source)
    return study


def check_sweep_reads(points: list[dict[str, Any]], configs: list[TrialConfig], source: str) -> None:
    """Refuse a sweep that cannot change what it claims to (study.config.reads): a swept key that no trial it is
    set in reads, and two sweep points that differ only in keys they do not read (the same trial twice, under two
    names or settings)."""
    swept = sorted({k for over in points for k in over} - {"seed", "label"})
    for key in swept:
        why = [unread(cfg, key) for cfg, over in zip(configs, points) if key in over]
        if why and all(why):
            raise ConfigError(f"{source}: sweep key {key} is never read: {why[0]}, so its values cannot change any "
                              "trial. Remove it, or sweep it together with what makes it matter")
    same: dict[str, tuple[dict[str, Any], str]] = {}
    for cfg, over in zip(configs, points):
        idle = unread_fields(cfg, [k for k in swept if k in over])
        key, tid = trial_id(cfg, leave_out=tuple(idle)), trial_id(cfg)
        if key in same and same[key][1] != tid:
            first = {k: v for k, v in same[key][0].items() if k != "seed"}
            raise ConfigError(
                f"{source}: sweep points {first} and {({k: v for k, v in over.items() if k != 'seed'})} are the same "
                f"trial: {', '.join(f'{k} is not read ({w})' for k, w in idle.items())}. Drop one, or use "
                "sweep.variants to pair each value with what reads it")
        same.setdefault(key, (over, tid))
