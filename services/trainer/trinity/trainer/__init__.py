"""Trainer service: the training core (PyTorch backend) behind the `TrainerBackend` interface."""

from trinity.trainer.backend import BACKENDS, TrainerBackend, build_backend, register_backend
from trinity.trainer.config import LoraSettings, OptimizerSettings, TrainerSettings

__all__ = [
    "BACKENDS",
    "LoraSettings",
    "OptimizerSettings",
    "TrainerBackend",
    "TrainerSettings",
    "build_backend",
    "register_backend",
]
