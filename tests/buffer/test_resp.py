"""The lean RESP path of the stream hot paths: what it sends, what it parses, against a real redis-server."""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import pytest
import redis

from tests.buffer.helpers import experience
from trinity.buffer.streams import resp
from trinity.buffer.streams.experience_stream import ExperienceStream, _xadd
from trinity.config import StreamConfig
from trinity.runtime.redis_server import RedisServer, connect_redis, find_redis_server, free_port, redis_server_command
from trinity.v1 import common_pb2


class _TrickleSocket:
    """Hands out `data` at most `chunk` bytes per receive, to cut replies at every possible place."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self.data, self.chunk, self.pos = data, chunk, 0

    def recv_into(self, view: memoryview) -> int:
        piece = self.data[self.pos : self.pos + min(self.chunk, len(view))]
        view[: len(piece)] = piece
        self.pos += len(piece)
        return len(piece)


def _parse_all(data: bytes, chunk: int, commands: list) -> list:
    reader = resp._Reader(_TrickleSocket(data, chunk), bytearray(16))  # type: ignore[arg-type]
    try:
        replies = [reader.read(command) for command in commands]
        assert reader.pos == reader.end  # nothing read past the last reply
    finally:
        reader.close()
    return replies


def test_pack_sends_what_redis_py_sends():
    conn = redis.Connection()
    payload = bytes(range(256)) * 40
    commands = [
        ("SET", "ünï", b"\x00\r\n", 0, -7, 2**70, 1.5),
        ("XADD", "s", "*", "d", memoryview(payload), "e", payload),
        ("PING",),
    ]
    assert resp.pack(commands) == b"".join(conn.pack_commands(commands))
    with pytest.raises(redis.DataError):
        resp.pack([("SET", "k", True)])


def test_a_packed_xadd_equals_the_plain_command():
    payload = memoryview(b"x" * 5000)
    packed = [_xadd(resp.bulk("trinity:stream:{ü}"), "id-ü", 2**40, payload), _xadd(resp.bulk("k"), "a", 0, b"tiny")]
    plain = [
        ("XADD", "trinity:stream:{ü}", "*", "id", "id-ü", "v", 2**40, "d", payload),
        ("XADD", "k", "*", "id", "a", "v", 0, "d", b"tiny"),
    ]
    assert resp.pack(packed) == resp.pack(plain)


RESP3_REPLIES = (
    b"+OK\r\n"
    b"-NOSCRIPT No matching script\r\n"
    b":-42\r\n"
    b"$-1\r\n"
    b"$0\r\n\r\n"
    b"$4\r\na\r\nb\r\n"
    b"*3\r\n:1\r\n*0\r\n*-1\r\n"
    b"%2\r\n$1\r\nk\r\n,1.5\r\n*1\r\n$1\r\nx\r\n#t\r\n"
    b"~2\r\n_\r\n#f\r\n"
    b"(12345678901234567890\r\n"
    b"!11\r\nERR bad one\r\n"
    b"=8\r\ntxt:text\r\n"
    b">2\r\n$7\r\nmessage\r\n$2\r\nhi\r\n"  # a push message, skipped, before the reply it precedes
    b"|1\r\n$3\r\nttl\r\n:3\r\n$5\r\nvalue\r\n"  # an attribute, then the value it describes
)
RESP3_EXPECTED = [
    b"OK",
    (redis.exceptions.NoScriptError, "No matching script"),
    -42,
    None,
    b"",
    b"a\r\nb",
    [1, [], None],
    {b"k": 1.5, (b"x",): True},
    [None, False],
    12345678901234567890,
    (redis.ResponseError, "bad one"),  # redis-py leaves out the ERR code
    b"text",
    b"value",
]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_every_reply_type_parses_wherever_the_bytes_are_cut(chunk):
    replies = _parse_all(RESP3_REPLIES, chunk, [()] * len(RESP3_EXPECTED))
    for got, expected in zip(replies, RESP3_EXPECTED, strict=True):
        if isinstance(expected, tuple) and isinstance(expected[0], type):
            assert type(got) is expected[0] and str(got) == expected[1]
        else:
            assert got == expected


def _stream_reply(protocol: int, redis_server, stream: str, count: int) -> bytes:
    """The bytes redis-server answers to an XREAD of `stream` over `protocol`."""
    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    conn: Any = client.connection_pool.get_connection()
    try:
        conn.send_packed_command([resp.pack([("XREAD", "COUNT", count, "STREAMS", stream, "0")])])
        data = b""
        conn._sock.settimeout(0.5)
        while True:
            try:
                piece = conn._sock.recv(1 << 20)
            except TimeoutError:
                return data
            if not piece:
                return data
            data += piece
    finally:
        conn.disconnect()
        client.connection_pool.release(conn)


@pytest.mark.parametrize("protocol", [2, 3])
def test_stream_rows_match_redis_py_however_the_reply_is_cut(redis_server, unique, protocol):
    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    sizes = [0, 1, 1000, 20_000, 70_000, 5, 65_536, 3]
    for i, size in enumerate(sizes):
        client.xadd(unique, {"id": f"e{i}\r\n", "v": i, "d": bytes([i]) * size})
    client.xadd(unique, {"other": "layout", "d": b"x"})  # not the Buffer's fields: parsed the general way
    expected = [(entry_id, fields) for entry_id, fields in client.xrange(unique)]
    data = _stream_reply(protocol, redis_server, unique, 100)
    for chunk in (1, 5, 4096, 65_536, 1 << 22):
        (rows,) = _parse_all(data, chunk, [resp.Rows(())])
        assert rows == expected
    assert resp.rows_of(None) == []
    client.delete(unique)


@pytest.mark.parametrize("protocol", [2, 3])
def test_transactions_and_errors_over_a_real_connection(redis_server, unique, protocol):
    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    client.xgroup_create(unique, "g", id="0", mkstream=True)
    client.xadd(unique, {"id": "a", "v": 1, "d": b"payload"})

    def work(session: resp.Session) -> list:
        return session.round_trip(
            [
                resp.Multi(
                    (("INCR", f"{unique}:n"), resp.Rows(("XREADGROUP", "GROUP", "g", "c", "STREAMS", unique, ">")))
                ),
                ("GET", f"{unique}:n"),
                ("XREADGROUP", "GROUP", "nope", "c", "STREAMS", unique, ">"),  # NOGROUP: returned, not raised
            ]
        )

    (incremented, rows), value, error = resp.run(client, work)
    assert incremented == 1 and value == b"1"
    assert [(fields[b"id"], fields[b"d"]) for _, fields in rows] == [(b"a", b"payload")]
    assert isinstance(error, redis.ResponseError) and "NOGROUP" in str(error)
    with pytest.raises(redis.ResponseError, match="NOGROUP"):
        resp.run(client, lambda session: session.call([("XREADGROUP", "GROUP", "nope", "c", "STREAMS", unique, ">")]))
    # a command refused inside MULTI: EXEC is aborted, and the refusal is what is reported
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        resp.run(client, lambda session: session.call([resp.Multi((("INCR", f"{unique}:n"), ("GET",)))]))
    assert client.get(f"{unique}:n") == b"1"
    assert client.ping()  # the pool's connections are still in step after all that
    client.delete(unique, f"{unique}:n")


def test_a_watched_key_changed_by_someone_else_aborts_the_transaction(redis_server, unique):
    client = redis.Redis.from_url(redis_server.url)
    other = redis.Redis.from_url(redis_server.url)

    def work(session: resp.Session) -> object:
        session.call([("WATCH", unique)])
        other.set(unique, "theirs")
        (executed,) = session.call([resp.Multi((("SET", unique, "mine"),))])
        return executed

    assert resp.run(client, work) is None
    assert client.get(unique) == b"theirs"
    client.delete(unique)


def test_a_lost_connection_is_retried_on_a_new_one(redis_server, unique):
    client = connect_redis(redis_server.url)  # the Buffer's client: it retries lost connections
    attempts = []

    def work(session: resp.Session) -> list:
        attempts.append(session.connection)
        if len(attempts) == 1:
            session.connection._sock.close()  # the socket dies under the first attempt
        return session.call([("INCR", unique)])

    assert resp.run(client, work) == [1]
    assert len(attempts) == 2
    assert client.get(unique) == b"1"
    client.delete(unique)


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("direct", [True, False])
def test_the_stream_works_through_redis_py_parser_too(redis_server, unique, monkeypatch, protocol, direct):
    """Connections whose socket is not ours to read (client-side caching wraps them) take redis-py's parser."""
    if not direct:
        monkeypatch.setattr(resp.Session, "__init__", _generic_session_init)
    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    stream = ExperienceStream(client, StreamConfig(name=unique))
    stream.create()
    sent = [experience(id=f"e{i}", tokens=t, model_version=i % 3) for i, t in enumerate((3, 9000, 0, 40_000, 7))]
    put = stream.put(sent + sent[:1])
    assert (put.accepted, put.dropped["duplicate"]) == (5, 1)
    got = stream.read("c", 3, min_model_version=1)
    assert [common_pb2.Experience.FromString(e.payload).id for e in got.entries] == ["e1", "e2", "e4"]
    assert got.dropped_stale == 2
    assert stream.ack([e.entry_id for e in got.entries]) == 3
    stats = stream.stats()
    assert (stats["put"], stats["delivered"], stats["acked"], stats["pending"]) == (5, 3, 3, 0)
    stream.delete()


