"""Run metrics gathered from the event log: per-step series for training, exploring and evaluation."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trinity.runtime.events import kind_name
from trinity.v1 import gateway_pb2

# The kinds whose events are series of metrics, one row per event (RunMetrics.train, .explore, .eval).
SERIES_KINDS = frozenset({gateway_pb2.EVENT_KIND_TRAIN, gateway_pb2.EVENT_KIND_EXPLORE, gateway_pb2.EVENT_KIND_EVAL})


@dataclass
class RunMetrics:
    train: list[dict[str, float]] = field(default_factory=list)
    explore: list[dict[str, float]] = field(default_factory=list)
    eval: list[dict[str, float]] = field(default_factory=list)
    weights: list[dict[str, Any]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)  # EVENT_KIND_WARNING: a check past its limit

    def add(self, event: gateway_pb2.RunEvent) -> None:
        row = {"step": float(event.step), "model_version": float(event.model_version), "stage": float(event.stage)}
        row["unix_ms"] = float(event.unix_ms)
        row.update(event.metrics)
        if event.kind in SERIES_KINDS:
            self.rows(event.kind).append(row)
        elif event.kind == gateway_pb2.EVENT_KIND_WEIGHTS:
            self.weights.append({**row, "message": event.message})
        elif event.kind == gateway_pb2.EVENT_KIND_WARNING:
            self.warnings.append({"step": event.step, "source": event.source, "message": event.message})
        elif event.kind == gateway_pb2.EVENT_KIND_STATE:
            self.states.append(
                {"state": gateway_pb2.RunState.Name(event.state), "stage": event.stage, "message": event.message}
            )

    @classmethod
    def from_events(cls, events: Iterable[gateway_pb2.RunEvent]) -> RunMetrics:
        metrics = cls()
        for event in events:
            metrics.add(event)
        return metrics

    def rows(self, kind: gateway_pb2.EventKind) -> list[dict[str, float]]:
        """The rows of EVENT_KIND_TRAIN, _EXPLORE or _EVAL events, in the order they came."""
        if kind not in SERIES_KINDS:
            raise ValueError(f"{kind_name(kind)} events are no series of metrics (train, explore and eval events are)")
        return {gateway_pb2.EVENT_KIND_TRAIN: self.train, gateway_pb2.EVENT_KIND_EXPLORE: self.explore}.get(
            kind, self.eval
        )

    def series(self, kind: gateway_pb2.EventKind, key: str) -> list[tuple[float, float]]:
        """(step, value) pairs of `kind`'s metric `key`; eval rows are keyed by the weight version they evaluated."""
        x = "model_version" if kind == gateway_pb2.EVENT_KIND_EVAL else "step"
        return [(row[x], row[key]) for row in self.rows(kind) if key in row]
