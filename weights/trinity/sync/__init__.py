"""Weight sync: the trainer pushes new weights into explorer workers.

A named interface (`SyncSender` / `SyncReceiver`) with a process-group implementation (gloo on CPU,
NCCL on GPU: `WeightSender` / `WeightReceiver`), shared GPU memory for members on one GPU (`cuda_ipc`:
`IpcSender` / `IpcReceiver`) and a shared-directory fallback (`CheckpointSender` / `CheckpointReceiver`),
chosen by `SyncGroupSpec.backend` through `open_sender` / `open_receiver`.

`SyncGroupSpec` and the errors import without torch (the Gateway needs only those); everything else
is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from trinity.sync.errors import ChecksumMismatch, NoUpdateYet, StaleVersion, SyncError
from trinity.sync.spec import Rendezvous, SyncGroupSpec, reserve_rendezvous

_LAZY = {
    "CheckpointReceiver": "trinity.sync.checkpoint",
    "CheckpointSender": "trinity.sync.checkpoint",
    "IpcReceiver": "trinity.sync.cuda_ipc",
    "IpcSender": "trinity.sync.cuda_ipc",
    "WeightReceiver": "trinity.sync.collective",
    "WeightSender": "trinity.sync.collective",
    "BACKENDS": "trinity.sync.interface",
    "LoadFn": "trinity.sync.interface",
    "SyncReceiver": "trinity.sync.interface",
    "SyncReport": "trinity.sync.interface",
    "SyncBackend": "trinity.sync.interface",
    "SyncSender": "trinity.sync.interface",
    "finish_stream": "trinity.sync.interface",
    "load_streamed": "trinity.sync.interface",
    "open_receiver": "trinity.sync.interface",
    "open_sender": "trinity.sync.interface",
    "register_sync_backend": "trinity.sync.interface",
    "group_by_layer": "trinity.sync.protocol",
    "narrowed_to": "trinity.sync.protocol",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trinity.sync' has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "CheckpointReceiver",
    "CheckpointSender",
    "ChecksumMismatch",
    "IpcReceiver",
    "IpcSender",
    "LoadFn",
    "NoUpdateYet",
    "Rendezvous",
    "StaleVersion",
    "SyncBackend",
    "SyncError",
    "SyncGroupSpec",
    "SyncReceiver",
    "SyncReport",
    "SyncSender",
    "WeightReceiver",
    "WeightSender",
    "finish_stream",
    "group_by_layer",
    "load_streamed",
    "narrowed_to",
    "open_receiver",
    "open_sender",
    "register_sync_backend",
    "reserve_rendezvous",
]
