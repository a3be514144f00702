"""docker-compose.yml, run as local processes: each Trinity service's entrypoint (from its Dockerfile),
command and environment exactly as compose states them, with service names resolved to loopback and
container ports mapped to free local ports. A wrong command, port or variable in the compose file fails
here: every service must report SERVING through the compose health check, and the buffer must work.
The stack runs as compose runs it with certificates given: mutual TLS on every link, one server name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.buffer.helpers import experience
from tests.conftest import ServiceProcess
from tests.deploy import dockerfile
from tests.deploy.compose import BASE, container_ports, mounts, resolved, start_order
from tests.deploy.pki import Pki, issue_pki
from tests.e2e.conftest import tiny_config
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.runtime.client import open_channel
from trinity.runtime.redis_server import RedisServer, free_port, start_redis_server
from trinity.runtime.tls import TlsSettings
from trinity.sdk import TrinityClient
from trinity.v1 import common_pb2, explorer_pb2_grpc, gateway_pb2, gateway_pb2_grpc, trainer_pb2_grpc

pytestmark = pytest.mark.system  # the whole compose stack as processes, a job through it: make test-system

TOKEN = "compose-wiring-token"  # set through ${TRINITY_AUTH_TOKEN}: proves the variable reaches every service
STATUS_STUBS = {
    "gateway": gateway_pb2_grpc.GatewayServiceStub,
    "explorer": explorer_pb2_grpc.ExplorerServiceStub,
    "trainer": trainer_pb2_grpc.TrainerServiceStub,
}
# The variables that make a service listen; the console is an HTTP server with its own.
PORT_VARIABLES = ("TRINITY_PORT", "TRINITY_METRICS_PORT", "TRINITY_CONSOLE_PORT")
CONSOLE = "trinity.console.server"
_ADDRESS = re.compile(r"(?P<host>[A-Za-z][A-Za-z0-9_.-]*):(?P<port>\d+)")


class Loopback:
    """Compose's network on one host: (service, container port) -> a free local port."""

    def __init__(self, services: dict[str, dict[str, Any]], data_root: Path) -> None:
        self.services = services
        self.ports: dict[tuple[str, int], int] = {}
        self.data_root = data_root
        for name, service in services.items():
            env = self.image_env(service) | service.get("environment", {})
            for key in PORT_VARIABLES:
                if env.get(key, "0") not in ("0", "-1"):
                    self.ports[(name, int(env[key]))] = free_port()
            for port in container_ports(service):
                assert (name, port) in self.ports, (
                    f"{name} publishes container port {port}, "
                    f"which neither TRINITY_PORT nor TRINITY_METRICS_PORT makes it listen on"
                )

    @staticmethod
    def image_env(service: dict[str, Any]) -> dict[str, str]:
        if "build" not in service:
            return {}
        runtime = dockerfile.parse(Path(service["build"]["context"]) / service["build"]["dockerfile"])[-1]
        return {k: v for k, v in runtime.env().items() if k != "PATH"}  # PATH is the venv's, here ours

    def rewrite(self, owner: str, key: str, value: str) -> str:
        if key in PORT_VARIABLES and value not in ("0", "-1"):
            return str(self.ports[(owner, int(value))])
        if key == "TRINITY_ADVERTISE_HOST":
            assert value in self.services, f"{owner} advertises {value}, not a service name"
            return "127.0.0.1"

        def local(match: re.Match[str]) -> str:
            host, port = match["host"], int(match["port"])
            if host not in self.services:
                return match.group(0)
            if (host, port) not in self.ports:
                pytest.fail(f"{owner}: {key}={value} names {host}:{port}, but {host} does not listen on {port}")
            return f"127.0.0.1:{self.ports[(host, port)]}"

        value = _ADDRESS.sub(local, value)
        for mount in mounts(self.services[owner]):  # container paths -> the volume's local folder
            if value == mount.target or value.startswith(mount.target + "/"):
                value = str(self.data_root / mount.source) + value[len(mount.target) :]
        return value

    def environment(self, name: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
        declared = self.image_env(self.services[name]) | self.services[name].get("environment", {})
        return base | {key: self.rewrite(name, key, value) for key, value in declared.items()}

    def argv(self, name: str) -> list[str]:
        service = self.services[name]
        assert "build" in service, f"{name} has no build section"
        runtime = dockerfile.parse(Path(service["build"]["context"]) / service["build"]["dockerfile"])[-1]
        entrypoint = list(service.get("entrypoint") or runtime.exec_form("ENTRYPOINT"))
        argv = entrypoint + list(service.get("command") or [])
        # the console scripts
        modules = {"trinity": "trinity.cli", "trinity-serve": "trinity.runtime.serve", "trinity-console": CONSOLE}
        assert argv[0] in modules, f"{name}: the entrypoint must be a trinity command, not {argv[0]}"
        return [sys.executable, "-m", modules[argv[0]], *argv[1:]]


class ComposeService(ServiceProcess):
    """ServiceProcess with compose's argv and environment; health comes from compose's own health check."""

    def __init__(self, name: str, loopback: Loopback) -> None:
        env = loopback.environment(name)
        super().__init__(name, port=int(env.get("TRINITY_PORT") or env["TRINITY_CONSOLE_PORT"]))
        self.env = env
        self.argv = loopback.argv(name)
        self.compose = loopback.services[name]

    def start(self, timeout: float = 90.0) -> ComposeService:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        assert "healthcheck" in self.compose, f"{self.service} has no healthcheck"
        test = self.compose["healthcheck"]["test"]
        assert test[0] == "CMD", f"{self.service}: the health check must be the exec form"
        probe = test[1:]
        probe = [sys.executable, *probe[1:]] if probe[0] == "python" else probe
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.service} exited with {self.process.returncode}:\n{self.logs()[-4000:]}")
            if subprocess.run(probe, env=self.env, capture_output=True, timeout=30).returncode == 0:
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.service} never passed its health check:\n{self.logs()[-4000:]}")
            time.sleep(0.3)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return issue_pki(tmp_path_factory.mktemp("tls"))


