"""Redis as an embedded default: use TRINITY_REDIS_URL when set, else start a private `redis-server`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from trinity.runtime.logging import get_logger

log = get_logger(__name__)

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

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def start_redis_server(
    *, port: int | None = None, data_dir: str | Path | None = None, timeout: float = 15.0
) -> RedisServer:
    """Start a private redis-server on a free loopback port with append-only persistence."""
    binary = find_redis_server()
    port = port or free_port()
    owns_dir = data_dir is None
    directory = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="trinity-redis-"))
    directory.mkdir(parents=True, exist_ok=True)
    args = [
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(directory),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--protected-mode", "yes",
        "--daemonize", "no",
        "--logfile", str(directory / "redis.log"),
    ]  # fmt: skip
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"redis://127.0.0.1:{port}/0"
    server = RedisServer(url=url, process=process, data_dir=directory, _owns_dir=owns_dir)
    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(url)
    try:
        while True:
            if process.poll() is not None:
                err = process.stderr.read().decode() if process.stderr else ""
                log_tail = _tail(directory / "redis.log")
                raise RuntimeError(f"redis-server exited with {process.returncode}: {err or log_tail}")
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    server.stop()
                    raise TimeoutError(f"redis-server on port {port} did not answer within {timeout:.0f}s") from None
                time.sleep(0.05)
    finally:
        client.close()
    log.info("redis.started", url=url, data_dir=str(directory), pid=process.pid)
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
    """A client for the services: lost connections retried with backoff (about 2.5 s, then the error
    surfaces); reads may block up to 60 s (XREAD/XREADGROUP BLOCK), so the socket timeout is longer."""
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=5),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        health_check_interval=15,
        socket_connect_timeout=5,
        socket_timeout=90,
    )
