"""The shape of a study spec (one YAML file), as pydantic models: what each section may hold, checked field by
field; the trial sections (task, model, train, eval) are checked as trial configs by study.config. Loading and
expanding a spec into trials is study/spec/study.py."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, WithJsonSchema, field_validator, model_validator

from study.errors import ConfigError
from study.metrics import DEFAULT_METRIC, SEARCH_METRICS, MetricName, SearchMetric
from study.store.names import check_study_name


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OptunaParam(Strict):
    # uniform, loguniform, int (low..high) or choice (values)
    type: Literal["uniform", "loguniform", "int", "choice"]
    # the range's lower end
    low: float | None = None
    # the range's upper end
    high: float | None = None
    # a choice's values
    values: list[Any] | None = None

    def check(self, key: str) -> None:
        if self.type == "choice":
            if not self.values:
                raise ValueError(f"sweep.optuna.space.{key}: type choice needs a non-empty 'values' list")
        elif self.low is None or self.high is None or not self.low < self.high:
            raise ValueError(f"sweep.optuna.space.{key}: type {self.type} needs low < high")
        elif self.type == "loguniform" and self.low <= 0:
            raise ValueError(f"sweep.optuna.space.{key}: loguniform needs low > 0")


Mode = Literal["max", "min"]


def one_or_more(allowed: tuple[str, ...]) -> WithJsonSchema:
    """The JSON Schema of a field that takes one name or a list of them (read as a list: OptunaSpec._one_or_more)."""
    one = {"enum": list(allowed), "type": "string"}
    return WithJsonSchema({"anyOf": [one, {"items": one, "minItems": 1, "type": "array"}]})
SAMPLERS = ("tpe", "nsga2", "gp")  # Optuna's TPESampler, NSGAIISampler, GPSampler: each takes one or more objectives


class Limit(Strict):
    """A constraint on a trial metric: feasible when min <= value <= max (either end may be left open)."""

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _check(self) -> Limit:
        if self.min is None and self.max is None:
            raise ValueError("a constraint needs min, max or both, e.g. {min: 0.9}")
        if self.min is not None and self.max is not None and not self.min <= self.max:
            raise ValueError(f"min {self.min} > max {self.max}: no trial could satisfy it")
        return self

    def violation(self, value: float) -> float:
        """Optuna's constraint value (feasible when <= 0): how far `value` is outside [min, max]."""
        return max(self.min - value if self.min is not None else -math.inf,
                   value - self.max if self.max is not None else -math.inf)


