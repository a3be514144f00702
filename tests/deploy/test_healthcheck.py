"""`python -m trinity.runtime.healthcheck`, the probe every image's HEALTHCHECK runs."""

from __future__ import annotations

import os
import subprocess
import sys

from trinity.runtime.redis_server import free_port


def _probe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    return subprocess.run(
        [sys.executable, "-m", "trinity.runtime.healthcheck", *args],
        env=base | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_serving_service_is_healthy(buffer_service):
    assert _probe({"TRINITY_PORT": str(buffer_service.port)}).returncode == 0
    assert _probe({}, "--address", buffer_service.address).returncode == 0


def test_nothing_listening_is_unhealthy():
    done = _probe({"TRINITY_PORT": str(free_port())}, "--timeout", "1")
    assert done.returncode == 1 and "is not SERVING" in done.stderr


def test_a_missing_port_is_unhealthy_and_says_why():
    done = _probe({})
    assert done.returncode == 1 and "TRINITY_PORT is not set" in done.stderr
