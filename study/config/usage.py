"""Which config fields a trial reads, given the rest of its config: the one statement the sweep checks use to
refuse a sweep that cannot change anything (study.spec) and to find sweep points that are the same trial in all
but name.

READ_WHEN maps a dotted key to a rule: given a config, None when the field is read, else why it is not. Every other
field of the schema is in ALWAYS_READ, or is a task field (read per study.tasks' TaskDef.reads); a test walks every
field so that a new one must be placed here.
"""

from __future__ import annotations

from collections.abc import Callable

from study.config.rules import CARRY_RULES, CommonCarrySettings
from study.config.schema import TrialConfig
from study.tasks import COMMON_FIELDS, TASKS
from study.tasks.settings import declared


def uses(cfg: TrialConfig, *rules: str) -> bool:
    """Whether any loop axis of the model runs one of `rules`."""
    return bool(cfg.model.rules & set(rules))


def eval_halting(cfg: TrialConfig) -> bool:
    """Whether the evaluation halts samples (eval.halting overrides model.halting.enabled)."""
    return cfg.eval.halting if cfg.eval.halting is not None else cfg.model.halting.enabled


def halting_anywhere(cfg: TrialConfig) -> bool:
    return cfg.model.halting.enabled or eval_halting(cfg)


def _when(test: Callable[[TrialConfig], bool], why: str) -> Callable[[TrialConfig], str | None]:
    return lambda cfg: None if test(cfg) else why


INFILOOP = _when(lambda c: uses(c, "infiloop"), "no loop axis runs model.carry.rule infiloop")
ETA_RULES = tuple(n for n, d in CARRY_RULES.items() if d.reads_eta)  # the rules FPOpt's eta steers (damped)
# FPOpt's eta (patience, gamma, eta0) steers the damped rule, and with halting on it stops samples too (eta_min)
ETA = _when(lambda c: uses(c, *ETA_RULES) or halting_anywhere(c),
            "neither the damped rule nor halting (model.halting.enabled / eval.halting) is in use")
HALTING = _when(halting_anywhere, "halting is off (model.halting.enabled and eval.halting)")
EVAL_HALTING = _when(lambda c: eval_halting(c) or uses(c, *ETA_RULES),
                     "the evaluation neither halts (eval.halting / model.halting.enabled) nor damps")
Q_HALTING = _when(lambda c: eval_halting(c) and c.eval.model_config(c.model).halting.rule == "q_head",
                  "the evaluation does not halt by the Q head (model.halting.rule / eval.halting_rule q_head)")
NESTED = _when(lambda c: c.model.kind == "nested", "model.kind is flat (one loop, no inner cycles)")
PUZZLES = _when(lambda c: "puzzle_embedding" in TASKS[c.task.name].reads or c.model.puzzle_prefix > 0,
                "the model has no puzzle embedding (task arc has one; model.puzzle_prefix gives any task TRM's)")
PERTURB = _when(lambda c: c.eval.perturb_update is not None, "eval.perturb_update is not set (no perturbation test)")

