"""Trial identity: a trial id is a short hash of the fully resolved config (seed included), without the fields that
cannot change results, with data files entering by content. Stored results are found again by this id, so the
rules here decide when a study re-runs a trial."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Any

from study.config.init_from import checkpoint_file, trm_path
from study.config.schema import TrialConfig
from study.errors import ConfigError

# Fields that do not change a trial's results, so they stay out of its identity.
NON_IDENTITY = {("task", "cache_dir"), ("train", "log_every"), ("train", "checkpoint_every"), ("train", "threads"),
                ("train", "keep_checkpoints")}
# Fields added after results were stored, with the value that reproduces the behaviour from before them: left out
# of the hash while they hold it, so a new knob does not give every stored trial a new id (and re-run it). Add a
# field here whenever one joins a config section.
ADDED_LATER: dict[tuple[str, str], Any] = {
    ("eval", "tau"): None, ("eval", "gamma"): None, ("eval", "compile"): None, ("eval", "readout"): "last",
    ("model", "recall"): True, ("model", "pos"): "learned", ("train", "progressive"): 0.0,
    ("task", "min_length"): None, ("task", "test_lengths"): None, ("task", "test_size"): None,
    ("task", "dataset"): None, ("task", "n_aug"): None, ("task", "puzzle_embedding"): None,
    ("train", "puzzle_optimizer"): "sign_sgd", ("train", "puzzle_lr"): 1e-2, ("train", "puzzle_weight_decay"): 0.1,
    ("model", "mixer"): "attention", ("model", "h_layers"): None, ("model", "swiglu_multiple"): None,
    ("model", "init"): "torch", ("model", "init_states"): "learned", ("model", "head_norm"): True,
    ("model", "puzzle_prefix"): 0, ("model", "q_head"): False, ("model", "init_from"): None,
    ("model", "inner_grad_steps"): None, ("train", "optimizer"): "adamw", ("train", "weight_decay_on"): "matrices",
    ("train", "act"): "off", ("train", "halt_exploration"): 0.1, ("task", "identifiers"): None,
    ("model", "halting.rule"): "residual", ("eval", "halting_rule"): None, ("eval", "dtype"): None,
}
# The Q head's halting settings, read only by the q_head rule: out of the identity of a trial that does not use it.
Q_HALTING_KEYS = ("q_compare", "max_updates")


def _pop_unchanged(section: dict[str, Any], name: str, before: Any) -> None:
    """Drop the dotted `name` from `section` while it holds `before` (ADDED_LATER)."""
    *path, last = name.split(".")
    for part in path:
        section = section.get(part, {})
    if section.get(last, before) == before:
        section.pop(last, None)

# Settings whose arithmetic was corrected after results were stored: a trial with the setting carries the revision
# in its identity, so the corrected model is a new trial and the study re-runs it rather than reading the old rows as
# complete. (model.mixer=mlp: TRM-MLP's token-mixer norm over the positions, as TRM's transposed layout takes it.)
REVISIONS: dict[tuple[str, str, Any], str] = {("model", "mixer", "mlp"): "token-norm-over-positions"}


def to_dict(cfg: TrialConfig) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'model': {'carry': {'rule': x}}} -> {'model.carry.rule': x}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: str) -> str:
    """sha256 of a data file's bytes (cached per path, size and mtime: a 10,000-trial study hashes it once)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"data file {path}: {e.strerror}") from None
    return _file_digest(os.path.abspath(path), st.st_size, st.st_mtime_ns)


# Config fields that name data files: a trial's identity holds their contents, not their paths (edit the CSV and
# the trials are new; move it and they are the same).
DATA_FILES = (("task", "csv"), ("task", "test_csv"), ("task", "identifiers"))


def trial_id(cfg: TrialConfig, leave_out: tuple[str, ...] = ()) -> str:
    """Short hash of the resolved config (seed included), without fields that cannot change results; data files
    enter by content. leave_out: dotted keys left out as well (study.spec compares sweep points without the keys
    they do not read)."""
    d = to_dict(cfg)
    for key in leave_out:
        *path, name = key.split(".")
        section = d
        for p in path:
            section = section[p]
        section.pop(name, None)
    for section, name in NON_IDENTITY:
        d[section].pop(name, None)
    for section, name in DATA_FILES:
        if d[section].get(name):
            d[section][name] = "sha256:" + file_digest(d[section][name])
    checkpoint = trm_path(d["model"].get("init_from"))
    if checkpoint:  # an imported checkpoint enters by content, as data files do
        d["model"]["init_from"] = "trm:sha256:" + file_digest(checkpoint_file(checkpoint))
    if "q_head" not in (cfg.model.halting.rule, cfg.eval.halting_rule):
        for name in Q_HALTING_KEYS:
            d["model"]["halting"].pop(name, None)
    for (section, name), before in ADDED_LATER.items():
        _pop_unchanged(d[section], name, before)
    d.pop("label", None)
    for (section, name, value), revision in REVISIONS.items():
        if d[section].get(name) == value:
            d[section][f"{name}_revision"] = revision
    outside_plugins(cfg, d)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def outside_plugins(cfg: TrialConfig, d: dict[str, Any]) -> None:
    """Plugins in a trial's identity (in place on its dict `d`): the distribution and version of every outside
    plugin the trial runs (upgrading one makes its trials stale, as editing the spec does), and none of the settings
    of outside rules it does not run (installing a plugin changes no other trial's id). The built-ins add nothing:
    upgrading loopstudy stales nothing."""
    from study.config.rules import FOUND as RULES_FOUND
    from study.tasks import FOUND as TASKS_FOUND

    used = cfg.model.rules
    own = {k for n, r in RULES_FOUND.parts.items() if RULES_FOUND.origin[n].builtin or n in used for k in r.reads}
    for key in {k for r in RULES_FOUND.parts.values() for k in r.reads} - own:
        d["model"]["carry"].pop(key, None)
    pins = {f"{p.group}:{p.name}": p.pin for p in [*(RULES_FOUND.origin[r] for r in sorted(used)),
                                                   TASKS_FOUND.origin[cfg.task.name]] if not p.builtin}
    if pins:
        d["plugins"] = pins


def eval_keys() -> tuple[str, ...]:
    """Every dotted key of the eval section: what an evaluation of stored weights may change."""
    from study.config.schema import EvalConfig

    return tuple(f"eval.{f.name}" for f in dataclasses.fields(EvalConfig))


def training_id(cfg: TrialConfig) -> str:
    """The id of what training reads: the trial id without the eval section. Configs with one training_id train
    the same weights (a sweep over eval.* keys trains once and reads those weights each way)."""
    return trial_id(cfg, leave_out=eval_keys())


def eval_id(cfg: TrialConfig) -> str:
    """Short hash of the eval section alone (fields at their before-they-existed value left out, as in trial_id):
    which evaluation of a trial's weights a row is."""
    d = to_dict(cfg)["eval"]
    for (section, name), before in ADDED_LATER.items():
        if section == "eval":
            _pop_unchanged(d, name, before)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def reading_id(cfg: TrialConfig, step: int | None = None) -> str:
    """The trial id of an evaluation of stored weights under `cfg`: for the final weights, the id the trial would
    have had with this eval section (so a spec that lists the evaluation finds it complete); for the weights kept
    at training step `step`, a hash of that id and the step."""
    tid = trial_id(cfg)
    return tid if step is None else hashlib.sha256(f"{tid}@{step}".encode()).hexdigest()[:12]
