"""A real gateway and buffer (processes on loopback, real Redis) and the console app in front of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import ServiceProcess
from trinity.console.app import create_app
from trinity.console.settings import ConsoleSettings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def gateway(redis_server: Any) -> Iterator[ServiceProcess]:
    service = ServiceProcess("gateway", env={"TRINITY_REDIS_URL": redis_server.url}).start()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def stack(redis_server: Any, gateway: ServiceProcess) -> Iterator[ServiceProcess]:
    """The gateway with a buffer registered to it, as a deployment has (the console finds the buffer there)."""
    env = {"TRINITY_REDIS_URL": redis_server.url, "TRINITY_GATEWAY": gateway.address}
    buffer = ServiceProcess("buffer", env=env).start()
    yield gateway
    buffer.stop()


@pytest.fixture(scope="module")
def console(stack: ServiceProcess) -> Iterator[TestClient]:
    with TestClient(create_app(ConsoleSettings(gateway=stack.address, examples_dir=EXAMPLES))) as client:
        yield client
