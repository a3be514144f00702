"""A train step on the run's timeline: the step times its parts, the runner lays them out as spans in step order."""

from __future__ import annotations

from pathlib import Path

from trainer_helpers import random_rollouts, run_config

from trinity.runtime.spans import SpanLog
from trinity.trainer.timeline import CHECKPOINT_KEY, STEP_PHASES, record_train_step
from trinity.trainer.torch_backend import TorchBackend
from trinity.v1 import gateway_pb2


def test_a_step_reports_how_long_each_of_its_parts_took(tiny_model: Path) -> None:
    backend = TorchBackend(run_config(tiny_model, "grpo", kl_coef=0.0, mini_batch_size=2))  # two updates
    metrics = backend.train_step(random_rollouts(4, seed=3))
    parts = [metrics[key] for key, _ in STEP_PHASES]
    assert all(seconds > 0 for seconds in parts)
    assert sum(parts) <= metrics["step_seconds"] + 1e-6


def test_the_parts_of_a_step_are_laid_out_in_order_within_it() -> None:
    spans = SpanLog()
    metrics = {"seconds/prepare": 0.1, "seconds/forward_backward": 0.5, "seconds/optimizer": 0.2, CHECKPOINT_KEY: 0.3}
    record_train_step(spans, 1_000, 2_200, metrics, step=4, model_version=3)
    laid = [(s.phase, s.start_unix_ms, s.end_unix_ms) for s in spans.drain()]
    assert laid == [
        (gateway_pb2.PHASE_PREPARE, 1_000, 1_100),
        (gateway_pb2.PHASE_FORWARD_BACKWARD, 1_100, 1_600),
        (gateway_pb2.PHASE_OPTIMIZER, 1_600, 1_800),
        (gateway_pb2.PHASE_CHECKPOINT, 1_900, 2_200),  # the backend writes it as the step ends
    ]


def test_no_part_of_a_step_ends_after_the_step() -> None:
    spans = SpanLog()
    record_train_step(
        spans, 1_000, 1_050, {"seconds/prepare": 0.04, "seconds/forward_backward": 0.04}, step=1, model_version=0
    )
    assert max(s.end_unix_ms for s in spans.drain()) == 1_050
