"""Allowed ranges of config values, declared beside each field (`Annotated[int, Bound(ge=1)]`) and checked by one
function, so every range refusal reads the same: `<section>.<field>=<value> is not allowed; it must ...`.

Every number must also be finite: `.inf` or `.nan` from YAML would train to a NaN loss and be stored as if it
were a result.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

# The deepest test-time rollout a config may ask for: 4x the papers' 24,960 layers. A typo such as 10**9 layers
# would otherwise run for weeks before anyone noticed.
MAX_DEPTH_LAYERS = 100_000


@dataclass(frozen=True)
class Bound:
    """ge/gt: lower bound (inclusive/exclusive); le/lt: upper bound. most: loopstudy's sanity bound on a size, far
    above any study here or in the papers (9x9 sudoku, hidden 512, ~65k steps of batch 768), low enough that a typo
    fails at once instead of running out of memory or time."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    most: int | None = None

    def __get_pydantic_json_schema__(self, core_schema, handler) -> dict:
        """The range in a field's JSON Schema (the spec schema an editor validates with): on the number, or on every
        number of a list or tuple."""
        schema = handler(core_schema)
        limits = {k: v for k, v in (("minimum", self.ge), ("exclusiveMinimum", self.gt), ("maximum", self.le),
                                    ("exclusiveMaximum", self.lt)) if v is not None}
        if self.most is not None:
            limits.setdefault("maximum", self.most)

        def put(node: Any) -> None:
            if isinstance(node, dict):
                if node.get("type") in ("integer", "number"):
                    node.update(limits)
                for key in ("items", "prefixItems", "anyOf"):
                    for child in node.get(key, []) if isinstance(node.get(key), list) else [node.get(key)]:
                        put(child)

        put(schema)
        return schema

    def allows(self, v: float) -> bool:
        return ((self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le) and (self.lt is None or v < self.lt))

    def describe(self) -> str:
        lo = ("[", self.ge) if self.ge is not None else ("(", self.gt) if self.gt is not None else None
        hi = (self.le, "]") if self.le is not None else (self.lt, ")") if self.lt is not None else None
        if lo and hi:
            return f"it must lie in {lo[0]}{lo[1]:g}, {hi[0]:g}{hi[1]}"
        if lo:
            return f"it must be {'>=' if lo[0] == '[' else '>'} {lo[1]:g}"
        return f"it must be {'<=' if hi[1] == ']' else '<'} {hi[0]:g}"


def _numbers(v: Any) -> list[float]:
    if isinstance(v, bool):
        return []
    if isinstance(v, int | float):
        return [v]
    if isinstance(v, list | tuple):
        return [x for item in v for x in _numbers(item)]
    return []


def _bounds(hint: Any) -> list[Bound]:
    """The Bounds declared on a field's annotation, also inside `Optional[Annotated[...]]`."""
    found = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Bound)]
    for arg in typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else ():
        found += _bounds(arg)
    return found


def check_bounds(prefix: str, obj: Any) -> None:
    """Every field of the config dataclass `obj` within its declared Bound, every number finite; ValueError naming
    `<prefix>.<field>`, the value and what is allowed. None (unset) is not checked."""
    hints = typing.get_type_hints(type(obj), include_extras=True)
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if v is None:
            continue
        if any(not math.isfinite(x) for x in _numbers(v)):
            raise ValueError(f"{prefix}.{f.name}={v} is not allowed; give a finite number")
        for bound in _bounds(hints[f.name]):
            for x in _numbers(v):
                if not bound.allows(x):
                    raise ValueError(f"{prefix}.{f.name}={v} is not allowed; {bound.describe()}")
                if bound.most is not None and x > bound.most:
                    raise ValueError(f"{prefix}.{f.name}={v} is not allowed; at most {bound.most:,} "
                                     "(loopstudy's sanity bound)")

