"""Carry rules as the configuration sees them: what a rule registers (CarryRuleDef, the contract's torch-free half),
the built-ins' definitions, and the `model.carry` section (CarryConfig) put together from every rule found.

A rule is found by its entry point in the group `loopstudy.carry_rules` (study.plugins), the built-ins too
(pyproject.toml). Its module (the contract's other half, study.models.carry.CarryRule) is imported only when a model
is built, so reading a spec or the results never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic.dataclasses import dataclass as pdataclass

from study.bounds import Bound, check_bounds
from study.plugins import discover, set_aside_clashes
from study.tasks.settings import declared


@dataclass(frozen=True)
class CarryRuleDef:
    """What a carry-rule plugin registers, as the object its entry point names.

    name: the rule's name in specs (`model.carry.rule: NAME`), the entry point's name too. module: where its
    CarryRule subclass lives, "package.module:Class" (study.models.carry states that contract). settings: a dataclass
    of the rule's own settings, each read as `model.carry.<field>` (types, defaults, Bounds, a comment or docstring
    saying what it means); sweepable by grid and Optuna like any key; a field another rule declares too must be
    declared identically (one key, one meaning). reads_eta: whether the rule reads FPOpt's damping eta (halting's
    gamma and patience then change it). about: one line for `loopstudy plugins` and the docs.
    """

    name: str
    module: str
    settings: type | None = None
    reads_eta: bool = False
    about: str = ""

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(declared(self.settings)) if self.settings is not None else ()


@dataclass
class ScoreCap:
    """The cap of the rules that score candidates by content (InfiLoop, full attention residuals)."""

    # cap on content scores (InfiLoop, full attention residuals), so exp(score) stays finite
    clip: Annotated[float, Bound(gt=0)] = 8.0


@dataclass
class InfiLoopSettings(ScoreCap):
    """InfiLoop's own settings (methods.md section 3)."""

    # InfiLoop's time decay beta at the start (beta < 1 forgets older candidates; 1: uniform weights)
    beta_init: Annotated[float, Bound(gt=0)] = 0.55
    # whether beta is learned (false: fixed at beta_init)
    learn_beta: bool = True
    # whether InfiLoop scores each candidate by content (q . RMSNorm(z)); false: decay-only weights
    content_score: bool = True


CARRY_LAST = CarryRuleDef("carry_last", "study.models.carry:CarryLast", about="TRM: the newest block output")
INFILOOP = CarryRuleDef("infiloop", "study.models.carry:InfiLoop", InfiLoopSettings,
                        about="loop-native attention residual: content score and learned time decay")
FULL_ATTNRES = CarryRuleDef("full_attnres", "study.models.carry:FullAttnRes", ScoreCap,
                            about="full attention residuals over every candidate (the cost baseline)")
DAMPED = CarryRuleDef("damped", "study.models.carry:Damped", reads_eta=True,
                      about="FPRM: fixed-point damping by FPOpt's eta")

@dataclass
class CommonCarrySettings:
    """reset_inner: whether the inner axis's InfiLoop accumulators (log D, h) restart at every outer cycle. Default
    False: the inner axis keeps one decayed history over the whole rollout. Resetting would make the first inner
    step of each cycle a hard carry-last (gamma = 1) and throw away the accumulated evidence."""

    # how an axis passes its state on: carry_last (TRM), infiloop, full_attnres (cost baseline), damped (FPRM), or
    # an installed plugin's rule (`loopstudy plugins`)
    rule: str = "carry_last"
    # the nested axes that run `rule` (inner, outer, both or none); the others carry the last state
    placement: Literal["none", "inner", "outer", "both"] = "both"
    reset_inner: bool = False


FOUND = discover("carry_rules", CarryRuleDef)
set_aside_clashes(FOUND, lambda r: declared(r.settings) if r.settings else {}, set(declared(CommonCarrySettings)),
                  "model.carry.")
CARRY_RULES: dict[str, CarryRuleDef] = FOUND.parts
if "carry_last" not in CARRY_RULES:  # the default must exist: loopstudy's own metadata is missing or stale
    raise ImportError("the built-in carry rules are not registered: loopstudy is not installed in this environment "
                      "(pip install -e . from the repository, which registers them by entry point)")


def carry_fields(rules: dict[str, CarryRuleDef]) -> dict[str, tuple[Any, Any]]:
    """The common fields, then every rule's own, each once; `rule` allows the rules found."""
    out = declared(CommonCarrySettings)
    out["rule"] = (Literal[tuple(rules)], out["rule"][1])
    owner: dict[str, str] = {}
    for rule in rules.values():
        for key, spec in (declared(rule.settings) if rule.settings is not None else {}).items():
            if key in declared(CommonCarrySettings):
                raise TypeError(f"carry rule {rule.name}: model.carry.{key} is a common setting; do not declare it")
            if key in owner and out[key] != spec:
                raise TypeError(f"model.carry.{key} is declared differently by {owner[key]} ({out[key]}) and by "
                                f"{rule.name} ({spec}); a shared key must mean one thing")
            out[key], owner[key] = spec, owner.get(key, rule.name)
    return out


def rule_for(self, axis: str) -> str:
    """The rule applied on `axis` ('inner', 'outer' or 'flat')."""
    if axis == "flat":
        return self.rule
    return self.rule if self.placement in (axis, "both") else "carry_last"


def settings_of(self, rule: str) -> Any:
    """The rule's own settings dataclass, filled from this section (None for a rule without settings)."""
    defn = CARRY_RULES[rule]
    return defn.settings(**{k: getattr(self, k) for k in defn.reads}) if defn.settings is not None else None


def build_carry_config(rules: dict[str, CarryRuleDef]) -> type:
    """The CarryConfig class (a pydantic dataclass forbidding unknown keys) over the rules found."""
    fields = carry_fields(rules)

    def __post_init__(self) -> None:
        check_bounds("model.carry", self)

    doc = "The loop rule and where it goes. Axes not named by `placement` use carry_last. " \
          + CommonCarrySettings.__doc__
    namespace = {"__annotations__": {k: tp for k, (tp, _) in fields.items()},
                 **{k: default for k, (_, default) in fields.items()},
                 "__post_init__": __post_init__, "rule_for": rule_for, "settings_of": settings_of, "__doc__": doc,
                 "__module__": __name__, "__qualname__": "CarryConfig"}
    return pdataclass(config={"extra": "forbid"})(type("CarryConfig", (), namespace))


CarryConfig = build_carry_config(CARRY_RULES)
RULES = tuple(CARRY_RULES)
Rule = CarryConfig.__annotations__["rule"]
