"""The interface a training backend offers the Trainer service, and the registry that picks one by name.

The service (gRPC, Buffer reading, weight sync) only talks to this protocol, so a Megatron backend can
be registered next to the PyTorch one and chosen by `TrainerSettings.backend`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from trinity.trainer.config import TrainerSettings
from trinity.v1 import common_pb2


@runtime_checkable
class TrainerBackend(Protocol):
    @property
    def model_version(self) -> int:
        """Version of the current weights: the number of committed train steps (plus the start version)."""
        ...

    def train_step(self, experiences: Sequence[common_pb2.Experience]) -> dict[str, float]:
        """One training step (one or more optimizer updates) on a batch; returns scalar metrics."""
        ...

    def save_checkpoint(self, path: str | Path | None = None) -> Path: ...

    def load_checkpoint(self, path: str | Path) -> None: ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Hugging-Face-named full weights of the policy (LoRA merged), for weight sync."""
        ...

    def save_hf(self, out_dir: str | Path) -> Path: ...


BackendFactory = Callable[[TrainerSettings], TrainerBackend]
BACKENDS: dict[str, BackendFactory] = {}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    def deco(factory: BackendFactory) -> BackendFactory:
        if name in BACKENDS:
            raise ValueError(f"trainer backend {name!r} is already registered")
        BACKENDS[name] = factory
        return factory

    return deco


def build_backend(settings: TrainerSettings) -> TrainerBackend:
    """The backend named by `settings.backend`, constructed from `settings`."""
    import trinity.trainer.torch_backend

    if settings.backend == "megatron":
        import trinity.trainer.megatron  # noqa: F401  (registers "megatron"; imports megatron-core)

    try:
        factory = BACKENDS[settings.backend]
    except KeyError:
        raise ValueError(f"unknown trainer backend {settings.backend!r}; registered: {sorted(BACKENDS)}") from None
    return factory(settings)