READ_WHEN: dict[str, Callable[[TrialConfig], str | None]] = {
    "model.carry.rule": _when(lambda c: c.model.kind == "flat" or c.model.carry.placement != "none",
                              "model.carry.placement is none: both axes carry the last state"),
    "model.carry.placement": _when(lambda c: c.model.kind == "nested" and c.model.carry.rule != "carry_last",
                                   "model.carry.rule is carry_last (or the model is flat): every axis carries the "
                                   "last state wherever the rule is placed"),
    "model.carry.clip": _when(lambda c: (uses(c, "infiloop") and c.model.carry.content_score)
                              or uses(c, "full_attnres"), "no axis computes a content score"),
    "model.carry.reset_inner": _when(lambda c: c.model.kind == "nested"
                                     and c.model.carry.rule_for("inner") in ("infiloop", "full_attnres"),
                                     "the inner axis keeps no history to reset"),
    "model.L": NESTED,
    "model.h_layers": NESTED,
    "model.inner_grad_steps": NESTED,
    # (a2 enters b1 = b2 (1 - a1) / (1 - a1^2L), b2 = 1 - a2 a1^2L: both reasoners read it under the scaling)
    "model.a1_init": _when(lambda c: c.model.residual_scaling, "model.residual_scaling is off"),
    "model.a2_init": _when(lambda c: c.model.residual_scaling, "model.residual_scaling is off"),
    "model.halting.tau": _when(lambda c: halting_anywhere(c) or uses(c, *ETA_RULES),
                               "neither halting nor the damped rule is in use"),
    "model.halting.gamma": ETA,
    "model.halting.patience": ETA,
    "model.halting.eta0": ETA,
    "model.halting.eta_min": HALTING,
    "model.halting.rule": HALTING,
    "model.halting.q_compare": Q_HALTING,
    "model.halting.max_updates": Q_HALTING,
    "eval.halting_rule": EVAL_HALTING,
    "eval.L": NESTED,
    "eval.tau": EVAL_HALTING,
    "eval.gamma": EVAL_HALTING,
    "eval.align_window": INFILOOP,
    "eval.perturb_eps": PERTURB,
    "eval.perturb_updates": PERTURB,
    "eval.perturb_n": PERTURB,
    "train.halt_exploration": _when(lambda c: c.train.act != "off", "train.act is off"),
    "train.puzzle_optimizer": PUZZLES,
    "train.puzzle_lr": PUZZLES,
    "train.puzzle_weight_decay": PUZZLES,
}



def rule_setting(key: str) -> Callable[[TrialConfig], str | None]:
    """model.carry.<key>, a rule's own setting: read when a loop axis runs a rule that declares it."""
    owners = tuple(n for n, d in CARRY_RULES.items() if key in d.reads)
    return _when(lambda c: uses(c, *owners), f"no loop axis runs a rule that reads it ({', '.join(owners)})")


for _key in {k for d in CARRY_RULES.values() for k in d.reads} - set(declared(CommonCarrySettings)):
    READ_WHEN.setdefault(f"model.carry.{_key}", rule_setting(_key))

# keys whose reading the task and model shape decide: set in a spec whose trials never read them, they are a mistake
# (the other keys of READ_WHEN may be set in a base that only some sweep points read)
TASK_BOUND = frozenset(k for k, rule in READ_WHEN.items() if rule is PUZZLES)

ALWAYS_READ = frozenset({
    "model.kind", "model.hidden", "model.heads", "model.n_layers", "model.expansion", "model.norm", "model.conv",
    "model.residual_scaling", "model.H", "model.grad_steps", "model.recall", "model.pos", "model.halting.enabled",
    "model.halting.eps", "model.mixer", "model.swiglu_multiple", "model.init", "model.init_states",
    "model.head_norm", "model.puzzle_prefix", "model.q_head", "model.init_from",
    *(f"train.{k}" for k in ("steps", "batch_size", "lr", "weight_decay", "betas", "warmup", "n_sup", "grad_clip",
                             "ema", "loss", "device", "dtype", "threads", "log_every", "checkpoint_every",
                             "keep_checkpoints", "progressive", "optimizer", "weight_decay_on", "act")),
    *(f"eval.{k}" for k in ("depths", "H", "halting", "n_test", "batch_size", "stability", "perturb_update",
                            "compile", "readout", "dtype")),
    *(f"task.{k}" for k in COMMON_FIELDS), "seed", "label",
})


def task_reads(cfg: TrialConfig, name: str) -> str | None:
    """Whether the task reads task.<name> (None) or why not."""
    task = cfg.task
    if name in COMMON_FIELDS:
        return None
    if name not in TASKS[task.name].reads:
        return f"task {task.name!r} does not read it"
    if task.csv and name in ("blanks", "test_blanks"):
        return "the puzzles come from task.csv"
    return None


def unread(cfg: TrialConfig, key: str) -> str | None:
    """Why the dotted `key` cannot change this trial's results (None: it can)."""
    if key.startswith("task."):
        return task_reads(cfg, key.split(".", 1)[1])
    rule = READ_WHEN.get(key)
    return rule(cfg) if rule else None


def unread_fields(cfg: TrialConfig, keys) -> dict[str, str]:
    """{key: why it is not read} for the keys this trial does not read."""
    return {k: why for k in keys if (why := unread(cfg, k)) is not None}
