"""Experience streams through a real Buffer process and a real redis-server."""

from __future__ import annotations

import time

import grpc
import pytest

from tests.buffer.helpers import experience
from trinity.clients import BufferClient
from trinity.config import OperatorConfig, PriorityReplayConfig, StreamConfig
from trinity.v1 import buffer_pb2


@pytest.fixture
def client(buffer_service):
    with BufferClient(buffer_service.address) as c:
        yield c


def test_put_read_ack_round_trip_keeps_every_field(client, unique):
    client.create_stream(StreamConfig(name=unique))
    sent = experience(reward=0.75, model_version=4, tokens=6, components={"format": 1.0})
    assert client.put(unique, [sent]).accepted == 1
    batch = client.read(unique, "c1", 10)
    assert [e for e in batch.experiences] == [sent]
    assert batch.delivery_counts == [1]
    assert client.ack(unique, batch.entry_ids) == 1
    stats = client.stream(unique).stats
    assert (stats.put, stats.delivered, stats.acked, stats.pending) == (1, 1, 1, 0)


def test_duplicate_ids_are_dropped_and_counted(client, unique):
    client.create_stream(StreamConfig(name=unique))
    a, b = experience(id="same"), experience(id="other")
    first = client.put(unique, [a, a, b])
    again = client.put(unique, [a])
    assert first.accepted == 2 and first.dropped["duplicate"] == 1
    assert again.accepted == 0 and again.dropped["duplicate"] == 1
    assert len(client.read(unique, "c", 10)) == 2
    assert client.stream(unique).stats.dropped["duplicate"] == 2


def test_stale_experiences_are_dropped_and_counted_not_delivered(client, unique):
    client.create_stream(StreamConfig(name=unique))
    client.put(unique, [experience(model_version=v) for v in (1, 2, 3, 4, 5)])
    batch = client.read(unique, "c", 10, min_model_version=3)
    assert sorted(e.model_version for e in batch.experiences) == [3, 4, 5]
    assert batch.dropped_stale == 2
    info = client.stream(unique)
    assert info.stats.dropped["stale"] == 2
    assert info.stats.pending == 3  # the stale ones were consumed; the delivered ones await their ack


def test_read_blocks_until_an_entry_arrives_or_returns_empty(client, unique):
    client.create_stream(StreamConfig(name=unique))
    assert len(client.read(unique, "c", 5, block_ms=50)) == 0
    client.put(unique, [experience()])
    assert len(client.read(unique, "c", 5, block_ms=1000)) == 1


def test_unacked_entries_of_a_silent_consumer_are_reclaimed_by_another(client, unique):
    client.create_stream(StreamConfig(name=unique, claim_idle_ms=2000))
    client.put(unique, [experience(id=f"e{i}") for i in range(3)])
    taken = client.read(unique, "dead", 3)
    assert len(taken) == 3
    assert len(client.read(unique, "alive", 3)) == 0  # not idle long enough yet
    time.sleep(2.1)
    again = client.read(unique, "alive", 3)
    assert sorted(e.id for e in again.experiences) == ["e0", "e1", "e2"]
    assert again.reclaimed == 3 and again.delivery_counts == [2, 2, 2]


def test_entries_failing_max_deliveries_go_to_the_dead_letter_stream(client, unique):
    client.create_stream(StreamConfig(name=unique, max_deliveries=2, claim_idle_ms=100_000))
    client.put(unique, [experience(id="poison")])
    for expected_delivery in (1, 2):
        batch = client.read(unique, "c", 1)
        assert batch.delivery_counts == [expected_delivery]
        assert client.nack(unique, "c", batch.entry_ids) == 1
    final = client.read(unique, "c", 1)
    assert len(final) == 0 and final.dead_lettered == 1
    stats = client.stream(unique).stats
    assert stats.dead_letters == 1 and stats.pending == 0


def test_trim_removes_only_acknowledged_entries(client, unique):
    client.create_stream(StreamConfig(name=unique))
    client.put(unique, [experience(id=f"e{i}") for i in range(6)])
    first = client.read(unique, "c", 2)
    client.ack(unique, first.entry_ids)
    client.read(unique, "c", 2)  # delivered, not acknowledged
    assert client.trim(unique) == 2  # max_len 0: everything acknowledged may go, nothing else
    stats = client.stream(unique).stats
    assert stats.length == 4 and stats.pending == 2
    rest = client.read(unique, "c", 10)
    assert sorted(e.id for e in rest.experiences) == ["e4", "e5"]


