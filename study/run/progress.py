"""The driver's progress lines while a study runs: one per trial started / finished / failed / retried, and at most
every STATUS_EVERY_S one saying what each running trial is doing (`train 40%`, `eval 12%`). A Ray Tune Callback;
imports Ray, so the driver imports it only when it builds a Tuner (study.run.tuner)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence

from ray.tune import Callback

from study.config import flatten
from study.console import eprint
from study.run.naming import picks, setting

STATUS_EVERY_S = 30.0  # the driver prints what the running trials are doing at most this often


def describe(config: dict, swept: Sequence[str] = ()) -> str:
    """A trial in words, from the config Tune hands it: its setting (its variant's name, else its values of the
    `swept` keys) and seed (a grid point), or its Optuna picks (study.run.naming)."""
    trial = config.get("trial")
    if isinstance(trial, str):  # a grid point, as JSON text (study.run.tuner.param_space)
        try:
            data = json.loads(trial)
        except ValueError:
            return "a trial"
        what = "reading " if data.get("_trains") is False else ""  # stored weights only (study.run.plan)
        flat = flatten({k: v for k, v in data.items() if not k.startswith("_")})
        return f"{what}{setting(flat, swept) or 'trial'} seed {data.get('seed', 0)}"
    return picks(config.get("searched") or {}) or "a trial"


class Progress(Callback):
    """Prints one line per change (trials done / running / failed, best objective so far) and, at most every
    `status_every_s`, one line saying what each running trial is doing (train or eval, percent done)."""

    def __init__(self, study_name: str, total: int, mode: str, *, swept: Sequence[str] = (),
                 status_every_s: float = STATUS_EVERY_S):
        self.study_name, self.total, self.mode, self.status_every_s = study_name, total, mode, status_every_s
        self.swept = list(swept)  # the keys that name a grid point (study.run.naming.swept_keys)
        self.done = self.failed = self.retried = self.stopped = 0
        self.active: set[str] = set()  # counted here: Tune's statuses lag behind these callbacks
        self.best: float | None = None
        self.doing: dict[str, str] = {}  # running trial -> "train 40%" / "eval 12%"
        self.names: dict[str, str] = {}  # Tune's trial id -> the trial in words
        self.next_status = time.monotonic() + status_every_s

    def _line(self, what: str) -> None:
        best = "-" if self.best is None else f"{self.best:.3f}"
        retried = f"  retried {self.retried}" if self.retried else ""
        retried += f"  stopped {self.stopped}" if self.stopped else ""
        eprint(f"[{self.study_name}] {what:<26} done {self.done}/{self.total}  running {len(self.active)}  "
               f"failed {self.failed}{retried}  best objective {best}")

    @property
    def finished(self) -> int:
        """Trials that ended, well or not; fewer than `total` after fit() means the run was interrupted."""
        return self.done + self.failed

    def name(self, trial) -> str:
        """The trial in words (its setting and seed, or its Optuna picks), as its start line named it."""
        return self.names.get(trial.trial_id) or describe(trial.config, self.swept)

    def _ended(self, trial) -> None:
        self.doing.pop(trial.trial_id, None)
        self.active.discard(trial.trial_id)

    def on_trial_start(self, iteration, trials, trial, **info):
        self.active.add(trial.trial_id)
        self.names[trial.trial_id] = describe(trial.config, self.swept)
        self._line(f"started {self.names[trial.trial_id]}")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if "phase" in result:
            self.doing[trial.trial_id] = f"{result['phase']} {100 * result.get('progress', 0):.0f}%"
        if time.monotonic() >= self.next_status and self.doing:
            self.next_status = time.monotonic() + self.status_every_s
            eprint(f"[{self.study_name}] running: " + ", ".join(f"{self.names.get(t, t)} {d}"
                                                               for t, d in sorted(self.doing.items())))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._ended(trial)
        self.done += 1
        if not (trial.last_result or {}).get("final"):  # the scheduler ended it (ASHA): it keeps its rows
            self.stopped += 1
            self._line(f"stopped {self.name(trial)}")
            return
        value = (trial.last_result or {}).get("objective")
        if value is not None and (self.best is None or (value > self.best) == (self.mode == "max")):
            self.best = value
        self._line(f"finished {self.name(trial)}")

    def on_trial_recover(self, iteration, trials, trial, **info):
        # the trial's worker or node died and Tune runs it again from its last checkpoint (FailureConfig)
        self._ended(trial)
        self.retried += 1
        self._line(f"retrying {self.name(trial)}")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended(trial)
        self.failed += 1
        self._line(f"failed {self.name(trial)}")
        eprint(f"[{self.study_name}]   {failure(trial)}")


def failure(trial) -> str:
    """Why a trial failed, in one line (the last line of its traceback), and where the whole traceback is."""
    text = ""
    try:  # the driver's own copy first (the store's may not have been written: a full disk)
        with open(trial.error_file) as f:
            text = f.read()
    except (OSError, TypeError):
        # the reason is a courtesy; the trial has failed either way
        with contextlib.suppress(Exception):
            text = trial.get_error() or ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Failure #")]
    reason = lines[-1][:300] if lines else "no error text"
    return f"{reason} (traceback: {trial.error_file or 'not saved'}; --verbose shows it here)"
