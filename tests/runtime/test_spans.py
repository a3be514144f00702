"""Spans: timed into a bounded log, sent on the reporter's next event, long phases announced as they begin and end,
and said for people."""

from __future__ import annotations

import threading
import time

from trinity.clients.gateway import RunReporter
from trinity.runtime.spans import Envelope, SpanLog, describe, phase_name, running, span_json
from trinity.v1 import gateway_pb2


class RecordingGateway:
    """What a RunReporter calls of a GatewayClient: `report`, recorded."""

    def __init__(self) -> None:
        self.events: list[gateway_pb2.RunEvent] = []

    def report(self, event: gateway_pb2.RunEvent) -> gateway_pb2.ReportEventResponse:
        self.events.append(event)
        return gateway_pb2.ReportEventResponse(run_active=True)


def test_a_timed_block_is_a_span_of_its_step_and_version_from_its_start_to_its_end():
    log = SpanLog()
    before = time.time_ns() // 1_000_000
    with log.timed(gateway_pb2.PHASE_LEASE, step=3, model_version=2, detail="8 tasks"):
        time.sleep(0.02)
    (span,) = log.drain()
    assert (span.phase, span.step, span.model_version, span.detail) == (gateway_pb2.PHASE_LEASE, 3, 2, "8 tasks")
    assert before <= span.start_unix_ms and span.end_unix_ms - span.start_unix_ms >= 19
    assert log.drain() == []  # taken once


def test_a_span_never_ends_before_it_starts():
    log = SpanLog()
    log.add(gateway_pb2.PHASE_PUT, step=1, model_version=0, start_ms=2_000, end_ms=1_000)
    assert log.drain()[0].end_unix_ms == 2_000


def test_a_service_holds_a_bounded_number_of_unreported_spans_dropping_the_oldest():
    log = SpanLog(limit=3)
    for step in range(1, 6):
        log.add(gateway_pb2.PHASE_ROLLOUT, step=step, model_version=0, start_ms=step, end_ms=step)
    assert [span.step for span in log.drain()] == [3, 4, 5]


def test_the_reporter_sends_the_spans_it_holds_on_its_next_event():
    gateway = RecordingGateway()
    reporter = RunReporter(gateway, "run-1", "explorer/e-0", stage=0)  # type: ignore[arg-type]
    with reporter.spans.timed(gateway_pb2.PHASE_ROLLOUT, step=1, model_version=0):
        pass
    reporter.report(gateway_pb2.EVENT_KIND_EXPLORE, step=1, model_version=0)
    reporter.report(gateway_pb2.EVENT_KIND_EXPLORE, step=2, model_version=0)
    assert [len(e.spans) for e in gateway.events] == [1, 0]
    assert gateway.events[0].spans[0].phase == gateway_pb2.PHASE_ROLLOUT


def test_a_long_phase_is_announced_as_it_begins_and_as_it_ends():
    gateway = RecordingGateway()
    reporter = RunReporter(gateway, "run-1", "explorer/e-0", stage=0)  # type: ignore[arg-type]
    with reporter.phase(gateway_pb2.PHASE_ENGINE_START, step=0, model_version=0, detail="vLLM"):
        assert len(gateway.events) == 1  # announced before the work
    begun, ended = gateway.events
    assert {begun.kind, ended.kind} == {gateway_pb2.EVENT_KIND_SPAN}
    assert (begun.spans[0].end_unix_ms, begun.message) == (0, "starting vLLM")
    assert ended.spans[0].end_unix_ms >= ended.spans[0].start_unix_ms == begun.spans[0].start_unix_ms
    assert ended.message.startswith("starting vLLM (") and ended.message.endswith(" s)")


def test_describe_says_what_a_phase_does_in_words():
    evaluating = gateway_pb2.Span(phase=gateway_pb2.PHASE_EVALUATE, model_version=0, detail="160 samples")
    assert describe(evaluating) == "evaluating v0: 160 samples"
    assert describe(gateway_pb2.Span(phase=gateway_pb2.PHASE_MODEL_CONVERT)) == "converting the model"
    done = gateway_pb2.Span(phase=gateway_pb2.PHASE_MODEL_LOAD, start_unix_ms=1_000, end_unix_ms=3_500)
    assert describe(done) == "loading the model (2.5 s)"
    assert phase_name(gateway_pb2.PHASE_FORWARD_BACKWARD) == "forward_backward"
    assert phase_name(99) == "unspecified"  # type: ignore[arg-type]  # a newer peer's phase


def test_running_keeps_the_phase_each_source_began_and_has_not_ended():
    def span(source: str, phase: gateway_pb2.Phase, end: int = 0) -> gateway_pb2.Span:
        return gateway_pb2.Span(source=source, phase=phase, start_unix_ms=1, end_unix_ms=end)

    now = running(
        [
            span("explorer/e-0", gateway_pb2.PHASE_MODEL_CONVERT),
            span("trainer/t", gateway_pb2.PHASE_MODEL_LOAD),
            span("explorer/e-0", gateway_pb2.PHASE_MODEL_CONVERT, end=5),
            span("explorer/e-0", gateway_pb2.PHASE_ENGINE_START),
        ]
    )
    assert {source: s.phase for source, s in now.items()} == {
        "explorer/e-0": gateway_pb2.PHASE_ENGINE_START,
        "trainer/t": gateway_pb2.PHASE_MODEL_LOAD,
    }
    after = running([span("trainer/t", gateway_pb2.PHASE_MODEL_LOAD, end=9)], now)
    assert list(after) == ["explorer/e-0"]


def test_an_envelope_spans_the_first_call_to_the_last_across_threads():
    envelope = Envelope()

    def call(seconds: float) -> None:
        with envelope.timed():
            time.sleep(seconds)

    threads = [threading.Thread(target=call, args=(0.01 * (i + 1),)) for i in range(3)]
    started = time.time_ns() // 1_000_000
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert envelope.start_ms is not None and envelope.end_ms is not None
    assert started <= envelope.start_ms and envelope.end_ms - envelope.start_ms >= 29


def test_a_span_as_json_names_its_phase():
    span = gateway_pb2.Span(phase=gateway_pb2.PHASE_PUT, source="explorer/e-0", step=2, start_unix_ms=5, end_unix_ms=7)
    assert span_json(span) == {
        "phase": "put",
        "source": "explorer/e-0",
        "stage": 0,
        "step": 2,
        "model_version": 0,
        "start_unix_ms": 5,
        "end_unix_ms": 7,
        "detail": "",
    }
