"""What a tracker is given: an event's metrics as points on the run's one x-axis, the run config as flat parameters,
and the run's summary. Pure functions of the gateway's records; no tracker library in here.

The x-axis of every tracker is the train step:
- train metrics at their step (`RunEvent.step`);
- explore metrics at their step (explore step s makes the batch that train step s trains on);
- eval metrics at the `model_version` they evaluated (version v is the weights after train step v);
- steer changes at the train step the gateway recorded them at.
Each kind's metrics are named `<kind>/<metric>` (`train/loss/total`), as in the run's `latest_metrics`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trinity.runtime.events import kind_name
from trinity.v1 import gateway_pb2

# The kinds whose metrics are series, and the event field each is plotted against.
X_AXIS: dict[gateway_pb2.EventKind, str] = {
    gateway_pb2.EVENT_KIND_TRAIN: "step",
    gateway_pb2.EVENT_KIND_EXPLORE: "step",
    gateway_pb2.EVENT_KIND_EVAL: "model_version",
    gateway_pb2.EVENT_KIND_STEER: "step",
}
NAMESPACES = tuple(kind_name(kind) for kind in X_AXIS)  # train, explore, eval, steer


@dataclass(frozen=True)
class Points:
    """One event's metrics: `values` by their full name (`train/loss/total`), all at train step `step`."""

    namespace: str
    step: int
    values: dict[str, float]
    unix_ms: int


def points(event: gateway_pb2.RunEvent) -> Points | None:
    """The event's metrics on the x-axis; None for an event without a series (state, log, weights, ...)."""
    axis = X_AXIS.get(event.kind)
    if axis is None or not event.metrics:
        return None
    namespace = kind_name(event.kind)
    values = {f"{namespace}/{key}": float(value) for key, value in sorted(event.metrics.items())}
    return Points(namespace, int(getattr(event, axis)), values, event.unix_ms)


def seq_order(seq: str) -> tuple[int, int]:
    """A Redis stream entry id (`RunEvent.seq`, "1700000000000-3") as a sortable pair; "" is before every event."""
    ms, _, n = seq.partition("-")
    return int(ms or 0), int(n or 0)


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The run config as `dotted.key -> value` text (lists as JSON), the shape trackers keep parameters in."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_params(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value)
    return flat


def run_summary(run: gateway_pb2.Run) -> dict[str, Any]:
    """What a tracker keeps of an ended run beside its series: outcome, final model path, last metrics."""
    return {
        "run_id": run.id,
        "name": run.name,
        "state": gateway_pb2.RunState.Name(run.state),
        "error": run.error,
        "final_model_path": run.final_model_path,
        "train_step": run.train_step,
        "explore_step": run.explore_step,
        "model_version": run.model_version,
        "latest_metrics": dict(sorted(run.latest_metrics.items())),
    }
