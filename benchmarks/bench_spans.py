"""What a run's timeline costs per step: timing the phases of one explore step and one train step into spans, sending
them on the step's events, and the gateway keeping them in Redis.

Per step, as the quickstart runs it (8 tasks x 8 samples: 8 reward calls timed, scored a task at a time): the
explorer records weight wait, receive, load, lease, rollout, reward, put; the trainer read batch, prepare,
forward-backward, optimizer, publish. `service_us_per_step` is the CPU both spend recording and serializing them
onto their events (the extra bytes a step's events carry: `bytes_per_step`); `gateway_us_per_step` is the gateway
recording the two events with their spans (in the same Redis call as the event, against a local redis-server with
`appendfsync always`, as `trinity run` starts it) less recording the same events without spans: the extra work of
adding a step's spans to the run's timeline. `overhead_fraction` holds both against the quickstart's ~9 s step.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
import redis.asyncio

from benchmarks.common import percentile, write_result
from trinity.gateway.orchestrator import take_spans
from trinity.gateway.runs import RunStore
from trinity.runtime.redis_server import start_redis_server
from trinity.runtime.spans import Envelope, SpanLog, now_ms
from trinity.trainer.timeline import record_train_step
from trinity.v1 import gateway_pb2

QUICKSTART_STEP_S = 8.94  # benchmarks/results/e2e.json, "ours": seconds per step
REWARD_CALLS = 8  # the quickstart's tasks per step: one score_group call each
KINDS = (gateway_pb2.EVENT_KIND_EXPLORE, gateway_pb2.EVENT_KIND_TRAIN)  # the events that carry a step's spans
METRICS = {f"metric_{i}": float(i) for i in range(30)}  # an explore or train event's usual metrics


def _explore_step(spans: SpanLog, step: int) -> None:
    for phase in (gateway_pb2.PHASE_WEIGHT_WAIT, gateway_pb2.PHASE_WEIGHT_RECEIVE, gateway_pb2.PHASE_WEIGHT_LOAD):
        spans.add(phase, step=step, model_version=step - 1, start_ms=now_ms())
    with spans.timed(gateway_pb2.PHASE_LEASE, step=step, model_version=step - 1):
        pass
    envelope = Envelope()
    with spans.timed(gateway_pb2.PHASE_ROLLOUT, step=step, model_version=step - 1, detail="64 samples"):
        for _ in range(REWARD_CALLS):
            with envelope.timed():
                pass
    assert envelope.start_ms is not None
    spans.add(gateway_pb2.PHASE_REWARD, step=step, model_version=step - 1, start_ms=envelope.start_ms)
    with spans.timed(gateway_pb2.PHASE_PUT, step=step, model_version=step - 1, detail="64 experiences"):
        pass


def _train_step(spans: SpanLog, step: int) -> None:
    start = now_ms()
    spans.add(gateway_pb2.PHASE_READ_BATCH, step=step, model_version=step - 1, start_ms=start)
    timings = {"seconds/prepare": 0.5, "seconds/forward_backward": 3.0, "seconds/optimizer": 0.2}
    record_train_step(spans, start, start + 4_000, timings, step=step, model_version=step - 1)
    with spans.timed(gateway_pb2.PHASE_PUBLISH_WEIGHTS, step=step, model_version=step):
        pass


def _event(kind: gateway_pb2.EventKind, step: int, spans: list[gateway_pb2.Span]) -> gateway_pb2.RunEvent:
    return gateway_pb2.RunEvent(
        run_id="bench", kind=kind, source="explorer/e-0", step=step, metrics=METRICS, event_id="x" * 32, spans=spans
    )


def run(quick: bool = False) -> dict[str, Any]:
    steps = 2_000 if quick else 20_000
    explorer, trainer = SpanLog(), SpanLog()
    # Service side: record a step's spans and serialize the two events that carry them; the same events without
    # spans are the baseline.
    laps, plain_laps, extra_bytes = [], [], 0
    for step in range(1, steps + 1):
        began = time.perf_counter()
        _explore_step(explorer, step)
        _train_step(trainer, step)
        explore = _event(gateway_pb2.EVENT_KIND_EXPLORE, step, explorer.drain()).SerializeToString()
        train = _event(gateway_pb2.EVENT_KIND_TRAIN, step, trainer.drain()).SerializeToString()
        laps.append(time.perf_counter() - began)
        began = time.perf_counter()
        plain = [_event(kind, step, []).SerializeToString() for kind in KINDS]
        plain_laps.append(time.perf_counter() - began)
        extra_bytes = len(explore) + len(train) - sum(map(len, plain))
    service_us = [(a - b) * 1e6 for a, b in zip(laps, plain_laps, strict=True)]
    # Gateway side: take the spans off both events and add them to a run's timeline in a real Redis.
    server = start_redis_server()
    try:
        store = RunStore(redis.Redis.from_url(server.url), redis.asyncio.Redis.from_url(server.url))
        store.create("bench", "{}", run_id="bench")
        gateway_laps = []
        for step in range(1, min(steps, 2_000) + 1):
            _explore_step(explorer, step)
            _train_step(trainer, step)
            events = [_event(kind, step, log.drain()) for kind, log in zip(KINDS, (explorer, trainer), strict=True)]
            plain = [_event(kind, step, []) for kind in KINDS]
            for event in [*events, *plain]:
                event.event_id = uuid.uuid4().hex
            began = time.perf_counter()
            for event in events:
                store.append_once(event, take_spans(event))
            carried = time.perf_counter() - began
            began = time.perf_counter()
            for event in plain:
                store.append_once(event, take_spans(event))
            gateway_laps.append((carried - (time.perf_counter() - began)) * 1e6)
        kept = len(store.spans("bench"))
    finally:
        server.stop()
    service, gateway = percentile(service_us, 50), percentile(gateway_laps, 50)
    result = {
        "quick": quick,
        "steps": steps,
        "spans_per_step": 12,
        "service_us_per_step": {"p50": service, "p90": percentile(service_us, 90)},
        "gateway_us_per_step": {"p50": gateway, "p90": percentile(gateway_laps, 90)},
        "bytes_per_step": extra_bytes,
        "timeline_spans_kept": kept,
        "quickstart_step_seconds": QUICKSTART_STEP_S,
        "overhead_fraction": {
            "services": service * 1e-6 / QUICKSTART_STEP_S,
            "gateway": gateway * 1e-6 / QUICKSTART_STEP_S,
        },
    }
    write_result("spans", result)
    return result


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