def client_tls(pki: Pki) -> TlsSettings:
    return TlsSettings(ca=pki.ca, cert=pki.client.cert, key=pki.client.key, server_name="localhost")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pki) -> Iterator[tuple[Loopback, dict[str, ComposeService]]]:
    in_container = "/etc/trinity/tls/"
    tls = {
        "TRINITY_TLS_DIR": str(pki.ca.parent),
        "TRINITY_TLS_CERT": in_container + pki.server.cert.name,
        "TRINITY_TLS_KEY": in_container + pki.server.key.name,
        "TRINITY_TLS_CA": in_container + pki.ca.name,
        "TRINITY_TLS_CLIENT_AUTH": "require",
        "TRINITY_TLS_SERVER_NAME": "localhost",  # the name the certificates carry, whatever address is dialled
    }
    model = resolved(BASE, {"TRINITY_AUTH_TOKEN": TOKEN, **tls})
    services = {name: s for name, s in model["services"].items() if "profiles" not in s}  # the default stack
    loopback = Loopback(services, tmp_path_factory.mktemp("volumes"))
    redis: RedisServer | None = None
    started: dict[str, ComposeService] = {}
    try:
        for name in start_order(services):
            service = services[name]
            for dep, condition in service.get("depends_on", {}).items():
                assert dep == "redis" or dep in started, f"{name} starts before {dep}"
                assert condition == {"condition": "service_healthy"}, f"{name} waits for {dep} only to start"
            if "build" not in service:
                assert name == "redis", f"unexpected non-Trinity service {name}"
                command = list(service.get("command") or ())
                redis_port = int(command[command.index("--port") + 1]) if "--port" in command else 6379
                redis = start_redis_server(port=free_port())
                loopback.ports[("redis", redis_port)] = int(redis.url.rsplit(":", 1)[1].split("/")[0])
                continue
            started[name] = ComposeService(name, loopback).start()
        yield loopback, started
    finally:
        for service in reversed(list(started.values())):
            service.stop()
        if redis is not None:
            redis.stop()


