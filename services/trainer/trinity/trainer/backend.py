"""The interface a training backend offers the Trainer service, and the registry that picks one by name.

The service (gRPC, Buffer reading, weight sync) only talks to this protocol, so a Megatron backend can
be registered next to the PyTorch one and chosen by `trainer.backend` in the run config.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import torch
from pydantic import BaseModel

from trinity.config import RunConfig
from trinity.registry import Registry
from trinity.v1 import common_pb2


class SteeringUnsupported(NotImplementedError):
    """The backend cannot change this setting of a live run (the trainer answers FAILED_PRECONDITION)."""


@runtime_checkable
class TrainerBackend(Protocol):
    @property
    def model_version(self) -> int:
        """Version of the current weights: the number of committed train steps (plus the start version)."""
        ...

    @property
    def step(self) -> int:
        """Train steps done (restored by `load_checkpoint`)."""
        ...

    def train_step(self, experiences: Sequence[common_pb2.Experience]) -> dict[str, float]:
        """One training step (one or more optimizer updates) on a batch; returns scalar metrics."""
        ...

    def save_checkpoint(self, path: str | Path | None = None) -> Path: ...

    @property
    def learning_rate(self) -> float:
        """The base learning rate (the schedule's peak) of the policy; SteeringUnsupported where it cannot be set."""
        ...

    def set_learning_rate(self, lr: float) -> None:
        """Make `lr` the base learning rate from the next optimizer update on (between train steps only); the
        schedule's factor still applies. SteeringUnsupported where the backend cannot."""
        ...

    def load_checkpoint(self, path: str | Path) -> None: ...

    def continue_versions_after(self, version: int) -> None:
        """See `TrainState.continue_versions_after`."""
        ...

    def warm_up(self) -> None:
        """Pay the first step's one-time costs now (while the trainer waits for its explorers), changing nothing a
        step sees; a backend with nothing to warm does nothing."""
        ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Hugging-Face-named full weights of the policy (LoRA merged), for weight sync."""
        ...

    def save_hf(self, out_dir: str | Path) -> Path: ...


# (the run config, with `model.path` a model directory; where checkpoints go, None = nowhere) -> a backend
BackendFactory = Callable[[RunConfig, Path | None], TrainerBackend]
# Each backend's module is imported on first use (megatron's only when a run names it).
BACKENDS: Registry[BackendFactory] = Registry("trainer_backend")
register_backend = BACKENDS.register


def build_backend(config: RunConfig, checkpoint_dir: Path | None = None) -> TrainerBackend:
    """The backend named by `config.trainer.backend`, constructed from the run config."""
    return BACKENDS.get(config.trainer.backend)(config, checkpoint_dir)


Section = TypeVar("Section", bound=BaseModel)


def backend_section(config: RunConfig, section: type[Section], name: str, checkpoint_dir: Path | None) -> Section:
    """`config.trainer` as the section `name` reads, refusing a config meant for another backend; without a
    checkpoint directory (a backend used as a library) there are no periodic checkpoints."""
    trainer = config.trainer
    if not isinstance(trainer, section):
        raise ValueError(f"{name} cannot train a config with trainer.backend {trainer.backend!r}")
    if checkpoint_dir is None:
        return trainer.model_copy(update={"save_interval": 0})
    return trainer