def test_priority_replay_serves_newest_first_and_retires_after_use_limit(client, unique):
    replay = PriorityReplayConfig(enabled=True, decay=1.5, use_limit=2)
    client.create_stream(StreamConfig(name=unique, priority_replay=replay))
    client.put(unique, [experience(id=f"v{v}", model_version=v) for v in (1, 2, 3)])
    # priorities 3, 2, 1 -> take v3 (now 3 - 1.5 = 1.5) and v2 (now 0.5)
    assert [e.id for e in client.read(unique, "c", 2).experiences] == ["v3", "v2"]
    # priorities: v3 1.5, v1 1, v2 0.5 -> v3 (second use: retired), then v1
    assert [e.id for e in client.read(unique, "c", 2).experiences] == ["v3", "v1"]
    # priorities: v2 0.5, v1 1 - 1.5 = -0.5 -> both, each on its second use, then retired
    assert [e.id for e in client.read(unique, "c", 5).experiences] == ["v2", "v1"]
    assert len(client.read(unique, "c", 5)) == 0


def test_operators_run_on_put_and_drops_are_counted_by_name(client, unique):
    ops = (
        OperatorConfig(name="invalid_reward_filter"),
        OperatorConfig(name="reward_std_filter"),
    )
    client.create_stream(StreamConfig(name=unique, operators=ops))
    flat = [experience(group_id="flat", reward=1.0) for _ in range(4)]
    mixed = [experience(group_id="mixed", reward=r) for r in (0.0, 1.0, 1.0, 0.0)]
    broken = [experience(group_id="mixed", failed=True)]
    reply = client.put(unique, flat + mixed + broken)
    assert reply.accepted == 4
    assert dict(reply.dropped) == {"invalid_reward_filter": 1, "reward_std_filter": 4}
    assert {e.group_id for e in client.read(unique, "c", 10).experiences} == {"mixed"}


@pytest.mark.parametrize(
    ("call", "code", "fragment"),
    [
        (lambda c, s: c.read("missing-stream", "c", 1), grpc.StatusCode.NOT_FOUND, "missing-stream"),
        (lambda c, s: c.read(s, "c", 0), grpc.StatusCode.INVALID_ARGUMENT, "batch_size"),
        (lambda c, s: c.read(s, "", 1), grpc.StatusCode.INVALID_ARGUMENT, "consumer"),
        (lambda c, s: c.read(s, "c", 10_001), grpc.StatusCode.RESOURCE_EXHAUSTED, "batch_size"),
        (lambda c, s: c.read(s, "c", 1, block_ms=-5), grpc.StatusCode.INVALID_ARGUMENT, "block_ms"),
        (lambda c, s: c.put(s, [experience(id="")]), grpc.StatusCode.INVALID_ARGUMENT, "experiences[0].id"),
        (
            lambda c, s: c.put(s, [experience(), experience(id="x", model_version=-1)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "experiences[1].model_version",
        ),
        (
            lambda c, s: c.put(s, [experience() for _ in range(10_001)]),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "experiences",
        ),
    ],
)
def test_bad_requests_get_a_status_naming_the_field(client, unique, call, code, fragment):
    client.create_stream(StreamConfig(name=unique))
    with pytest.raises(grpc.RpcError) as info:
        call(client, unique)
    assert info.value.code() == code
    assert fragment in info.value.details()


def test_misaligned_token_fields_are_refused_with_the_field(client, unique):
    client.create_stream(StreamConfig(name=unique))
    bad = experience(tokens=3)
    bad.logprobs.append(-1.0)
    with pytest.raises(grpc.RpcError) as info:
        client.put(unique, [bad])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "experiences[0].logprobs" in info.value.details()
    assert client.stream(unique).stats.put == 0  # nothing of the refused batch was written


def test_bad_stream_specs_are_invalid_argument(buffer_service, unique):
    import grpc as _grpc

    from trinity.runtime.client import open_channel
    from trinity.v1 import buffer_pb2_grpc

    stub = buffer_pb2_grpc.BufferServiceStub(open_channel(buffer_service.address))
    bad_specs = {
        "spec.name": buffer_pb2.StreamSpec(name="has space"),
        "spec.max_deliveries": buffer_pb2.StreamSpec(name=unique, max_deliveries=-1),
        "spec.operators[0]": buffer_pb2.StreamSpec(
            name=unique, operators=[buffer_pb2.OperatorSpec(name="reward_filter", params={"nope": 1})]
        ),
    }
    for field, spec in bad_specs.items():
        with pytest.raises(_grpc.RpcError) as info:
            stub.CreateStream(buffer_pb2.CreateStreamRequest(spec=spec), timeout=10)
        assert info.value.code() == _grpc.StatusCode.INVALID_ARGUMENT
        assert field in info.value.details(), info.value.details()


def test_unknown_operator_name_lists_the_known_ones(buffer_service, unique):
    from trinity.runtime.client import open_channel
    from trinity.v1 import buffer_pb2_grpc

    stub = buffer_pb2_grpc.BufferServiceStub(open_channel(buffer_service.address))
    spec = buffer_pb2.StreamSpec(name=unique, operators=[buffer_pb2.OperatorSpec(name="reward_filtr")])
    with pytest.raises(grpc.RpcError) as info:
        stub.CreateStream(buffer_pb2.CreateStreamRequest(spec=spec), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reward_std_filter" in info.value.details()