def _generic_session_init(self: resp.Session, connection: object) -> None:
    self.connection = connection
    self._direct = False


def test_reads_never_deliver_more_than_a_batch_when_entries_are_reclaimed(redis_server, unique):
    """Reclaimed entries come first; the fresh ones the same round trip fetched beyond the batch go back
    undelivered, to be read next, with the counters exact throughout."""
    client = redis.Redis.from_url(redis_server.url)
    stream = ExperienceStream(client, StreamConfig(name=unique, claim_idle_ms=200))
    stream.create()
    stream.put([experience(id=f"e{i}") for i in range(10)])
    abandoned = stream.read("dead", 3)  # e0..e2, never acknowledged
    assert [e.deliveries for e in abandoned.entries] == [1, 1, 1]
    time.sleep(0.3)
    first = stream.read("alive", 4)
    ids = [common_pb2.Experience.FromString(e.payload).id for e in first.entries]
    assert ids == ["e0", "e1", "e2", "e3"]
    assert first.reclaimed == 3 and [e.deliveries for e in first.entries] == [2, 2, 2, 1]
    assert stream.stats()["delivered"] == 7  # 3 + 4: the 3 handed back are not counted
    second = stream.read("alive", 10)
    ids = [common_pb2.Experience.FromString(e.payload).id for e in second.entries]
    assert ids == ["e4", "e5", "e6", "e7", "e8", "e9"]
    assert [e.deliveries for e in second.entries] == [1] * 6  # handed back ones count as first deliveries
    assert stream.ack([e.entry_id for e in first.entries + second.entries]) == 10
    stats = stream.stats()
    assert (stats["delivered"], stats["acked"], stats["pending"], stats["length"]) == (13, 10, 0, 10)
    stream.delete()


