"""Redis as an embedded default: use TRINITY_REDIS_URL when set, else start a private `redis-server`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from trinity.runtime.logging import get_logger

log = get_logger(__name__)

# Run by a fresh interpreter between the launcher and the command: ask for SIGKILL on the parent's death
# (prctl PR_SET_PDEATHSIG = 1, SIGKILL = 9), make sure the parent did not die first, then become the command.
_DEATH_SIGNAL_WRAPPER = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 9); "
    "os.getppid() == int(sys.argv[1]) or os.kill(os.getpid(), 9); os.execvp(sys.argv[2], sys.argv[2:])"
)

INSTALL_HINT = (
    "redis-server not found on PATH; install it (apt-get install redis-server, or brew install redis) "
    "or point Trinity at a running server with TRINITY_REDIS_URL=redis://host:6379/0"
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def find_redis_server() -> str:
    """The redis-server binary: TRINITY_REDIS_SERVER, then PATH; a clear error otherwise."""
    explicit = os.environ.get("TRINITY_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise FileNotFoundError(f"TRINITY_REDIS_SERVER={explicit} is not an executable file")
        return explicit
    found = shutil.which("redis-server")
    if found is None:
        raise FileNotFoundError(INSTALL_HINT)
    return found


@dataclass
class RedisServer:
    """A redis-server process this one started (AOF on, its own data dir), or an external one by URL."""

    url: str
    process: subprocess.Popen[bytes] | None = None
    data_dir: Path | None = None
    _owns_dir: bool = field(default=False, repr=False)

    @property
    def external(self) -> bool:
        return self.process is None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._owns_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def wait_until_ready(self, timeout: float = 15.0) -> None:
        """Block until the server answers PING; stop it and raise if it exits or stays silent."""
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url)
        try:
            while True:
                if self.process is not None and self.process.poll() is not None:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    log_tail = _tail(self.data_dir / "redis.log") if self.data_dir is not None else ""
                    self.stop()
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}: {err or log_tail}")
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise TimeoutError(f"redis at {self.url} did not answer within {timeout:.0f}s") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def redis_server_command(binary: str, port: int, directory: Path) -> list[str]:
    """The command line of a private redis-server on 127.0.0.1:`port` that keeps its data in `directory`.

    Append-only file with `appendfsync always`: a redis-server that is killed (SIGKILL included), or a
    machine that crashes, loses nothing it acknowledged, because it writes and fsyncs the commands of each
    event-loop pass before it sends their replies (one fsync covers every client's commands of that pass).
    `everysec` does not hold that even for a killed process: while its background fsync of the previous
    second is still running it postpones the write(2) for up to 2 s but replies all the same (Redis 7.0,
    flushAppendOnlyFile); SIGKILLed right after a pipeline of 1000 XADDs it kept 110 of them. `always`
    cost 2-5 ms more per put of 64 experiences of 8 KB here. Restarted on the same `directory`, the server
    reloads the file.
    """
    return [
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(directory),
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--save", "",
        "--protected-mode", "yes",
        "--daemonize", "no",
        "--logfile", str(directory / "redis.log"),
    ]  # fmt: skip


def die_with_parent(command: Sequence[str]) -> list[str]:
    """`command`, wrapped so that it gets SIGKILL when its parent dies, however it dies (Linux; unchanged
    elsewhere): a killed launcher leaves no redis-server or service behind.

    The kernel sends the signal when the *thread* that started the child exits, so start it from a thread
    that lives as long as the child. A wrapper rather than a `preexec_fn`: that would force fork() in a
    launcher whose other threads are inside gRPC (whose fork handlers then complain on stderr at every
    start) and run Python between fork and exec; the wrapper costs one exec more (tens of ms).
    """
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-S", "-c", _DEATH_SIGNAL_WRAPPER, str(os.getpid()), *command]


def start_redis_server(
    *, port: int | None = None, data_dir: str | Path | None = None, timeout: float = 15.0
) -> RedisServer:
    """Start a private redis-server on a free loopback port with append-only persistence; it dies with the
    calling thread (see `die_with_parent`)."""
    binary = find_redis_server()
    port = port or free_port()
    owns_dir = data_dir is None
    directory = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="trinity-redis-"))
    directory.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        die_with_parent(redis_server_command(binary, port, directory)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    server = RedisServer(url=f"redis://127.0.0.1:{port}/0", process=process, data_dir=directory, _owns_dir=owns_dir)
    server.wait_until_ready(timeout)
    log.info("redis.started", url=server.url, data_dir=str(directory), pid=process.pid)
    return server


def ensure_redis(data_dir: str | Path | None = None) -> RedisServer:
    """TRINITY_REDIS_URL when set (nothing started), else a private server."""
    url = os.environ.get("TRINITY_REDIS_URL")
    if url:
        return RedisServer(url=url)
    return start_redis_server(data_dir=data_dir)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return ""


def connect_redis(url: str) -> redis.Redis:
    """The one Redis client every service uses: it rides out a Redis restart.

    A lost connection (ConnectionError, TimeoutError, a server still loading its AOF) is retried on a new
    one with exponential backoff capped at 0.5 s, 8 times, each wait at least half its nominal value and
    the rest jittered (full jitter can add up to under 1 s): 1.8 to 3.1 s in all, which covers the
    launcher's supervisor restarting redis-server (1 s back-off, then the reload). Past that
    the error surfaces and the services answer UNAVAILABLE, which their callers retry in turn (5 attempts),
    so an RPC rides out some 15 s of outage while a service's own background loops are not held longer
    than a few seconds. Idle pooled connections are checked before use, since a restarted server has
    closed them all. Reads may block up to 60 s (XREAD/XREADGROUP BLOCK), so the socket timeout is longer.
    """
    from redis.backoff import EqualJitterBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        retry=Retry(EqualJitterBackoff(cap=0.5, base=0.05), retries=8),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        health_check_interval=15,
        socket_connect_timeout=5,
        socket_timeout=90,
    )
