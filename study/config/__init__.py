"""Trial configuration, torch-free: the schema (`schema`), allowed ranges (`bounds`), trial identity
(`identity`), reading YAML and overrides (`loading`).

Every config is a pydantic dataclass that forbids unknown keys; impossible values raise ValueError naming the
dotted key, the value and what is allowed; `build_trial` turns them into one ConfigError line per
problem.
"""

from study.bounds import MAX_DEPTH_LAYERS, Bound, check_bounds
from study.config.identity import (
    ADDED_LATER,
    DATA_FILES,
    NON_IDENTITY,
    eval_id,
    eval_keys,
    file_digest,
    flatten,
    reading_id,
    to_dict,
    training_id,
    trial_id,
)
from study.config.loading import (
    absolute_data_path,
    allowed_keys,
    build_trial,
    check_data,
    describe_error,
    load_yaml,
    merge,
    parse_overrides,
    resolve_data_paths,
    set_dotted,
)
from study.config.rules import CARRY_RULES, RULES, CarryConfig, CarryRuleDef, Rule
from study.config.schema import (
    EvalConfig,
    HaltingConfig,
    ModelConfig,
    TrainConfig,
    TrialConfig,
    layers_per_step,
)
from study.tasks import TaskConfig, TaskName

__all__ = [
    "ADDED_LATER", "TaskConfig", "TaskName", "DATA_FILES", "MAX_DEPTH_LAYERS", "NON_IDENTITY", "RULES", "Bound",
    "CARRY_RULES", "CarryConfig", "CarryRuleDef", "EvalConfig", "HaltingConfig", "ModelConfig", "Rule",
    "TrainConfig", "TrialConfig", "absolute_data_path", "allowed_keys", "build_trial", "check_bounds",
    "check_data", "describe_error", "eval_id", "eval_keys", "file_digest", "flatten",
    "layers_per_step", "load_yaml", "merge", "parse_overrides", "reading_id",
    "resolve_data_paths", "set_dotted", "to_dict", "training_id", "trial_id",
]
