"""Reading configs: YAML files, dotted key=value overrides, validation with one line per problem, data-file paths
made absolute against the file that names them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import TypeAdapter, ValidationError

from study.config import yamltext
from study.config.identity import DATA_FILES
from study.config.schema import TrialConfig
from study.errors import ConfigError
from study.paths import is_uri


def set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for i, p in enumerate(parts[:-1]):
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            section = ".".join(parts[:i + 1])
            raise ConfigError(f"{key}: {section} is a section (a mapping of keys), but it is set to {d!r}")
    d[parts[-1]] = value


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


def broken_part(key: str, value: Any) -> str | None:
    """Why the plugin a spec names at model.carry.rule / task.name did not load (None: no broken one by that name)."""
    from study.config.rules import FOUND as RULES_FOUND
    from study.tasks import FOUND as TASKS_FOUND

    found = {"model.carry.rule": RULES_FOUND, "task.name": TASKS_FOUND}.get(key)
    if found is None or not isinstance(value, str):
        return None
    return next((why for name, why in found.broken.items() if name.split(" ")[0] == value), None)


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
        elif e["type"] == "literal_error" and broken_part(key, e.get("input")):
            msg = broken_part(key, e.get("input"))  # a plugin by that name is installed, and did not load
        elif e["type"] == "literal_error" and "expected" in e.get("ctx", {}):
            msg = f"{yamltext.quote(e.get('input'))} is not allowed; allowed: {e['ctx']['expected']}"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if len(msg) > 4 * yamltext.MAX_QUOTE:  # a value's whole size is never printed
            msg = msg[:4 * yamltext.MAX_QUOTE] + f"... ({len(msg):,} characters)"
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
        key = k.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {yamltext.quote(pair)}: {yamltext.quote(key)} is not a dotted key "
                              "(e.g. model.carry.rule)")
        set_dotted(out, key, yamltext.parse(v, f"override {key}"))
    return out


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A spec or config file as a mapping (study.config.yamltext: bounded, UTF-8, no key twice)."""
    data = yamltext.read(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def absolute_data_path(value: Any, base: Path) -> Any:
    """A relative data-file path made absolute against `base`, the folder of the file that names it: Ray runs
    trials in another working folder, so a path relative to the shell's folder would not be found there."""
    if isinstance(value, str) and value and not is_uri(value):
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


def check_data(configs: list[TrialConfig], source: str) -> None:
    """The task data files the configs read, read once each up front (study.tasks.loader.check_data_files); a
    problem is a ConfigError naming `source`, the data file and its line."""
    from study.errors import DataError
    from study.tasks.loader import check_data_files  # reads CSVs: only when a config names one

    try:
        check_data_files([c.task for c in configs])
    except DataError as e:
        raise ConfigError(f"{source}: {e}") from None
