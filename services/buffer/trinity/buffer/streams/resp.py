"""A lean RESP round trip for the stream hot paths, on redis-py's own pooled connections.

redis-py packs and parses in pure Python, one object and several calls per reply element: on the
benchmark machine (docs/benchmarks.md) 2.6 ms of CPU went to a pipeline of 64 XADDs of 7.4 KB payloads,
and 1.4 ms to parsing one XREADGROUP of 64 entries, more than Redis itself spent on them. Here a batch
of commands is packed into one buffer and sent with one `sendall`, and the replies are parsed out of
one reused receive buffer; stream entries of the layout the Buffer writes without building nested lists.

Everything else stays redis-py's: the connection pool, connecting (AUTH, HELLO, SELECT, TLS), health
checks, and the retry policy for lost connections. Both protocols are read (RESP2 and RESP3).

A command is a sequence of arguments (str, bytes, memoryview, int, float), or `Packed` (already in
RESP form), `Rows` (a stream read: its reply comes back as rows) or `Multi` (a transaction).
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis._parsers import BaseParser

T = TypeVar("T")

Arg = bytes | bytearray | memoryview | str | int | float
Command = Sequence[Arg]  # also `Packed`, `Rows`, `Multi` (see there)

_CRLF = b"\r\n"
_INLINE = 1024  # arguments this long or longer go into the request once, not through a header first
_RECV_SIZE = 65536
_KEEP_BUFFER = 4 << 20  # receive buffers up to this size are kept for the next round trip
_buffers: list[bytearray] = []  # one per round trip in flight at once (list.pop/append are atomic)


def pack(commands: Sequence[Command]) -> bytes:
    """The RESP request for `commands`, all in one buffer (payloads are copied once, here)."""
    parts: list[bytes | bytearray | memoryview] = []
    _pack_into(parts, commands)
    return b"".join(parts)


def _pack_into(parts: list[bytes | bytearray | memoryview], commands: Sequence[Command]) -> None:
    append = parts.append
    for command in commands:
        kind = type(command)
        if kind is Packed:
            parts += command  # type: ignore[arg-type]
            continue
        if kind is Multi:
            _pack_into(parts, [("MULTI",), *command, ("EXEC",)])  # type: ignore[list-item]
            continue
        append(b"*%d\r\n" % len(command))
        for arg in command:
            data: bytes | bytearray | memoryview
            arg_type = type(arg)  # exact types first: the common cases, and cheaper than isinstance
            if arg_type is str:
                data = arg.encode()  # type: ignore[union-attr]
            elif arg_type is bytes:
                data = arg  # type: ignore[assignment]
            elif arg_type is int:
                data = b"%d" % arg  # type: ignore[str-format]
            else:
                data = _other(arg)
            if len(data) < _INLINE:
                append(b"$%d\r\n%b\r\n" % (len(data), data))  # type: ignore[str-format]
            else:  # a payload: not copied into a header first
                append(b"$%d\r\n" % len(data))
                append(data)
                append(_CRLF)


class Packed(tuple):
    """A command already in RESP form: the buffers to send, one after another (see `bulk`)."""

    __slots__ = ()


class Multi(tuple):
    """MULTI, these commands, EXEC: one reply, the list of theirs (`Rows` ones as rows, errors as objects),
    None when a WATCHed key changed (nothing ran), or the error that made Redis refuse the transaction."""

    __slots__ = ()


def bulk(arg: str | bytes) -> bytes:
    """One argument in RESP form, to build `Packed` commands with."""
    data = arg.encode() if isinstance(arg, str) else arg
    return b"$%d\r\n%b\r\n" % (len(data), data)


def _other(arg: Arg) -> bytes | bytearray | memoryview:
    if isinstance(arg, memoryview):
        return arg.cast("B") if arg.format != "B" or arg.ndim != 1 else arg
    if isinstance(arg, bytes | bytearray):
        return arg
    if isinstance(arg, bool):
        raise redis.DataError("bool is not a valid Redis argument; pass an int, str or bytes")
    if isinstance(arg, int):
        return b"%d" % arg
    if isinstance(arg, float):
        return repr(arg).encode()
    if isinstance(arg, str):
        return arg.encode()
    raise redis.DataError(f"Invalid input of type {type(arg).__name__!r}: convert to bytes, str, int or float first")


class _Reader:
    """Parses replies out of a reused receive buffer; bulk strings come out as `bytes`.

    The buffer outlives the round trip (see `_buffers`): a fresh one for each large reply costs a
    page fault for every 4 KiB of it, more than the parsing does.
    """

    __slots__ = ("buf", "end", "pos", "recv_into", "view")

    def __init__(self, sock: socket.socket, buf: bytearray) -> None:
        self.recv_into = sock.recv_into
        self.buf = buf
        self.view = memoryview(buf)
        self.pos = self.end = 0

    def close(self) -> None:
        self.view.release()

    def _fill(self, need: int) -> None:
        """Receive until `need` bytes past `pos` are buffered."""
        buf, pos, end = self.buf, self.pos, self.end
        if pos + need > len(buf):  # no room past `pos`: move the unread bytes to the front, grow if need be
            buf[: end - pos] = buf[pos:end]
            self.pos, self.end = pos, end = 0, end - pos
            if need + _RECV_SIZE > len(buf):
                self.view.release()
                buf += bytes(need + _RECV_SIZE - len(buf))
                self.view = memoryview(buf)
        view, recv_into = self.view, self.recv_into
        while end - pos < need:
            got = recv_into(view[end:])
            if not got:
                raise redis.ConnectionError("Connection closed by server.")
            end += got
        self.end = end

    def _line_end(self) -> int:
        """Where the line at `pos` ends (its CR), receiving more until it is whole."""
        buf = self.buf
        end = buf.find(_CRLF, self.pos, self.end)
        while end < 0:
            scanned = max(0, self.end - self.pos - 1)  # past `pos`, already searched
            self._fill(self.end - self.pos + 1)
            end = buf.find(_CRLF, self.pos + scanned, self.end)
        return end

    def _bulk(self, size: int) -> bytes:
        """`size` bytes at `pos`, then a CRLF."""
        if self.end - self.pos < size + 2:
            self._fill(size + 2)
        pos = self.pos
        self.pos = pos + size + 2
        return bytes(self.view[pos : pos + size])

    def reply(self) -> Any:
        """One top-level reply; out-of-band push messages (RESP3) before it are skipped."""
        while self.peek() == 62:  # '>'
            self.value()
        return self.value()

    def read(self, command: Any) -> Any:
        """The reply to `command` (see `Rows`, `Multi`)."""
        kind = type(command)
        if kind is Rows:
            return self.stream_rows()
        if kind is Multi:
            return self.transaction(command)
        return self.reply()

    def transaction(self, commands: Multi) -> Any:
        """MULTI's reply, one (QUEUED or an error) for each command, then EXEC's (see `Multi`)."""
        started = self.reply()
        queued = [self.reply() for _ in commands]
        while self.peek() == 62:  # '>' push
            self.value()
        if self.peek() != 42:  # not an array: null (WATCH), or an error (EXECABORT)
            return _refused(started, queued, self.value())
        end = self._line_end()
        count = int(self.buf[self.pos + 1 : end])
        self.pos = end + 2
        if count < 0:
            return None
        if count != len(commands):
            raise redis.InvalidResponse(f"EXEC answered {count} replies for {len(commands)} commands")
        return [self.read(command) for command in commands]

    def stream_rows(self) -> list[Row] | redis.RedisError:
        """A one-stream read reply (see `Rows`)."""
        while self.peek() == 62:  # '>' push
            self.value()
        kind = self.peek()
        if kind == 37 or kind == 42:  # '%' map (RESP3) or '*' array (RESP2) of one stream
            end = self._line_end()
            count = int(self.buf[self.pos + 1 : end])
            self.pos = end + 2
            if count < 0:
                return []
            if count != 1:
                raise redis.InvalidResponse(f"expected the reply of a one-stream read, got {count} streams")
            if kind == 42:  # [stream, entries]
                end = self._line_end()
                self.pos = end + 2
            self.value()  # the stream's name
            end = self._line_end()
            entries = int(self.buf[self.pos + 1 : end])
            self.pos = end + 2
            return [self._row() for _ in range(max(entries, 0))]
        return rows_of(self.value())  # null (no entries) or an error

    def _row(self) -> Row:
        """One entry of a stream read: by two regular expressions and a slice in the usual layout."""
        buf, end = self.buf, self.end
        head = _ROW_HEAD.match(buf, self.pos, end)
        if head is not None:
            id_start = head.end()
            id_stop = id_start + int(head[2])
            tail = _ROW_TAIL.match(buf, id_stop, end)
            if tail is not None:
                # Everything out of the buffer before `_bulk`, which may move its contents.
                entry_id, experience_id, version = bytes(head[1]), bytes(buf[id_start:id_stop]), bytes(tail[1])
                self.pos = tail.end()
                return entry_id, {b"id": experience_id, b"v": version, b"d": self._bulk(int(tail[2]))}
        # another layout, or the entry is not all received yet: the general way
        entry_id, fields = self.value()
        return entry_id, field_map(fields)

    def peek(self) -> int:
        if self.pos >= self.end:
            self._fill(1)
        return self.buf[self.pos]

    def value(self) -> Any:
        """The next value. Errors come back as exception objects (not raised), so that every reply is read off."""
        buf = self.buf
        pos = self.pos
        end = buf.find(_CRLF, pos, self.end)
        if end < 0:
            end = self._line_end()
            pos = self.pos
        kind = buf[pos]
        self.pos = end + 2
        if kind == 36:  # '$' bulk string (the common case, so first)
            size = int(buf[pos + 1 : end])
            if size < 0:
                return None
            start = end + 2
            if start + size + 2 > self.end:
                return self._bulk(size)
            self.pos = start + size + 2
            return bytes(buf[start : start + size])
        if kind == 42 or kind == 126 or kind == 62:  # '*' array, '~' set, '>' push
            size = int(buf[pos + 1 : end])
            if size < 0:
                return None
            value = self.value
            return [value() for _ in range(size)]
        rest = buf[pos + 1 : end]
        if kind == 58 or kind == 40:  # ':' integer, '(' big number
            return int(rest)
        if kind == 43:  # '+' simple string
            return bytes(rest)
        if kind == 45:  # '-' error
            return BaseParser.parse_error(rest.decode(errors="replace"))
        if kind == 37:  # '%' map
            value = self.value
            return {_hashable(value()): value() for _ in range(int(rest))}
        if kind == 95:  # '_' null
            return None
        if kind == 44:  # ',' double
            return float(rest)
        if kind == 35:  # '#' boolean
            return rest == b"t"
        if kind == 33:  # '!' blob error
            return BaseParser.parse_error(self._bulk(int(rest)).decode(errors="replace"))
        if kind == 61:  # '=' verbatim string: "txt:" then the text
            return self._bulk(int(rest))[4:]
        if kind == 124:  # '|' attributes: metadata ahead of the value they describe
            for _ in range(2 * int(rest)):
                self.value()
            return self.value()
        raise redis.InvalidResponse(f"Protocol error, got {bytes([kind])!r} as reply type byte")


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


Row = tuple[bytes, dict[bytes, bytes]]


class Rows(tuple):
    """A read of one stream (XREADGROUP, XREAD); its reply comes back as the rows, `[(entry_id, fields)]`,
    over both protocols (`[]` for none), or as the error. The usual layout (fields id, v, d) is parsed
    without building the nested lists."""

    __slots__ = ()


def rows_of(reply: Any) -> list[Row] | redis.RedisError:
    """The rows of a one-stream read reply as parsed generically: `[[stream, rows]]` over RESP2,
    `{stream: rows}` over RESP3, None for none."""
    if not reply or isinstance(reply, redis.RedisError):
        return reply or []
    entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    return [(entry_id, field_map(fields)) for entry_id, fields in entries]


def field_map(fields: Any) -> dict[bytes, bytes]:
    """Stream entry fields as a dict: RESP3 and redis-py give a dict, RESP2 and Lua a flat [k, v, k, v] list."""
    if isinstance(fields, dict):
        return fields
    if fields is None:  # an entry deleted after it was delivered
        return {}
    return {fields[i]: fields[i + 1] for i in range(0, len(fields), 2)}


# One stream entry as Redis sends it, up to the experience id's bytes, then from the CRLF after them to
# the payload's: `*2 $n <entry id> *6 $2 id $n <id> $1 v $n <version> $1 d $n <payload>`.
_ROW_HEAD = re.compile(rb"\*2\r\n\$\d+\r\n(\d+-\d+)\r\n\*6\r\n\$2\r\nid\r\n\$(\d+)\r\n")
_ROW_TAIL = re.compile(rb"\r\n\$1\r\nv\r\n\$\d+\r\n(-?\d+)\r\n\$1\r\nd\r\n\$(\d+)\r\n")


def _refused(started: Any, queued: list[Any], executed: Any) -> Any:
    """EXEC's answer when it is not the replies: None (a WATCHed key changed), or the error to report:
    a command refused while queued says more than EXECABORT."""
    if executed is None:
        return None
    for reply in (started, *queued):
        if isinstance(reply, redis.RedisError):
            return reply
    return executed


def _read_generic(conn: Any, command: Any) -> Any:
    """The reply to `command` (see `Rows`, `Multi`) through redis-py's own parser."""
    kind = type(command)
    if kind is Rows:
        return rows_of(_generic_reply(conn))
    if kind is not Multi:
        return _generic_reply(conn)
    started = _generic_reply(conn)
    queued = [_generic_reply(conn) for _ in command]
    executed = _generic_reply(conn)
    if not isinstance(executed, list):
        return _refused(started, queued, executed)
    return [rows_of(r) if type(c) is Rows else r for c, r in zip(command, executed, strict=True)]


