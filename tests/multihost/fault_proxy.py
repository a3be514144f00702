"""A TCP fault proxy of the tests' own, for links on a kernel without netem: each link listens on a port, forwards
every connection to its target, holds every chunk `delay_s` in each direction (a latency, not a bandwidth cap:
chunks are pipelined, each delivered `delay_s` after it arrived), and now and then resets one of the link's open
connections (RST both ways, as a middlebox that forgets a flow does), counting what it did.

The drop schedule is deterministic given the seed: link `name` draws its gaps (`drop_every_s` x uniform 0.5 to 1.5)
and which of its open connections to reset (by order of arrival) from `random.Random(f"{seed}:{name}")`. Which
connection that is at that moment depends on the traffic, as in any real network.

The proxy runs its own event loop on a thread of the test process: `FaultProxy(faults).start()`, `add_link(...)`
for each link, `counts()` for the faults done, `close()` (or a `with` block) to reset every connection and stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

T = TypeVar("T")

CHUNK = 64 * 1024
QUEUED_CHUNKS = 64  # per direction: a sender that outruns the delay waits (TCP's own back-pressure)
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Faults:
    """What every link of a proxy does: `delay_s` per chunk each way; a reset every `drop_every_s` on average
    per link (0: never)."""

    delay_s: float = 0.0
    drop_every_s: float = 0.0
    seed: int = 0


@dataclass
class LinkCounts:
    """What one link carried and suffered."""

    connections: int = 0
    drops: int = 0  # connections the proxy reset on purpose
    refused: int = 0  # connections whose target did not answer (the proxy closed the client's side)
    bytes_to_target: int = 0
    bytes_from_target: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(eq=False)
class _Connection:
    number: int
    client: asyncio.StreamWriter
    target: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def reset(self) -> None:
        """Abort both sides with an RST (SO_LINGER 0): in-flight data is lost, as on a connection a network dropped."""
        for writer in (self.client, self.target):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


def drop_schedule(faults: Faults, name: str) -> Iterator[tuple[float, float]]:
    """Link `name`'s resets, forever: (seconds since the last one, which open connection as a fraction of their
    number). The same for the same seed and name, whatever the traffic."""
    rng = random.Random(f"{faults.seed}:{name}")
    while True:
        yield faults.drop_every_s * rng.uniform(0.5, 1.5), rng.random()


class _Link:
    def __init__(self, name: str, target: tuple[str, int], faults: Faults) -> None:
        self.name, self.target, self.faults = name, target, faults
        self.counts = LinkCounts()
        self.open: dict[int, _Connection] = {}
        self.server: asyncio.Server | None = None
        self.dropper: asyncio.Task[None] | None = None

    async def serve(self, listen: tuple[str, int]) -> int:
        self.server = await asyncio.start_server(self._accept, *listen, reuse_address=True)
        if self.faults.drop_every_s > 0:
            self.dropper = asyncio.get_running_loop().create_task(self._drop_forever())
        return int(self.server.sockets[0].getsockname()[1])

    async def _drop_forever(self) -> None:
        for gap, pick in drop_schedule(self.faults, self.name):
            await asyncio.sleep(gap)
            victims = [self.open[n] for n in sorted(self.open)]
            if victims:
                victims[int(pick * len(victims))].reset()
                self.counts.drops += 1

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.counts.connections += 1
        connection = _Connection(self.counts.connections, client_writer)
        self.open[connection.number] = connection
        try:
            try:
                target_reader, target_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                self.counts.refused += 1
                return
            connection.target = target_writer
            loop = asyncio.get_running_loop()
            connection.tasks = [
                loop.create_task(self._pipe(client_reader, target_writer, "bytes_to_target")),
                loop.create_task(self._pipe(target_reader, client_writer, "bytes_from_target")),
            ]
            # Both directions end (EOF passed on, or an error): a failed one takes the other down with it.
            done, pending = await asyncio.wait(connection.tasks, return_when=asyncio.FIRST_EXCEPTION)
            if pending or any(not t.cancelled() and t.exception() for t in done):
                connection.reset()
        except asyncio.CancelledError:
            connection.reset()
        finally:
            self.open.pop(connection.number, None)
            for writer in (client_writer, connection.target):
                if writer is not None:
                    writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: str) -> None:
        """Copy `reader` to `writer`, each chunk delivered `delay_s` after it was read; EOF is passed on likewise.
        Raises the first error of either side (the caller then resets the connection)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUED_CHUNKS)

        async def receive() -> None:
            while data := await reader.read(CHUNK):
                setattr(self.counts, counter, getattr(self.counts, counter) + len(data))
                await queue.put((loop.time() + self.faults.delay_s, data))
            await queue.put((loop.time() + self.faults.delay_s, b""))

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        # Two tasks, so that a delivery that fails also ends a receive blocked on a full queue.
        tasks = [loop.create_task(receive()), loop.create_task(deliver())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            errors = [t.exception() for t in done if not t.cancelled()]
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first
        finally:
            for task in tasks:
                task.cancel()

    async def close(self) -> None:
        if self.dropper is not None:
            self.dropper.cancel()
        if self.server is not None:
            self.server.close()
        for connection in list(self.open.values()):
            connection.reset()
        if self.server is not None:
            await self.server.wait_closed()


class FaultProxy:
    """Links with `faults`, served by an event loop on a thread of its own (see the module's docstring)."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self._links: dict[str, _Link] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def add_link(self, name: str, target: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0)) -> int:
        """Forward connections to `listen` (port 0: a free one) to `target`; the port it listens on."""
        if name in self._links:
            raise ValueError(f"link {name!r} exists already")
        link = self._links[name] = _Link(name, target, self.faults)
        return self._run(link.serve(listen))

    def counts(self) -> dict[str, LinkCounts]:
        """Each link's counts so far (copies)."""
        return {name: replace(link.counts) for name, link in self._links.items()}

    def close(self) -> None:
        """Reset every open connection, stop listening and stop the loop; idempotent."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            for link in self._links.values():
                with contextlib.suppress(Exception):  # closing what is left matters more than why one failed
                    self._run(link.close(), timeout=10.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()
