"""What travels from rank 0 to the followers, and how a follower runs it on its backend.

A command is `(method, args)` with plain, picklable arguments: experiences as serialized protobuf bytes,
paths as strings. Every rank runs the same `TrainerBackend` method with the same arguments (SPMD); each
rank's result is gathered to rank 0, which returns its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from trinity.models.digest import weights_digest
from trinity.trainer.backend import TrainerBackend
from trinity.v1 import common_pb2

END = "end"  # the run is over: leave the command loop
STATE = "state"  # each rank's step, version, weights digest and learning rate (replicas must agree)


class RankState(TypedDict):
    step: int
    model_version: int
    weights_digest: int
    learning_rate: float  # each rank's own optimizer's: a steered rate must reach every rank


def encode_experiences(experiences: Sequence[common_pb2.Experience]) -> list[bytes]:
    return [e.SerializeToString() for e in experiences]


def rank_state(backend: TrainerBackend) -> RankState:
    # named_weights is a collective: every rank iterates it to the end, in the same order.
    digest = weights_digest(backend.named_weights())
    return RankState(
        step=backend.step,
        model_version=backend.model_version,
        weights_digest=digest,
        learning_rate=backend.learning_rate,
    )


def run_command(backend: TrainerBackend, method: str, args: tuple[Any, ...]) -> Any:
    """A follower's part of `method`; its result travels back to rank 0 (pickled)."""
    if method == "train_step":
        return backend.train_step([common_pb2.Experience.FromString(b) for b in args[0]])
    if method == "named_weights":
        for _ in backend.named_weights():
            pass  # the full tensors are rank 0's to publish
        return None
    if method == STATE:
        return rank_state(backend)
    if method in ("save_checkpoint", "save_hf"):
        return str(getattr(backend, method)(*args))
    if method in ("load_checkpoint", "continue_versions_after", "set_learning_rate"):
        return getattr(backend, method)(*args)
    raise ValueError(f"unknown trainer rank command {method!r}")
