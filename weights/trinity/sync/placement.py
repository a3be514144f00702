"""Where a sync member's weights live: its host and the GPU it sends from or receives into.

Members report these to the Gateway, which picks the transport (`auto`): CUDA IPC needs one GPU shared by
every member, NCCL one GPU per member. The host id is the hostname and the kernel's boot id: two containers
on one machine have different hostnames, so they count as different hosts (CUDA IPC between them would
need a shared IPC namespace), and a reused hostname on another machine has another boot id.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import torch

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def host_id() -> str:
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}" if boot else socket.gethostname()


def gpu_uuid(device: torch.device) -> str:
    """The physical identity of a CUDA device (the same under any CUDA_VISIBLE_DEVICES numbering)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"GPU-{torch.cuda.get_device_properties(index).uuid}"


def sync_gpus(device: torch.device | str | None = None) -> list[str]:
    """The GPU this process syncs weights on (`device`, else the current CUDA device); [] without CUDA."""
    if device is not None and torch.device(device).type != "cuda":
        return []
    if not torch.cuda.is_available():
        return []
    return [gpu_uuid(torch.device(device) if device is not None else torch.device("cuda"))]


def worker_gpus(workers: int) -> list[str]:
    """The GPUs an engine's `workers` (tensor parallel) sync on: its first `workers` visible devices, where vLLM
    places its local ranks; [] without CUDA."""
    if not torch.cuda.is_available():
        return []
    return [gpu_uuid(torch.device("cuda", index)) for index in range(min(workers, torch.cuda.device_count()))]


def device_identity(device: torch.device) -> str:
    """What two members compare before sharing memory: same host and the same GPU (or both host memory)."""
    where = gpu_uuid(device) if device.type == "cuda" else device.type
    return f"{host_id()}|{where}"


def device_option(backend: str, device: torch.device | None) -> dict[str, Any]:
    """`open_sender` / `open_receiver` options that put a GPU backend on this member's own device (`cuda:N` as
    configured, not the calling thread's current device); gloo moves CPU tensors and checkpoint files: none."""
    if device is None or device.type != "cuda" or backend not in ("nccl", "cuda_ipc"):
        return {}
    return {"device": device}
