"""A trial in words, as the driver's progress lines and the trackers' run names say it: a named variant by its name,
an unnamed grid point by its swept values (`rule=carry_last`), an Optuna sample by its picks (`lr=0.00316`); keys
by their last dotted part, floats to 3 significant digits. Torch- and Ray-free."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from study.spec.schema import SweepSpec


def swept_keys(sweep: SweepSpec) -> list[str]:
    """The dotted keys a grid point sets besides its seed: the grid's axes, then the variants' keys."""
    keys = list(sweep.grid)
    for var in sweep.variants or []:
        keys += [k for k in var if k != "name" and k not in keys]
    return keys


def value(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def float_labels(values: Sequence[float], at_least: int = 3) -> dict[float, str]:
    """Each value in the fewest significant digits (at least `at_least`) that keep the distinct values apart:
    the labels of a study's settings (an Optuna sample's lr=0.00104, not 0.0010426094533788973)."""
    distinct = sorted(set(values))
    for digits in range(at_least, 18):
        labels = {v: f"{v:.{digits}g}" for v in distinct}
        if len(set(labels.values())) == len(distinct):
            return labels
    return {v: repr(v) for v in distinct}


def picks(values: dict[str, Any]) -> str:
    """`key=value,...` of dotted keys (an Optuna sample's picks, a grid point's values); '' when there are none."""
    return ",".join(f"{k.rsplit('.', 1)[-1]}={value(v)}" for k, v in values.items())


def setting(flat: dict[str, Any], swept: Sequence[str]) -> str:
    """A grid point's setting from its flat config (dotted keys): its variant's name, else its swept values."""
    return str(flat.get("label") or "") or picks({k: flat.get(k) for k in swept if k in flat})
