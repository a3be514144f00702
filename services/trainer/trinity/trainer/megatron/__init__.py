"""Megatron-Core training backend (tensor x pipeline x data parallel), registered as trainer backend "megatron".

Importing this package registers the backend; megatron-core itself is imported only inside the
worker processes it starts.
"""

from trinity.trainer.megatron.backend import MegatronBackend
from trinity.trainer.megatron.launcher import WorkerGroupError

__all__ = ["MegatronBackend", "WorkerGroupError"]
