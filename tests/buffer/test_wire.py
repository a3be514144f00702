"""The wire-level passthrough: what clients receive parses to exactly what they stored."""

from __future__ import annotations

import pytest
import redis

from trinity.buffer.keys import StreamKeys
from trinity.buffer.streams import resp
from trinity.buffer.streams.experience_stream import DeliveredEntry, ExperienceStream
from trinity.buffer.wire import PutExperiencesWire, encode_read_response, field_slices, varint
from trinity.clients import BufferClient
from trinity.clients.buffer import _put_request_bytes
from trinity.config import StreamConfig
from trinity.v1 import buffer_pb2, common_pb2


def full_experience(id: str = "exp-1", tokens: int = 300) -> common_pb2.Experience:
    """Every field of Experience set to a non-default value (checked below, so new fields are not missed)."""
    return common_pb2.Experience(
        id=id,
        kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
        run_id="run-7",
        taskset="math",
        task_id="math/12",
        group_id="g-3",
        model_version=2**40,  # needs a multi-byte varint
        prompt_token_ids=[0, 1, 127, 128, 2**31 - 1, -1],
        response_token_ids=list(range(tokens)),
        logprobs=[-0.25] * tokens,
        action_mask=[t % 3 != 0 for t in range(tokens)],
        token_rewards=[0.5] * tokens,
        teacher_logprobs=[-0.75] * tokens,
        reward=0.875,
        reward_components={"format": 1.0, "accuracy": 0.75},
        metrics={"length": 300.0},
        info={"source": "unit test", "ünïcode": "✓"},
        prompt_text="What is 2+2?",
        response_text="4",
        messages=[common_pb2.ChatMessage(role="user", content="hi", name="n")],
        preference=common_pb2.Preference(rejected_token_ids=[5, 6], rejected_text="5"),
        episode_id="ep-1",
        step_index=3,
        state_key="s0",
        finish_reason="stop",
        failed=True,
        error="reward raised",
        created_unix_ms=1_700_000_000_000,
    )


def test_the_full_experience_sets_every_field():
    every = {f.name for f in common_pb2.Experience.DESCRIPTOR.fields}
    assert {f.name for f, _ in full_experience().ListFields()} == every


def test_varint_matches_protobuf_for_edge_values():
    for value in (1, 127, 128, 300, 16_383, 16_384, 2**31 - 1, 2**63 - 1, -1, -(2**63)):
        encoded = common_pb2.Experience(model_version=value).SerializeToString(deterministic=True)  # int64 field 7
        assert encoded == b"\x38" + varint(value)
    assert varint(0) == b"\x00"


def test_encoded_read_response_parses_to_the_message_built_field_by_field():
    stored = [full_experience("a"), full_experience("b", tokens=3000), common_pb2.Experience(id="tiny")]
    entries = [
        DeliveredEntry("1700000000000-0", 1, stored[0].SerializeToString(deterministic=True)),
        DeliveredEntry(
            "9" * 200, 300, stored[1].SerializeToString(deterministic=True)
        ),  # id > 127 bytes, payload > 16 KB
        DeliveredEntry("1-1", 0, stored[2].SerializeToString(deterministic=True)),
    ]
    encoded = encode_read_response(entries, dropped_stale=2, reclaimed=129, dead_lettered=0)
    expected = buffer_pb2.ReadExperiencesResponse(dropped_stale=2, reclaimed=129)
    for entry, experience in zip(entries, stored, strict=True):
        expected.items.add(entry_id=entry.entry_id, delivery_count=entry.deliveries, experience=experience)
    assert buffer_pb2.ReadExperiencesResponse.FromString(encoded) == expected
    assert encoded == expected.SerializeToString(deterministic=True)  # byte-identical to protobuf's own encoding here


def test_an_empty_read_encodes_to_an_empty_message():
    assert encode_read_response([]) == b""


def test_put_request_payloads_are_each_experience_as_sent():
    sent = [full_experience("a"), full_experience("b", tokens=5)]
    data = buffer_pb2.PutExperiencesRequest(stream="s", experiences=sent).SerializeToString(deterministic=True)
    wire = PutExperiencesWire.from_bytes(data)
    assert list(wire.request.experiences) == sent
    assert wire.payloads is not None
    assert [bytes(p) for p in wire.payloads] == [e.SerializeToString(deterministic=True) for e in sent]


def test_field_slices_skip_fields_of_every_wire_type_and_give_up_on_groups():
    unknown = b"\x98\x06\x05" + b"\xa1\x06" + bytes(8) + b"\xad\x06" + bytes(4) + b"\xa2\x06\x02hi"
    data = b"\x0a\x01s" + unknown + b"\x12\x03abc" + b"\x12\x00"
    assert [bytes(p) for p in field_slices(data, 0x12) or []] == [b"abc", b""]
    assert field_slices(b"\xa3\x06\xa4\x06", 0x12) is None  # start/end group: not walked