def test_stale_entries_are_replaced_from_the_stream_and_counted_once(redis_server, unique):
    client = redis.Redis.from_url(redis_server.url)
    stream = ExperienceStream(client, StreamConfig(name=unique))
    stream.create()
    stream.put([experience(id=f"e{i}", model_version=v) for i, v in enumerate((0, 5, 0, 0, 5, 5, 5, 0, 5))])
    got = stream.read("c", 3, min_model_version=5)
    assert [common_pb2.Experience.FromString(e.payload).id for e in got.entries] == ["e1", "e4", "e5"]
    assert got.dropped_stale == 3
    stats = stream.stats()
    assert (stats["delivered"], stats["pending"], stats["dropped"]) == (3, 3, {"stale": 3})
    stream.delete()


def test_concurrent_round_trips_keep_their_replies_apart(redis_server, unique):
    client = redis.Redis.from_url(redis_server.url)
    errors: list[BaseException] = []

    def hammer(n: int) -> None:
        try:
            for i in range(200):
                payload = bytes([n]) * (i * 997 % 90_000)
                key = f"{unique}:{n}"
                set_reply, got = resp.run(client, lambda s: s.call([("SET", key, payload), ("GET", key)]))  # noqa: B023
                assert set_reply == b"OK" and got == payload
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    client.delete(*[f"{unique}:{n}" for n in range(4)])