def test_every_trinity_service_is_started_from_the_compose_file(stack):
    _, started = stack
    assert sorted(started) == ["buffer", "console", "explorer", "gateway", "trackers", "trainer"]
    for name, service in started.items():
        assert service.argv[2:4] == (["trinity.runtime.serve", name] if name != "console" else [CONSOLE])


def test_the_console_reaches_the_gateway_through_the_compose_wiring(stack):
    import httpx

    _, started = stack
    health = httpx.get(f"http://{started['console'].address}/health", timeout=10).json()
    assert health == {"status": "ok", "gateway": True}  # over TLS with a client certificate, with the token


def test_the_buffer_works_through_the_compose_wiring(stack, pki):
    _, started = stack
    with BufferClient(started["buffer"].address, token=TOKEN, tls=client_tls(pki)) as client:
        client.create_stream(StreamConfig(name="compose-wiring"))
        put = client.put("compose-wiring", [experience(reward=1.0), experience(reward=0.5)])
        assert put.accepted == 2
        batch = client.read("compose-wiring", "wiring-test", 8)
        assert sorted(e.reward for e in batch.experiences) == [0.5, 1.0]
        assert client.ack("compose-wiring", batch.entry_ids) == 2
        assert client.status().service == "buffer"


@pytest.mark.parametrize("name", sorted(STATUS_STUBS))
def test_the_other_services_answer_get_status_with_the_compose_token(stack, pki, name):
    _, started = stack
    with open_channel(started[name].address, token=TOKEN, tls=client_tls(pki)) as channel:
        status = STATUS_STUBS[name](channel).GetStatus(common_pb2.GetStatusRequest(), timeout=10)
    assert status.service == name


def test_a_short_run_through_the_sdk_succeeds(stack, pki, tiny_model, tmp_path):
    """The gateway assigns the run to the compose trainer and explorer, which find the buffer and each
    other (sync group) through the addresses the compose file gives them."""
    _, started = stack
    config = tiny_config(tiny_model, **{"buffer.total_steps": 2, "checkpoint_dir": str(tmp_path)})
    tls = {"tls_ca": pki.ca, "tls_cert": pki.client.cert, "tls_key": pki.client.key, "tls_server_name": "localhost"}
    with TrinityClient(started["gateway"].address, token=TOKEN, **tls) as client:
        run = client.create_run(config)
        final = run.wait(timeout=300)
        assert gateway_pb2.RunState.Name(final.state) == "RUN_STATE_SUCCEEDED", final.error
        assert (final.train_step, final.model_version) == (2, 2)
    # ...and the trackers, a client of the gateway like the SDK, write it to the data volume (monitor.tensorboard).
    cursor = Path(started["trackers"].env["TRINITY_TRACKERS_DIR"]) / "tensorboard" / run.id / "trinity-cursor.json"
    deadline = time.monotonic() + 60
    while not (cursor.exists() and json.loads(cursor.read_text())["done"]):
        assert time.monotonic() < deadline, f"the trackers did not write run {run.id}:\n{started['trackers'].logs()}"
        time.sleep(0.2)


def test_every_published_metrics_port_serves_prometheus(stack):
    loopback, started = stack
    for name, service in started.items():
        metrics_port = loopback.services[name]["environment"].get("TRINITY_METRICS_PORT")  # the console has none
        for target in container_ports(loopback.services[name]):
            if metrics_port is not None and target == int(metrics_port):
                port = loopback.ports[(name, target)]
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                    assert reply.status == 200 and b"# TYPE" in reply.read(), name
        assert service.process is not None and service.process.poll() is None