class Session:
    """Round trips on one connection held for the whole of a `run` (a WATCH needs that)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        # A connection whose socket can be read directly; a wrapper (client-side caching) reads
        # through redis-py's own parser instead.
        self._direct = hasattr(connection, "_sock")

    def round_trip(self, commands: Sequence[Command]) -> list[Any]:
        """Send `commands` in one write and return their replies; error replies are returned, not raised."""
        conn = self.connection
        conn.send_packed_command([pack(commands)])  # connects, health-checks, maps write errors
        if not self._direct:
            return [_read_generic(conn, command) for command in commands]
        buf = _buffers.pop() if _buffers else bytearray(_RECV_SIZE)
        try:
            reader = _Reader(conn._sock, buf)
            try:
                replies = [reader.read(command) for command in commands]
                leftover = reader.pos != reader.end
            finally:
                reader.close()
        except TimeoutError:
            conn.disconnect()
            raise redis.TimeoutError("Timeout reading from socket") from None
        except OSError as err:
            conn.disconnect()
            raise redis.ConnectionError(f"Error while reading from socket: {err.args}") from None
        except BaseException:
            conn.disconnect()  # whatever is left unread would be taken for the next command's reply
            raise
        finally:
            if len(buf) <= _KEEP_BUFFER:
                _buffers.append(buf)
        if leftover:  # bytes after the last reply (a push message?) are not ours to drop: start afresh
            conn.disconnect()
        elif conn.health_check_interval:
            conn.next_health_check = time.monotonic() + conn.health_check_interval
        return replies

    def call(self, commands: Sequence[Command]) -> list[Any]:
        """`round_trip`, raising the first error reply, also one inside a transaction's (after every reply was read)."""
        replies = self.round_trip(commands)
        for command, reply in zip(commands, replies, strict=True):
            if isinstance(reply, redis.RedisError):
                raise reply
            if type(command) is Multi and reply is not None:
                for inner in reply:
                    if isinstance(inner, redis.RedisError):
                        raise inner
        return replies


def _generic_reply(conn: Any) -> Any:
    try:
        return conn.read_response(disable_decoding=True)
    except redis.ResponseError as err:
        return err


def run(client: redis.Redis, work: Callable[[Session], T]) -> T:
    """`work` on one connection of `client`'s pool, retried as redis-py retries a command.

    A lost connection (ConnectionError, TimeoutError) is dropped and `work` runs again on a new one,
    within the client's retry policy, so `work` must be safe to repeat. Any other error also drops the
    connection, so that no WATCH or unread reply outlives it.
    """
    pool = client.connection_pool
    own = client.connection is None
    conn: Any = pool.get_connection() if own else client.connection
    lock = None if own else client.single_connection_lock
    if lock is not None:
        lock.acquire()
    try:
        return conn.retry.call_with_retry(lambda: work(Session(conn)), lambda _error: conn.disconnect())
    except BaseException:
        conn.disconnect()
        raise
    finally:
        if lock is not None:
            lock.release()
        if own:
            pool.release(conn)