def test_a_transaction_refused_while_redis_loads_its_data_is_retryable_not_aborted(tmp_path):
    """A restarted Redis answers LOADING while it reads its data back; inside MULTI each command is refused so and
    EXEC aborts. The refusal reported is BusyLoadingError, a ConnectionError the services' client retries (the
    soak's Redis kill once failed a run with the EXECABORT that hid it)."""
    url_port = free_port()
    url = f"redis://127.0.0.1:{url_port}/0"
    # 5 ms per key while loading (a setting for Redis's own tests): 2,000 keys keep it loading for 10 s, answering
    # clients every KiB of its file read.
    slow_load = ["--key-load-delay", "5000", "--loading-process-events-interval-bytes", "1024"]
    command = [*redis_server_command(find_redis_server(), url_port, tmp_path), *slow_load]
    first = subprocess.Popen(command)
    try:
        RedisServer(url=url).wait_until_ready()
        client = redis.Redis.from_url(url)
        client.mset({f"k{i}": i for i in range(2000)})
        client.bgrewriteaof()  # the keys into the file's snapshot part, which is what the delay slows
        deadline = time.monotonic() + 30
        while (
            client.info("persistence")["aof_rewrite_in_progress"] or client.info("persistence")["aof_rewrite_scheduled"]
        ):
            assert time.monotonic() < deadline, "the append-only file was not rewritten within 30 s"
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait()
    second = subprocess.Popen(command)
    try:
        loading = redis.Redis.from_url(url, socket_timeout=10)  # no retries: the first refusal surfaces
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the restarted redis-server never answered LOADING"
            try:
                loading.ping()
            except redis.BusyLoadingError:
                break
            except redis.ConnectionError:  # not listening yet
                time.sleep(0.02)
        with pytest.raises(redis.BusyLoadingError):
            resp.run(loading, lambda session: session.call([resp.Multi((("INCR", "n"),))]))
    finally:
        second.kill()
        second.wait()


def test_a_group_that_delivered_the_newest_entry_has_no_lag_whatever_redis_estimates(redis_server, unique):
    client = redis.Redis.from_url(redis_server.url)
    stream = ExperienceStream(client, StreamConfig(name=unique))
    stream.create()
    stream.put([experience(id=f"e{i}") for i in range(6)])
    stream.ack([e.entry_id for e in stream.read("c", 6).entries])
    key = stream.keys.stream
    newest = client.xrevrange(key, count=1)[0][0]
    # What a moved last-delivered id or a reload can leave behind: a count of entries read that is too low.
    client.execute_command("XGROUP", "SETID", key, stream.config.group, newest, "ENTRIESREAD", 2)
    assert client.xinfo_groups(key)[0]["lag"] == 4  # Redis's own figure: wrong
    stats = stream.stats()
    assert (stats["lag"], stats["put"], stats["acked"]) == (0, 6, 6)
    stream.delete()
