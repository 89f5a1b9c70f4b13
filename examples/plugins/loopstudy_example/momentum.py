"""The momentum carry rule's registration: its settings and where its module lives. Torch-free, as loopstudy reads
it whenever it reads a spec; the rule itself (momentum_rule.py) is imported only when a model is built."""

from dataclasses import dataclass
from typing import Annotated

from study.bounds import Bound
from study.config.rules import CarryRuleDef


@dataclass
class Settings:
    """mu: the momentum of the heavy-ball carry (0: the newest candidate, as carry_last)."""

    mu: Annotated[float, Bound(ge=0, lt=1)] = 0.5


RULE = CarryRuleDef("momentum", "loopstudy_example.momentum_rule:Momentum", Settings,
                    about="heavy-ball carry: v = mu v + (z - h); h = h + v")
