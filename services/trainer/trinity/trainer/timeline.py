"""A train step on the run's timeline (docs/console.md, "Timeline").

The step itself runs in the backend, possibly in other processes (Megatron's workers, data-parallel ranks), so it
times its parts into its metrics (`STEP_PHASES`: seconds summed over the step's updates), and the runner, which
times the whole step, lays them out as spans: prepare, forward-backward, optimizer from the step's start (exact with
one update per step; with several, the updates' forward-backward and optimizer times each as one span), and the
checkpoint the backend wrote at the step's end.
"""

from __future__ import annotations

from trinity.runtime.spans import SpanLog
from trinity.v1 import gateway_pb2

PREPARE_KEY = "seconds/prepare"
FORWARD_BACKWARD_KEY = "seconds/forward_backward"
OPTIMIZER_KEY = "seconds/optimizer"
CHECKPOINT_KEY = "seconds/checkpoint"
# In the order a step runs them.
STEP_PHASES = (
    (PREPARE_KEY, gateway_pb2.PHASE_PREPARE),
    (FORWARD_BACKWARD_KEY, gateway_pb2.PHASE_FORWARD_BACKWARD),
    (OPTIMIZER_KEY, gateway_pb2.PHASE_OPTIMIZER),
)


def record_train_step(
    spans: SpanLog, start_ms: int, end_ms: int, metrics: dict[str, float], *, step: int, model_version: int
) -> None:
    """The spans of train step `step`, which ran from `start_ms` to `end_ms` on weights `model_version`; none past
    `end_ms`."""
    at = start_ms
    for key, phase in STEP_PHASES:
        if key in metrics:
            end = min(end_ms, at + round(metrics[key] * 1000))
            spans.add(phase, step=step, model_version=model_version, start_ms=at, end_ms=end)
            at = end
    if CHECKPOINT_KEY in metrics:
        begun = max(at, end_ms - round(metrics[CHECKPOINT_KEY] * 1000))
        spans.add(gateway_pb2.PHASE_CHECKPOINT, step=step, model_version=model_version, start_ms=begun, end_ms=end_ms)
