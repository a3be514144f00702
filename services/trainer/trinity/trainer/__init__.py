"""Trainer service: the training core behind the `TrainerBackend` interface (PyTorch; Megatron-Core).

A backend is built from the shared run config (`trinity.config.RunConfig`): `config.trainer` is the
`TorchTrainerConfig` or `MegatronTrainerConfig` that `trainer.backend` selects.
"""

from trinity.trainer.backend import BACKENDS, TrainerBackend, build_backend, register_backend

__all__ = ["BACKENDS", "TrainerBackend", "build_backend", "register_backend"]
