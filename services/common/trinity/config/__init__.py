"""The configuration schema shared by every service; importable without torch.

Configs are validated at the boundary (CLI, gRPC requests) so that a wrong key, type or value is
reported with the field that is wrong, before any work starts.
"""

from trinity.config.buffer import (
    OperatorConfig,
    PriorityReplayConfig,
    SelectorName,
    StreamConfig,
    TaskSetConfig,
)
from trinity.config.errors import ConfigError, format_validation_error
from trinity.config.run import (
    KNOWN_ALGORITHMS,
    AlgorithmConfig,
    BufferConfig,
    ExplorerConfig,
    ModelConfig,
    RunConfig,
    SynchronizerConfig,
    TrainerConfig,
    load_run_config,
    parse_run_config,
)

__all__ = [
    "KNOWN_ALGORITHMS",
    "AlgorithmConfig",
    "BufferConfig",
    "ConfigError",
    "ExplorerConfig",
    "ModelConfig",
    "OperatorConfig",
    "PriorityReplayConfig",
    "RunConfig",
    "SelectorName",
    "StreamConfig",
    "SynchronizerConfig",
    "TaskSetConfig",
    "TrainerConfig",
    "format_validation_error",
    "load_run_config",
    "parse_run_config",
]