class OptunaSpec(Strict):
    """An Optuna search. One objective (`metric: final_exact_acc`, `mode: max`) or several, in Ray Tune's
    convention: `metric` and `mode` as lists of the same length (`[final_exact_acc, final_flops]`, `[max, min]`).
    sampler: Optuna's sampler, tpe (default), nsga2 or gp; each takes one objective or several. constraints: metric
    -> {min, max}; Optuna's samplers prefer trials that meet them (`Trial.set_constraint`), and the Pareto front
    counts only those."""

    metric: Annotated[list[SearchMetric], one_or_more(SEARCH_METRICS)] = [DEFAULT_METRIC]  # a name: a list of one
    # max or min per metric (a list when metric is a list)
    mode: Annotated[list[Mode], one_or_more(("max", "min"))] = ["max"]
    sampler: Literal[SAMPLERS] = "tpe"  # type: ignore[valid-type]
    constraints: dict[MetricName, Limit] = {}  # type: ignore[valid-type]
    # samples the search runs in all (a run again continues to this many)
    num_samples: int = 8
    # dotted trial key -> its range or choices
    space: dict[str, OptunaParam]
    storage: str | None = None  # the Optuna study's storage: a journal file or an RDB URL (study/run/optuna_storage.py)

    @field_validator("metric", "mode", mode="before")
    @classmethod
    def _one_or_more(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @property
    def metrics(self) -> list[str]:
        """The objectives, first the one progress lines and the trials table's `objective` show."""
        return list(self.metric)

    @property
    def modes(self) -> list[str]:
        return list(self.mode)

    @property
    def multi(self) -> bool:
        return len(self.metrics) > 1

    @model_validator(mode="after")
    def _objectives(self) -> OptunaSpec:
        metrics, modes = self.metrics, self.modes
        if not metrics:
            raise ValueError("metric: give at least one objective")
        if len(metrics) != len(modes):
            raise ValueError(f"metric {metrics} and mode {modes} must match one to one ({len(metrics)} metric(s), "
                             f"{len(modes)} mode(s)), e.g. metric: [final_exact_acc, final_flops], mode: [max, min]")
        twice = sorted({m for m in metrics if metrics.count(m) > 1})
        if twice:
            raise ValueError(f"metric {twice[0]} is given twice: each objective once")
        return self

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

    # the last rung, in training steps
    max_t: int = 100
    # training steps before the first rung
    grace_period: int = 10
    # rungs at grace_period * reduction_factor^k; the share kept at each
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
    # dotted key -> values: every combination is a setting
    grid: dict[str, list[Any]] = {}
    # named settings, each a mapping of dotted keys (and `name`) over the base
    variants: list[dict[str, Any]] = []
    # every setting runs once per seed (data and initial weights shared seed by seed)
    seeds: list[int] = [0]
    # an Optuna search instead of a grid (see the sweep.optuna keys)
    optuna: OptunaSpec | None = None
    # early stopping of the weaker trials on the training signal
    asha: AshaSpec | None = None
    # trials at once (0: as many as the cluster places)
    max_concurrent: int = 0
    max_failures: int = 2  # retries of a trial whose worker or node died (resumes from its last checkpoint)

    @model_validator(mode="after")
    def _asha_objectives(self) -> SweepSpec:
        if self.asha is not None and self.optuna is not None and self.optuna.multi:
            raise ValueError("asha with several objectives: ASHA stops trials by one ranking and a Pareto search "
                             "has none; remove sweep.asha or search one metric")
        return self

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
    # CPUs per trial, per worker when several train it (a fraction shares one)
    cpu: float = 1.0
    # GPUs per trial, per worker when several train it: at most 1 (0.5: two trials share one GPU)
    gpu: float = 0.0
    # data-parallel workers per trial (Ray Train inside the Tune trial; train.batch_size stays the global batch)
    workers: int = 1

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
        if v > 1:  # a worker trains on one device: more than one would sit idle
            raise ValueError(f"{v:g} is not allowed; a worker trains on one GPU (at most 1). To train a trial on "
                             f"{v:g} GPUs, set resources.gpu: 1 and resources.workers: {math.ceil(v)}")
        return v

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"{v} is not allowed; a trial needs at least 1 worker")
        return v

    @model_validator(mode="after")
    def _whole_gpu_per_worker(self) -> Resources:
        # NCCL gives each rank its own device: two workers of one trial cannot share a GPU
        if self.workers > 1 and 0 < self.gpu < 1:
            raise ValueError(f"resources.gpu={self.gpu:g} with resources.workers={self.workers}: each data-parallel "
                             f"worker needs a whole GPU. Set resources.gpu: 1 (or resources.workers: 1 to share "
                             f"a GPU between trials)")
        return self


class TrackingSpec(Strict):
    """Live tracking through Ray Tune's logger callbacks (study/run/tracking.py); off unless asked for."""

    # TensorBoard event files in <store>/_tune/STUDY
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
    # the study: its trials, rows, figures and Optuna study go by this name
    name: str
    # one line about the study
    description: str = ""
    # the base trial's task section (see task.* below)
    task: dict[str, Any] = {}
    # the base trial's model section (model.*)
    model: dict[str, Any] = {}
    # the base trial's training section (train.*)
    train: dict[str, Any] = {}
    # the base trial's evaluation section (eval.*)
    eval: dict[str, Any] = {}
    # what varies across trials
    sweep: SweepSpec = SweepSpec()
    # what one trial asks of the cluster
    resources: Resources = Resources()
    # the results root: a path, an NFS path or s3://bucket/prefix (--store overrides it)
    storage: str = "results"
    # live tracking (TensorBoard, MLflow, W&B), off unless asked for
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
