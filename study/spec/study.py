"""Study specs: one YAML file -> validated StudySpec -> the list of resolved trial configs (or an Optuna space).

A spec holds a base trial (sections task/model/train/eval, as for `loopstudy trial`) and a `sweep`:
  grid:      {dotted.key: [values, ...]}          cartesian product
  variants:  [{name: ..., dotted.key: value}, ...] named bundles of overrides (non-cartesian points)
  seeds:     [0, 1, 2]
  optuna:    {metric, mode, num_samples, space: {dotted.key: {type: uniform|loguniform|int|choice, ...}}}
  asha:      {max_t, grace_period, reduction_factor}
  max_concurrent: N
plus `resources: {cpu, gpu}` per trial, `storage` (results root) and `tracking` (study.spec.schema holds the
shape). Every problem is reported before any trial starts, naming the file, the dotted key and the allowed values.
Torch-free and Ray-free.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from study.config import (
    DATA_FILES,
    TrialConfig,
    absolute_data_path,
    build_trial,
    check_data,
    describe_error,
    load_yaml,
    merge,
    parse_overrides,
    resolve_data_paths,
    set_dotted,
    trial_id,
    yamltext,
)
from study.config.usage import TASK_BOUND, unread, unread_fields
from study.errors import ConfigError
from study.metrics import DEFAULT_METRIC, METRICS
from study.paths import is_uri
from study.plugins import Plugin
from study.spec.optuna_location import check_location, storage_location
from study.spec.plugins import check_plugins, used_plugins
from study.spec.schema import OptunaParam, StudySpec, SweepSpec
from study.store.layout import spec_file
from study.trial.start import check_init_from, resolve_init_from


@dataclass
class Study:
    """A validated spec and what it expands to."""

    spec: StudySpec
    source: str
    data: dict[str, Any] = field(default_factory=dict)  # the spec as read, overrides applied
    trials: list[TrialConfig] = field(default_factory=list)  # grid studies: every resolved trial
    plugins: list[Plugin] = field(default_factory=list)  # the outside plugins its trials run (study.spec.plugins)

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
        under the current version (study.spec.membership)."""
        sweep = self.spec.sweep.model_dump(exclude={"max_concurrent", "max_failures"})
        if sweep.get("optuna"):
            for key in ("num_samples", "storage"):  # how many samples and where they are kept: not what runs
                sweep["optuna"].pop(key, None)
            search = sweep["optuna"]
            if len(search["metric"]) == 1:  # one objective hashes as its name: the version stored searches carry
                search["metric"], search["mode"] = search["metric"][0], search["mode"][0]
            for key, plain in (("sampler", "tpe"), ("constraints", {})):  # their defaults: the search as it ran
                if search.get(key) == plain:
                    search.pop(key)
        text = json.dumps({**self.spec.base(), "sweep": sweep}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def optuna_storage(self, root: str) -> str:
        """Where this search's Optuna study lives under the results root `root` (study/run/optuna_storage.py)."""
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


def resolve_spec_paths(data: dict[str, Any], base: Path, source: str = "<spec>", store_root: str | None = None) -> None:
    """Data-file paths anywhere in a spec (base sections, grid axes, variants) made absolute against the spec's
    folder, in place; the saved copy of the spec (status, resume) then finds them from anywhere. model.init_from
    completes the model keys (a stored trial's in `store_root`, else in the spec's storage)."""
    resolve_data_paths(data, base)
    storage = data.get("storage") if isinstance(data.get("storage"), str) else None
    resolve_init_from(data, base, source, store_root or storage)
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


def load_study(path: str | Path, overrides: list[str] | None = None, *, store_root: str | None = None) -> Study:
    """Read and validate a spec; expand grid studies to their trials. Raises ConfigError naming file and key.
    store_root: the results root it runs against (model.init_from STUDY/TRIAL_ID reads its trial there)."""
    data = merge(load_yaml(path), parse_overrides(overrides or []))
    resolve_spec_paths(data, Path(path).resolve().parent, str(path), store_root)
    return study_from_data(data, str(path))


def load_trial_file(path: str | Path, overrides: list[str] | None = None, *,
                    store_root: str | None = None) -> TrialConfig:
    """`loopstudy trial`'s config: a trial file (sections task/model/train/eval/seed) plus key=value overrides, its
    data files and model.init_from's checkpoint (or stored trial, in `store_root`) read against the file's folder
    and checked as a spec's are."""
    data = merge(load_yaml(path), parse_overrides(overrides or []))
    base = Path(path).resolve().parent
    resolve_init_from(resolve_data_paths(data, base), base, str(path), store_root)
    cfg = build_trial(data, str(path))
    check_data([cfg], str(path))
    check_init_from([cfg], str(path))
    check_plugins([cfg], str(path))
    return cfg


def _saved_data(store, name: str) -> tuple[dict[str, Any], str]:
    """(the saved spec's data, where it is) for a study; ConfigError when the store has no such study."""
    text = store.get_text(spec_file(name))
    if text is None:
        studies = store.studies()
        if name in studies:
            raise ConfigError(f"study {name!r} has results in {store.uri} but not the spec it was run with "
                              f"({spec_file(name)}, which `loopstudy run` saves beside them); put the spec there")
        known = ", ".join(studies) or "none"
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
        study.plugins = check_configs(data, checked, source)
        for key, metrics in (("sweep.optuna.metric", sweep.optuna.metrics),
                             ("sweep.optuna.constraints", sweep.optuna.constraints)):
            for metric in metrics:
                check_metric_applies(metric, checked, source, key)
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
    study.plugins = check_configs(data, configs, source)
    return study


def check_configs(data: dict[str, Any], configs: list[TrialConfig], source: str) -> list[Plugin]:
    """What the resolved trials of a spec (or an Optuna search's corners) must hold before any runs: keys set that
    none reads, the task data files they name, the checkpoint they start from (study.trial.start), and the outside
    plugins they run (study.spec.plugins), which it returns."""
    check_base_reads(data, configs, source)
    check_data(configs, source)
    check_init_from(configs, source)
    check_plugins(configs, source)
    return used_plugins(configs)


def check_base_reads(data: dict[str, Any], configs: list[TrialConfig], source: str) -> None:
    """Refuse a key the spec sets that only the task decides whether to read (study.config.usage.TASK_BOUND) when
    no trial reads it: e.g. train.puzzle_lr on a task without a puzzle embedding."""
    for key in sorted(TASK_BOUND):
        section, _, field_ = key.partition(".")
        if field_ not in (data.get(section) or {}):
            continue
        why = [unread(cfg, key) for cfg in configs]
        if why and all(why):
            raise ConfigError(f"{source}: {key} is set but never read: {why[0]}, so it cannot change any trial. "
                              "Remove it")


def check_metric_applies(metric: str, configs: list[TrialConfig], source: str, key: str = "sweep.optuna.metric",
                         ) -> None:
    """A search's objective or constraint must be one every trial reports (ARC's pass@2 exists for task arc only)."""
    task = METRICS[metric].task
    other = next((c.task.name for c in configs if task and c.task.name != task), None)
    if other:
        raise ConfigError(f"{source}: {key} {metric} is task {task}'s only; this search's task is "
                          f"{other!r}: no trial would report it (use {DEFAULT_METRIC})")


def check_sweep_reads(points: list[dict[str, Any]], configs: list[TrialConfig], source: str) -> None:
    """Refuse a sweep that cannot change what it claims to (study.config.usage): a swept key that no trial it is
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
