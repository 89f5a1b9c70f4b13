"""What one Tune trial does (a WorkItem): train a config and/or take readings of trained weights. A Reading is one
evaluation of a trial's weights (the final ones or a checkpoint's) under an eval section; it is stored as a trial
of its own. Torch-free: the driver plans with these (study.run.plan) and each trial runs them (study.trial.execute).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from study.config import TrialConfig, build_trial, reading_id, to_dict


@dataclass(frozen=True)
class Reading:
    """One evaluation of stored weights: the full config it runs under and the training step of the weights it
    reads (None: the final ones)."""

    cfg: TrialConfig
    step: int | None = None

    @property
    def tid(self) -> str:
        return reading_id(self.cfg, self.step)

    def to_json(self) -> dict[str, Any]:
        return {"config": to_dict(self.cfg), "step": self.step}

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> Reading:
        return cls(build_trial(data["config"], source), data.get("step"))


@dataclass
class WorkItem:
    """What one Tune trial does: train `train` (None: nothing to train) and then evaluate `readings` from the
    trained weights: those it just trained, else the stored ones of trial `weights_of`."""

    train: TrialConfig | None
    weights_of: str | None = None
    readings: list[Reading] = field(default_factory=list)

    @property
    def first(self) -> TrialConfig:
        """The config that names this item (progress lines, trackers): the trained one, else the first reading's."""
        return self.train if self.train is not None else self.readings[0].cfg

    def to_json(self) -> str:
        """As Tune's grid carries it: the named config's dict (as for a plain trial) plus the work's own keys."""
        return json.dumps({**to_dict(self.first), "_weights_of": self.weights_of, "_trains": self.train is not None,
                           "_readings": [r.to_json() for r in self.readings]})


def work_from_json(data: dict[str, Any], source: str) -> tuple[dict[str, Any], bool, str | None, list[Reading]]:
    """(the plain config dict, whether it trains, weights_of, readings) from a grid item; a plain trial (an Optuna
    sample, a grid item of an earlier driver) trains and reads nothing else."""
    if "_readings" not in data:
        return data, True, None, []
    data = dict(data)
    trains, weights_of = data.pop("_trains"), data.pop("_weights_of")
    return data, trains, weights_of, [Reading.from_json(r, source) for r in data.pop("_readings")]


def kept_steps(row: dict) -> dict[int, str]:
    """{training step: sha256} of the checkpoint weights a trial's row says it kept (train.keep_checkpoints)."""
    return {int(k): v for k, v in json.loads(row.get("checkpoints") or "{}").items()}
