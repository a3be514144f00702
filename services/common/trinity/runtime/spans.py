"""A run's timeline: what each service was doing when (`trinity.v1.Span`; docs/console.md, "Timeline").

A service times its phases into a `SpanLog`; its `RunReporter` sends the spans it holds on the next event it
reports anyway (one train or explore event per step), so a step's timing costs no call of its own. The long phases
people wait on (start-up, evaluation) are announced as they begin and as they end (`RunReporter.phase`: one
EVENT_KIND_SPAN each), so `trinity run` and the console can say what a run does before its first step (`describe`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from trinity.v1 import gateway_pb2

PREFIX = "PHASE_"
PENDING_SPANS = 1000  # spans a service holds between two events; past it the oldest are dropped

# What a phase is doing, as people read it while it runs; `{detail}` and `{version}` come from the span.
_DOING = {
    gateway_pb2.PHASE_MODEL_CONVERT: "converting the model",
    gateway_pb2.PHASE_ENGINE_START: "starting {detail}",
    gateway_pb2.PHASE_MODEL_LOAD: "loading the model",
    gateway_pb2.PHASE_SYNC_FORM: "waiting for {detail} to join the weight sync",
    gateway_pb2.PHASE_WEIGHT_WAIT: "waiting for v{version}",
    gateway_pb2.PHASE_WEIGHT_RECEIVE: "receiving v{version}",
    gateway_pb2.PHASE_WEIGHT_LOAD: "loading v{version}",
    gateway_pb2.PHASE_LEASE: "leasing tasks",
    gateway_pb2.PHASE_ROLLOUT: "rolling out",
    gateway_pb2.PHASE_REWARD: "scoring",
    gateway_pb2.PHASE_PUT: "putting experiences",
    gateway_pb2.PHASE_EVALUATE: "evaluating v{version}: {detail}",
    gateway_pb2.PHASE_READ_BATCH: "reading a batch",
    gateway_pb2.PHASE_PREPARE: "preparing the batch",
    gateway_pb2.PHASE_FORWARD_BACKWARD: "forward and backward",
    gateway_pb2.PHASE_OPTIMIZER: "stepping the optimizer",
    gateway_pb2.PHASE_CHECKPOINT: "writing a checkpoint",
    gateway_pb2.PHASE_PUBLISH_WEIGHTS: "publishing v{version}",
    gateway_pb2.PHASE_EXPORT: "exporting the final model",
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def phase_name(phase: gateway_pb2.Phase) -> str:
    """`PHASE_ROLLOUT` -> `rollout`; `unspecified` for 0 and for a phase this build does not know (a newer peer's)."""
    name = gateway_pb2.Phase.Name(phase) if phase in gateway_pb2.Phase.values() else "PHASE_UNSPECIFIED"
    return name.removeprefix(PREFIX).lower()


def describe(span: gateway_pb2.Span) -> str:
    """The span for people: "starting vLLM" while it runs, "starting vLLM (12.3 s)" once it has ended."""
    template = _DOING.get(span.phase, phase_name(span.phase))
    text = template.format(detail=span.detail, version=span.model_version).removesuffix(": ")
    if span.end_unix_ms:
        text += f" ({(span.end_unix_ms - span.start_unix_ms) / 1000:.1f} s)"
    return text


def span_json(span: gateway_pb2.Span) -> dict[str, object]:
    """A span as the console's API and `trinity run`'s timeline.json write it (`phase` by its short name)."""
    return {
        "phase": phase_name(span.phase),
        "source": span.source,
        "stage": span.stage,
        "step": span.step,
        "model_version": span.model_version,
        "start_unix_ms": span.start_unix_ms,
        "end_unix_ms": span.end_unix_ms,
        "detail": span.detail,
    }


def running(
    spans: Iterable[gateway_pb2.Span], current: dict[str, gateway_pb2.Span] | None = None
) -> dict[str, gateway_pb2.Span]:
    """The phase each source is in after `spans` (in the order they were reported), from `current` on: the last
    one it began and has not ended, by source; a source whose phases all ended is left out."""
    current = dict(current or {})
    for span in spans:
        key = span.source
        if not span.end_unix_ms:
            current[key] = span
        elif key in current and current[key].phase == span.phase:
            del current[key]
    return current


class SpanLog:
    """A service's finished spans not yet reported: safe to add to from any thread, bounded (`limit`, oldest
    dropped), taken all at once by the reporter (`drain`)."""

    def __init__(self, limit: int = PENDING_SPANS) -> None:
        self._pending: deque[gateway_pb2.Span] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def add(
        self,
        phase: gateway_pb2.Phase,
        *,
        step: int,
        model_version: int,
        start_ms: int,
        end_ms: int | None = None,
        detail: str = "",
    ) -> None:
        """A phase that ran from `start_ms` to `end_ms` (now when None)."""
        end = now_ms() if end_ms is None else end_ms
        span = gateway_pb2.Span(
            phase=phase,
            step=step,
            model_version=model_version,
            start_unix_ms=start_ms,
            end_unix_ms=max(end, start_ms),  # never before its start, whatever the clock did
            detail=detail,
        )
        with self._lock:
            self._pending.append(span)

    @contextmanager
    def timed(self, phase: gateway_pb2.Phase, *, step: int, model_version: int, detail: str = "") -> Iterator[None]:
        """`with log.timed(PHASE_LEASE, step=3, model_version=2):` records the block as a span, also when it raises."""
        start = now_ms()
        try:
            yield
        finally:
            self.add(phase, step=step, model_version=model_version, start_ms=start, detail=detail)

    def drain(self) -> list[gateway_pb2.Span]:
        with self._lock:
            spans = list(self._pending)
            self._pending.clear()
        return spans


class Envelope:
    """The first start and the last end of calls timed from many threads at once (a step's reward calls): one
    span for work that interleaves with other work."""

    def __init__(self) -> None:
        self.start_ms: int | None = None
        self.end_ms: int | None = None
        self._lock = threading.Lock()

    @contextmanager
    def timed(self) -> Iterator[None]:
        start = now_ms()
        try:
            yield
        finally:
            end = now_ms()
            with self._lock:
                self.start_ms = start if self.start_ms is None else min(self.start_ms, start)
                self.end_ms = end if self.end_ms is None else max(self.end_ms, end)
