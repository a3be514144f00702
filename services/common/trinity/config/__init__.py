"""The configuration schema shared by every service; importable without torch.

Configs are validated at the boundary (CLI, gRPC requests) so that a wrong key, type or value is
reported with the field that is wrong, before any work starts.

One module per section (`buffer`, `explorer`, `trainer`, `sync`); `run` holds `RunConfig` and its
loading; `spec` converts a section to its proto message and back; `reference` writes docs/config.md.
A component reads its section as it is: there is no second settings model to copy it into.
"""

from trinity.config.algorithm import AlgorithmConfig, ResolvedAlgorithm, resolve_algorithm
from trinity.config.buffer import (
    BufferConfig,
    MixingConfig,
    MixtureConfig,
    MixtureMember,
    OfflineDataConfig,
    OperatorConfig,
    PriorityReplayConfig,
    SelectorName,
    StreamConfig,
    TaskSetConfig,
)
from trinity.config.errors import ConfigError, format_validation_error
from trinity.config.explorer import ExplorerConfig
from trinity.config.run import (
    ModelConfig,
    MonitorConfig,
    RunConfig,
    load_run_config,
    parse_run_config,
)
from trinity.config.sync import SynchronizerConfig
from trinity.config.trainer import MegatronTrainerConfig, OptimizerSection, TorchTrainerConfig, TrainerConfig

__all__ = [
    "AlgorithmConfig",
    "BufferConfig",
    "ConfigError",
    "ExplorerConfig",
    "MegatronTrainerConfig",
    "MixingConfig",
    "MixtureConfig",
    "MixtureMember",
    "ModelConfig",
    "MonitorConfig",
    "OfflineDataConfig",
    "OperatorConfig",
    "OptimizerSection",
    "PriorityReplayConfig",
    "ResolvedAlgorithm",
    "RunConfig",
    "SelectorName",
    "StreamConfig",
    "SynchronizerConfig",
    "TaskSetConfig",
    "TorchTrainerConfig",
    "TrainerConfig",
    "format_validation_error",
    "load_run_config",
    "parse_run_config",
    "resolve_algorithm",
]
