"""The outside plugins a spec names (study.plugins), checked before any trial starts: each carry rule runs on a tiny
input (study.models.carry.probe_rule) and each task makes a tiny split of the shape it declares, so that a plugin
that lacks a method, returns the wrong shape or a NaN is refused in one line naming it and its entry point. The
built-ins are pinned by the test suite instead, so a study of built-ins never imports torch here. What a spec uses
of plugins is `used_plugins`; the cluster preflight (study.run.preflight) checks every node has them."""

from __future__ import annotations

import numpy as np

from study.config import TrialConfig
from study.config.rules import FOUND as RULES_FOUND
from study.errors import ConfigError, first_line
from study.plugins import Plugin
from study.tasks import FOUND as TASKS_FOUND
from study.tasks import TASKS


def used_plugins(configs: list[TrialConfig]) -> list[Plugin]:
    """The outside plugins (not loopstudy's own parts) the trials run, each once."""
    out: dict[tuple[str, str], Plugin] = {}
    for cfg in configs:
        for name in cfg.model.rules:
            p = RULES_FOUND.origin[name]
            out.setdefault((p.group, name), p)
        p = TASKS_FOUND.origin[cfg.task.name]
        out.setdefault((p.group, p.name), p)
    return [p for p in out.values() if not p.builtin]


def check_plugins(configs: list[TrialConfig], source: str) -> None:
    """Probe every outside rule and task the trials run (once per distinct setting): ConfigError naming it."""
    outside = {(p.group, p.name) for p in used_plugins(configs)}
    if not outside:
        return
    from study.models.carry import RuleError, probe_rule

    seen = set()
    for cfg in configs:
        for name in sorted(cfg.model.rules):
            key = ("rule", name, repr(cfg.model.carry))
            if (RULES_FOUND.origin[name].group, name) in outside and key not in seen:
                seen.add(key)
                try:
                    probe_rule(name, cfg.model.carry)
                except RuleError as e:
                    raise ConfigError(f"{source}: {e}") from None
        key = ("task", cfg.task.name, repr(cfg.task))
        if (TASKS_FOUND.origin[cfg.task.name].group, cfg.task.name) in outside and key not in seen:
            seen.add(key)
            probe_task(cfg, source)


def probe_task(cfg: TrialConfig, source: str) -> None:
    """A tiny split of each kind from the task: arrays of the declared shape, tokens inside the vocabulary."""
    name = cfg.task.name
    where = f"{source}: {TASKS_FOUND.origin[name].where}"
    task = TASKS[name]
    try:
        spec = task.spec(cfg.task)
        for which, length in (("train", spec.seq_len), ("test", spec.test_seq_len or spec.seq_len)):
            split = task.generate(cfg.task, which, 4, cfg.task.data_seed)
            inputs, labels = np.asarray(split.inputs), np.asarray(split.labels)
            if inputs.shape != (4, length) or labels.shape != (4, length) or len(split.difficulty) != 4:
                raise ConfigError(f"{where}: its {which} split has inputs {inputs.shape}, labels {labels.shape} and "
                                  f"{len(split.difficulty)} difficulties for 4 samples; its spec says 4 x {length}")
            if inputs.min() < 0 or inputs.max() >= spec.vocab:
                raise ConfigError(f"{where}: its {which} inputs hold tokens outside its vocabulary 0..{spec.vocab - 1}")
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - someone else's code: its error, in one line
        raise ConfigError(f"{where} fails to make 4 samples: {type(e).__name__}: {first_line(e)}") from None


def listing() -> list[str]:
    """`loopstudy plugins`: every carry rule and task found, built-in or not, with its distribution, version, entry
    point and settings; the broken ones with their reason."""
    lines = []
    for title, found, prefix in (("carry rules", RULES_FOUND, "model.carry."), ("tasks", TASKS_FOUND, "task.")):
        lines.append(f"{title}:")
        for name, part in found.parts.items():
            p = found.origin[name]
            settings = ", ".join(prefix + k for k in part.reads) or "no settings of its own"
            lines.append(f"  {name:<16} {p.dist} {p.version}{' (built-in)' if p.builtin else ''}  {p.group}: "
                         f"{name} = {p.value}  [{settings}]")
        lines += [f"  {name:<16} BROKEN: {why}" for name, why in found.broken.items()]
    return lines
