"""A run's timeline: spans ride on reported events, the gateway keeps the finished ones with the run (bounded) and
records the events without them, and GetRunSpans (the SDK's `spans`) returns them in order of start."""

from __future__ import annotations

import redis
import redis.asyncio

from trinity.clients import GatewayClient
from trinity.gateway import keys
from trinity.gateway.orchestrator import take_spans
from trinity.gateway.runs import RunStore
from trinity.runtime.events import decode_event
from trinity.sdk import TrinityClient
from trinity.v1 import gateway_pb2


def _span(phase: gateway_pb2.Phase, step: int, start: int, end: int) -> gateway_pb2.Span:
    return gateway_pb2.Span(phase=phase, step=step, start_unix_ms=start, end_unix_ms=end)


def _store(redis_server, **kwargs) -> RunStore:
    return RunStore(redis.Redis.from_url(redis_server.url), redis.asyncio.Redis.from_url(redis_server.url), **kwargs)


def test_a_step_event_leaves_its_spans_to_the_timeline_marked_with_its_source_and_stage():
    event = gateway_pb2.RunEvent(kind=gateway_pb2.EVENT_KIND_TRAIN, source="trainer/t", stage=1)
    event.spans.extend([_span(gateway_pb2.PHASE_READ_BATCH, 2, 10, 20), _span(gateway_pb2.PHASE_OPTIMIZER, 2, 30, 40)])
    timeline = take_spans(event)
    assert not event.spans  # recorded without them
    assert [(s.source, s.stage, s.phase) for s in timeline] == [
        ("trainer/t", 1, gateway_pb2.PHASE_READ_BATCH),
        ("trainer/t", 1, gateway_pb2.PHASE_OPTIMIZER),
    ]


def test_a_phase_event_keeps_its_span_for_watchers_and_only_a_finished_one_joins_the_timeline():
    begun = gateway_pb2.RunEvent(kind=gateway_pb2.EVENT_KIND_SPAN, source="explorer/e")
    begun.spans.append(gateway_pb2.Span(phase=gateway_pb2.PHASE_ENGINE_START, start_unix_ms=5))
    assert take_spans(begun) == []
    assert begun.spans[0].source == "explorer/e"  # watchers see who is starting


def test_the_timeline_keeps_the_newest_spans_by_step(redis_server, unique):
    store = _store(redis_server, timeline_spans=4)
    store.create(unique, "{}", run_id=unique)
    for step in range(1, 4):  # two spans a step: 6 reported, 4 kept
        event = gateway_pb2.RunEvent(run_id=unique, kind=gateway_pb2.EVENT_KIND_EXPLORE, event_id=f"e{step}")
        spans = [_span(gateway_pb2.PHASE_LEASE, step, 100 * step, 100 * step + 5)]
        spans.append(_span(gateway_pb2.PHASE_PUT, step, 100 * step + 5, 100 * step + 9))
        store.append_once(event, spans)
    assert [s.step for s in store.spans(unique)] == [2, 2, 3, 3]
    assert [s.step for s in store.spans(unique, since_step=3)] == [3, 3]
    store.add_spans(unique, [_span(gateway_pb2.PHASE_LEASE, 4, 500, 505)])  # events without an id take this way
    assert [s.step for s in store.spans(unique)] == [2, 3, 3, 4]


def test_a_span_reported_twice_is_kept_once(redis_server, unique):
    store = _store(redis_server)
    store.create(unique, "{}", run_id=unique)
    span = _span(gateway_pb2.PHASE_PUT, 1, 10, 20)
    store.add_spans(unique, [span])
    store.add_spans(unique, [span])  # a report retried after a lost reply
    assert len(store.spans(unique)) == 1


def test_spans_reported_through_the_gateway_come_back_from_the_sdk_in_order_of_start(gateway, redis_server, unique):
    with TrinityClient(gateway.address) as client, GatewayClient(gateway.address) as reporter:
        run_id = client._call("CreateRun", gateway_pb2.CreateRunRequest(config_yaml=_config(unique), run_id=unique)).id
        event = gateway_pb2.RunEvent(run_id=run_id, kind=gateway_pb2.EVENT_KIND_EXPLORE, source="explorer/e", step=1)
        event.spans.extend([_span(gateway_pb2.PHASE_PUT, 1, 300, 310), _span(gateway_pb2.PHASE_LEASE, 1, 100, 110)])
        reporter.report(event)
        spans = client.run(run_id).spans()
        assert [(s.phase, s.source) for s in spans] == [
            (gateway_pb2.PHASE_LEASE, "explorer/e"),
            (gateway_pb2.PHASE_PUT, "explorer/e"),
        ]
        assert client.spans(run_id, since_step=2) == []
        client.run(run_id).cancel("test over")  # the gateway is shared, and refuses runs beyond its limit of pending
    raw = redis.Redis.from_url(redis_server.url).xrange(keys.events(run_id))
    recorded = [decode_event(fields[b"e"]) for _, fields in raw]
    assert [len(e.spans) for e in recorded if e.kind == gateway_pb2.EVENT_KIND_EXPLORE] == [0]


def _config(name: str) -> str:
    from tests.gateway.run_harness import run_config

    return run_config(name=name)
