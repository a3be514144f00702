"""Shared fixtures: a real redis-server and real service processes on loopback ports."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from trinity.models.tiny import build_tiny_llama
from trinity.runtime.client import wait_until_serving
from trinity.runtime.redis_server import RedisServer, free_port, start_redis_server
from trinity.runtime.serve import PARENT_ENV
from trinity.runtime.tls import TlsSettings

# Two cores: keep every process to one compute thread so test processes do not starve each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Buffers started by tests read task files the tests write under the temp directory, and the repository's examples.
os.environ.setdefault(
    "TRINITY_DATA_ROOTS", os.pathsep.join([tempfile.gettempdir(), str(Path(__file__).resolve().parents[1])])
)


class ServiceProcess:
    """`trinity serve <service>` in a child process: the same entrypoint the containers run."""

    def __init__(self, service: str, env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.service = service
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"trinity-{service}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> ServiceProcess:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trinity.cli",
                "serve",
                self.service,
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
            ],
            env={**self.env, PARENT_ENV: str(os.getpid())},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_serving(
                self.address,
                timeout=timeout,
                token=self.env.get("TRINITY_AUTH_TOKEN"),
                tls=TlsSettings.from_env(self.env),
            )
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"{self.service} did not start:\n{self.log_path.read_text()[-4000:]}") from None
        return self

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def logs(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu`-marked tests skip, with the reason, where torch sees no CUDA device: `make test-all` selects them, and a
    CPU machine cannot run them (`make gpu-check` runs the GPU paths on a GPU machine)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; torch here sees none")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def buffer_service(redis_server: RedisServer) -> Iterator[ServiceProcess]:
    service = ServiceProcess("buffer", env={"TRINITY_REDIS_URL": redis_server.url}).start()
    yield service
    service.stop()


@pytest.fixture(scope="session")
def gateway(redis_server: RedisServer) -> Iterator[ServiceProcess]:
    """One gateway process for the tests that need a real one (runs are told apart by their ids); a test module
    that needs a gateway of its own defines its own `gateway` fixture."""
    service = ServiceProcess("gateway", env={"TRINITY_REDIS_URL": redis_server.url}).start()
    yield service
    service.stop()


@pytest.fixture
def unique() -> str:
    """A fresh name per test, so tests sharing one buffer never see each other's data."""
    return "t" + uuid.uuid4().hex[:10]


# vLLM's CPU attention needs head_dim >= 32 here, and the byte tokenizer 259+ tokens.
TINY_SIZES = {"vocab_size": 320, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2, "num_kv_heads": 1}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("model") / "tiny", **TINY_SIZES)


@pytest.fixture(scope="session")
def long_context_tiny_model(tmp_path_factory) -> Path:
    """The tiny model with 4096 positions: its byte tokenizer spends a token per character, so an agent's episode
    (a tool list, a game's observations) outgrows the 512 of `tiny_model`."""
    return build_tiny_llama(tmp_path_factory.mktemp("model") / "tiny", max_position_embeddings=4096, **TINY_SIZES)
