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

__all__ = [
    "ConfigError",
    "OperatorConfig",
    "PriorityReplayConfig",
    "SelectorName",
    "StreamConfig",
    "TaskSetConfig",
    "format_validation_error",
]
