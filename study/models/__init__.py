"""Model library: the shared block, carry rules, reasoners and halting."""

from study.config import CarryConfig, HaltingConfig, ModelConfig
from study.models.carry import infiloop_scan
from study.models.reasoner import build_reasoner

__all__ = ["CarryConfig", "HaltingConfig", "ModelConfig", "build_reasoner", "infiloop_scan"]