def test_client_put_bytes_equal_the_generated_serialization():
    sent = [full_experience("a"), full_experience("b", tokens=0)]
    expected = buffer_pb2.PutExperiencesRequest(stream="stream-ü", experiences=sent).SerializeToString(
        deterministic=True
    )
    assert _put_request_bytes("stream-ü", sent) == expected
    assert _put_request_bytes("", []) == b""


def test_through_the_buffer_the_client_reads_exactly_the_bytes_it_put(buffer_service, redis_server, unique):
    sent = [full_experience("a"), full_experience("b", tokens=4000)]
    with BufferClient(buffer_service.address) as client:
        client.create_stream(StreamConfig(name=unique))
        assert client.put(unique, sent).accepted == 2
        batch = client.read(unique, "c", 10)
    assert batch.experiences == sent
    stored = redis.Redis.from_url(redis_server.url).xrange(StreamKeys(unique).stream)
    assert [fields[b"d"] for _, fields in stored] == [e.SerializeToString(deterministic=True) for e in sent]
    assert [e.SerializeToString(deterministic=True) for e in batch.experiences] == [
        fields[b"d"] for _, fields in stored
    ]


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        (["a", "b", "c"], ["a", "b", "c"]),  # no id twice: the one-round-trip try
        (["a", "b", "a"], ["a", "b"]),  # an id twice: the two-step path
    ],
)
def test_a_put_that_loses_the_watch_race_is_appended_once_by_the_script(
    redis_server, unique, monkeypatch, ids, expected
):
    client = redis.Redis.from_url(redis_server.url)
    stream = ExperienceStream(client, StreamConfig(name=unique))
    stream.create()
    intruder = redis.Redis.from_url(redis_server.url)
    round_trip = resp.Session.round_trip

    def interfering(session: resp.Session, commands: list) -> list:
        """Another put touches the seen-set between the WATCH and the MULTI (sent in the same round trip
        or not, the MULTI goes in a round trip of its own here, after the intrusion)."""
        at = next((i for i, c in enumerate(commands) if isinstance(c, resp.Multi)), None)
        if at is None:
            return round_trip(session, commands)
        before = round_trip(session, commands[:at]) if at else []
        intruder.zadd(stream.keys.seen, {"someone-else": 1})
        return before + round_trip(session, commands[at:])

    monkeypatch.setattr(resp.Session, "round_trip", interfering)
    batch = [full_experience(i) for i in ids]
    payloads = [e.SerializeToString(deterministic=True) for e in batch]
    assert stream._append_optimistic(batch, payloads) is None  # the race is detected ...
    assert client.xlen(stream.keys.stream) == 0  # ... and nothing was written
    result = stream.put(batch, payloads=payloads)  # put falls back to the atomic script
    assert (result.accepted, result.dropped["duplicate"]) == (len(expected), len(ids) - len(expected))
    assert [fields[b"id"] for _, fields in client.xrange(stream.keys.stream)] == [i.encode() for i in expected]
    assert stream.put(batch).accepted == 0
    stream.delete()


def test_a_put_of_ids_seen_before_appends_only_the_new_ones(redis_server, unique):
    """The one-round-trip try aborts when an id was seen; the two-step path then sorts them out."""
    client = redis.Redis.from_url(redis_server.url)
    stream = ExperienceStream(client, StreamConfig(name=unique))
    stream.create()
    assert stream.put([full_experience("a"), full_experience("b")]).accepted == 2
    result = stream.put([full_experience("c"), full_experience("b"), full_experience("d")])
    assert (result.accepted, result.dropped["duplicate"]) == (2, 1)
    assert len(result.entry_ids) == 2
    assert [fields[b"id"] for _, fields in client.xrange(stream.keys.stream)] == [b"a", b"b", b"c", b"d"]
    stats = stream.stats()
    assert (stats["put"], stats["dropped"]) == (4, {"duplicate": 1})
    stream.delete()
    assert not client.exists(*stream.keys.all())  # the guard the aborted try wrote goes too


def test_reads_work_over_both_redis_protocols(redis_server, unique):
    for protocol in (2, 3):
        client = redis.Redis.from_url(redis_server.url, protocol=protocol)
        stream = ExperienceStream(client, StreamConfig(name=f"{unique}-{protocol}"))
        stream.create()
        sent = [full_experience("a", tokens=2), full_experience("b", tokens=2)]
        assert stream.put(sent).accepted == 2
        got = stream.read("c", 10)
        assert [common_pb2.Experience.FromString(e.payload) for e in got.entries] == sent
        assert len(stream.read("c", 10).entries) == 0
        stream.delete()
