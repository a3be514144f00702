"""Run metrics gathered from the event log: per-step series for training, exploring and evaluation."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trinity.v1 import gateway_pb2


@dataclass
class RunMetrics:
    train: list[dict[str, float]] = field(default_factory=list)
    explore: list[dict[str, float]] = field(default_factory=list)
    eval: list[dict[str, float]] = field(default_factory=list)
    weights: list[dict[str, Any]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)

    def add(self, event: gateway_pb2.RunEvent) -> None:
        row = {"step": float(event.step), "model_version": float(event.model_version), "stage": float(event.stage)}
        row["unix_ms"] = float(event.unix_ms)
        row.update(event.metrics)
        if event.kind in ("train", "explore", "eval"):
            getattr(self, event.kind).append(row)
        elif event.kind == "weights":
            self.weights.append({**row, "message": event.message})
        elif event.kind == "state":
            self.states.append(
                {"state": gateway_pb2.RunState.Name(event.state), "stage": event.stage, "message": event.message}
            )

    @classmethod
    def from_events(cls, events: Iterable[gateway_pb2.RunEvent]) -> RunMetrics:
        metrics = cls()
        for event in events:
            metrics.add(event)
        return metrics

    def series(self, kind: str, key: str) -> list[tuple[float, float]]:
        """(step, value) pairs; eval rows are keyed by the weight version they evaluated."""
        x = "model_version" if kind == "eval" else "step"
        return [(row[x], row[key]) for row in getattr(self, kind) if key in row]
