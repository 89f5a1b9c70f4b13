"""Plugins by entry point: carry rules (group `loopstudy.carry_rules`) and tasks (`loopstudy.tasks`).

A distribution registers a part under a name in its metadata, as loopstudy registers its own (pyproject.toml):

    [project.entry-points."loopstudy.carry_rules"]
    momentum = "loopstudy_example.momentum:RULE"        # a study.config.rules.CarryRuleDef
    [project.entry-points."loopstudy.tasks"]
    reverse = "loopstudy_example.reverse:TASK"          # a study.tasks.base.TaskDef

Built-ins and plugins are found the same way (`discover`); a built-in is a part whose distribution is loopstudy
itself. What each contract holds is stated once with its definition class (CarryRuleDef, TaskDef) and in
docs/extending.md. A part that fails to load, or loads as something else than its group's definition, is kept aside
with its one-line reason (`Found.broken`): naming it in a spec refuses the spec with that line; a study that does
not name it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from study.errors import first_line

GROUPS = {"carry_rules": "loopstudy.carry_rules", "tasks": "loopstudy.tasks"}
OWN = "loopstudy"  # the distribution whose parts are the built-ins


@dataclass(frozen=True)
class Plugin:
    """Where a part comes from: its entry point ("module:attr"), distribution and version."""

    group: str
    name: str
    value: str
    dist: str
    version: str

    @property
    def builtin(self) -> bool:
        return self.dist == OWN

    @property
    def pin(self) -> str:
        """`dist==version`, what a trial's identity holds of an outside plugin."""
        return f"{self.dist}=={self.version}"

    @property
    def where(self) -> str:
        """How an error names it: its name, entry point and distribution."""
        return f"plugin {self.name!r} (entry point {self.group}: {self.name} = {self.value}, from {self.pin})"


@dataclass
class Found:
    """One group's parts: the loaded definitions by name, where each came from, and the broken ones' reasons."""

    parts: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, Plugin] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)


def discover(kind: str, expect: type) -> Found:
    """Every entry point of GROUPS[kind], loaded and checked to be an `expect` whose `name` is its entry name."""
    group = GROUPS[kind]
    found = Found()
    for ep in sorted(metadata.entry_points(group=group), key=lambda e: (e.dist.name != OWN if e.dist else True,
                                                                        e.name)):
        dist = ep.dist.name if ep.dist is not None else "?"
        origin = Plugin(group, ep.name, ep.value, dist, ep.dist.version if ep.dist is not None else "?")
        where = origin.where
        if ep.name in found.origin:  # the first registration keeps the name (loopstudy's own come first)
            found.broken.setdefault(f"{ep.name} ({dist})", f"{where} takes a name that {found.origin[ep.name].dist} "
                                                           "registers already; rename it")
            continue
        try:
            part = ep.load()
        except Exception as e:  # noqa: BLE001 - any import error of someone else's code is reported, not raised
            found.broken[ep.name] = f"{where} does not import: {type(e).__name__}: {first_line(e)}"
            continue
        if not isinstance(part, expect):
            found.broken[ep.name] = f"{where} is a {type(part).__name__}, not a {expect.__name__}"
        elif part.name != ep.name:
            found.broken[ep.name] = f"{where} defines the name {part.name!r}; the entry point's name must match"
        else:
            found.parts[ep.name], found.origin[ep.name] = part, origin
    return found


def set_aside_clashes(found: Found, fields: Callable[[Any], dict[str, Any]], common: set[str], prefix: str) -> None:
    """Move (in place) to `found.broken` every outside part whose settings take a common key or declare a key that an
    earlier part declares differently (one key, one meaning): a plugin's clash must not break loopstudy. `fields`
    maps a part to {key: (type, default)}. Built-ins that clash are left for the section's builder to raise."""
    taken: dict[str, tuple[Any, str]] = {}
    for name in list(found.parts):
        own = fields(found.parts[name])
        clash = next((k for k, spec in own.items() if k in common or (k in taken and taken[k][0] != spec)), None)
        origin = found.origin[name]
        if clash is not None and not origin.builtin:
            whose = "a common setting" if clash in common else f"declared differently by {taken[clash][1]!r}"
            found.broken[name] = (f"{origin.where} declares {prefix}{clash}, {whose}; a shared key must mean one "
                                  "thing: rename it")
            del found.parts[name], found.origin[name]
            continue
        for key, spec in own.items():
            taken.setdefault(key, (spec, name))



def node_report(wanted: list[tuple[str, str]]) -> dict[str, str]:
    """On this machine, for each (group, name): `dist==version` when its entry point is installed and loads, else
    why not (run on every node by the cluster preflight, study.run.preflight)."""
    out = {}
    for group, name in wanted:
        ep = next((e for e in metadata.entry_points(group=group) if e.name == name), None)
        if ep is None:
            out[f"{group}:{name}"] = "not installed"
            continue
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - someone else's code: its error, in one line
            out[f"{group}:{name}"] = f"does not import ({type(e).__name__}: {first_line(e)})"
            continue
        out[f"{group}:{name}"] = f"{ep.dist.name}=={ep.dist.version}" if ep.dist is not None else "?"
    return out
