"""The fault proxy itself (tests/multihost/fault_proxy.py): it forwards bytes intact, adds its latency without
capping bandwidth, resets connections on its seeded schedule, and counts all of it. Loopback only, a second or so."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.multihost.fault_proxy import FaultProxy, Faults, drop_schedule


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A loopback echo server, one thread per connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass  # reset by the proxy: the test looks at the client's side

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed at teardown
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()
    listener.close()


def _dial(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size and (chunk := sock.recv(size - len(data))):
        data += chunk
    return data


def test_bytes_cross_intact_both_ways_and_are_counted(echo):
    payload = bytes(range(256)) * 4096  # 1 MiB: many chunks
    with FaultProxy(Faults()) as proxy:
        port = proxy.add_link("echo", echo)
        with _dial(port) as sock:
            threading.Thread(target=sock.sendall, args=(payload,), daemon=True).start()
            assert _receive(sock, len(payload)) == payload
        counts = proxy.counts()["echo"]
    assert (counts.connections, counts.drops, counts.refused) == (1, 0, 0)
    assert counts.bytes_to_target == counts.bytes_from_target == len(payload)


def test_each_chunk_is_delayed_each_way_without_capping_bandwidth(echo):
    delay = 0.1
    with FaultProxy(Faults(delay_s=delay)) as proxy, _dial(proxy.add_link("echo", echo)) as sock:
        started = time.monotonic()
        sock.sendall(b"ping")
        assert _receive(sock, 4) == b"ping"
        round_trip = time.monotonic() - started
        # Ten chunks sent back to back arrive one round trip later, not ten: the delay is a latency.
        started = time.monotonic()
        for _ in range(10):
            sock.sendall(b"x" * 1000)
            time.sleep(0.01)
        assert len(_receive(sock, 10_000)) == 10_000
        burst = time.monotonic() - started
    # Slack for a loaded machine; a proxy that held each chunk in turn would take over 10 x delay = 1 s.
    assert 2 * delay <= round_trip < 2 * delay + 0.4
    assert burst < 2 * delay + 0.1 + 0.4


def test_a_connection_is_reset_on_the_schedule_and_counted(echo):
    with FaultProxy(Faults(drop_every_s=0.1, seed=1)) as proxy, _dial(proxy.add_link("echo", echo)) as sock:
        with pytest.raises(ConnectionResetError):
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:  # a live connection: every send is echoed until the reset
                sock.sendall(b"x")
                if not sock.recv(1):
                    raise ConnectionResetError("closed")
                time.sleep(0.01)
        counts = proxy.counts()["echo"]
    assert counts.connections == 1 and counts.drops >= 1


def test_the_drop_schedule_is_the_same_for_the_same_seed_and_link():
    def first(faults: Faults, name: str) -> list[tuple[float, float]]:
        return list(itertools.islice(drop_schedule(faults, name), 5))

    faults = Faults(drop_every_s=2.0, seed=7)
    assert first(faults, "buffer") == first(Faults(drop_every_s=2.0, seed=7), "buffer")
    assert first(faults, "buffer") != first(faults, "gateway") != first(Faults(drop_every_s=2.0, seed=8), "gateway")
    assert all(1.0 <= gap <= 3.0 and 0 <= pick < 1 for gap, pick in first(faults, "buffer"))


def test_a_target_that_does_not_answer_closes_the_client_and_is_counted():
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        gone = placeholder.getsockname()  # a port nothing listens on once this block ends
    with FaultProxy(Faults()) as proxy, _dial(proxy.add_link("gone", gone)) as sock:
        assert sock.recv(1) == b""
        assert proxy.counts()["gone"].refused == 1


def test_close_resets_open_connections_and_is_idempotent(echo):
    proxy = FaultProxy(Faults()).start()
    sock = _dial(proxy.add_link("echo", echo))
    sock.sendall(b"x")
    assert sock.recv(1) == b"x"
    proxy.close()
    with pytest.raises(ConnectionResetError):
        sock.sendall(b"x")
        sock.recv(1)
    sock.close()
    proxy.close()


def test_a_link_name_is_taken_once(echo):
    with FaultProxy(Faults()) as proxy:
        proxy.add_link("echo", echo)
        with pytest.raises(ValueError, match="exists already"):
            proxy.add_link("echo", echo)
