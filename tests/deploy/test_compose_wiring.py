"""docker-compose.yml, run as local processes: each Trinity service's entrypoint (from its Dockerfile),
command and environment exactly as compose states them, with service names resolved to loopback and
container ports mapped to free local ports. A wrong command, port or variable in the compose file fails
here: every service must report SERVING through the compose health check, and the buffer must work."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.buffer.helpers import experience
from tests.conftest import ServiceProcess
from tests.deploy import dockerfile
from tests.e2e.conftest import tiny_config
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.runtime.client import open_channel
from trinity.runtime.redis_server import RedisServer, free_port, start_redis_server
from trinity.sdk import TrinityClient
from trinity.cli.stack.plan import ServicePlan, StackPlan, load_plan
from trinity.v1 import common_pb2, explorer_pb2_grpc, gateway_pb2, gateway_pb2_grpc, trainer_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "compose-wiring-token"  # set through ${TRINITY_AUTH_TOKEN}: proves the variable reaches every service
STATUS_STUBS = {
    "gateway": gateway_pb2_grpc.GatewayServiceStub,
    "explorer": explorer_pb2_grpc.ExplorerServiceStub,
    "trainer": trainer_pb2_grpc.TrainerServiceStub,
}
_ADDRESS = re.compile(r"(?P<host>[A-Za-z][A-Za-z0-9_.-]*):(?P<port>\d+)")


class Loopback:
    """Compose's network on one host: (service, container port) -> a free local port."""

    def __init__(self, plan: StackPlan, data_root: Path) -> None:
        self.plan = plan
        self.ports: dict[tuple[str, int], int] = {}
        self.data_root = data_root
        for service in plan.services:
            env = self.image_env(service) | service.environment
            for key in ("TRINITY_PORT", "TRINITY_METRICS_PORT"):
                if env.get(key, "0") not in ("0", "-1"):
                    self.ports[(service.name, int(env[key]))] = free_port()
            for mapping in service.ports:
                assert (service.name, mapping.container_port) in self.ports, (
                    f"{service.name} publishes container port {mapping.container_port}, "
                    f"which neither TRINITY_PORT nor TRINITY_METRICS_PORT makes it listen on"
                )

    @staticmethod
    def image_env(service: ServicePlan) -> dict[str, str]:
        if service.build is None:
            return {}
        runtime = dockerfile.parse(Path(service.build.context) / service.build.dockerfile)[-1]
        return {k: v for k, v in runtime.env().items() if k != "PATH"}  # PATH is the venv's, here ours

    def rewrite(self, owner: str, key: str, value: str) -> str:
        if key in ("TRINITY_PORT", "TRINITY_METRICS_PORT") and value not in ("0", "-1"):
            return str(self.ports[(owner, int(value))])
        if key == "TRINITY_ADVERTISE_HOST":
            assert value in {s.name for s in self.plan.services}, f"{owner} advertises {value}, not a service name"
            return "127.0.0.1"

        def local(match: re.Match[str]) -> str:
            host, port = match["host"], int(match["port"])
            if host not in {s.name for s in self.plan.services}:
                return match.group(0)
            if (host, port) not in self.ports:
                pytest.fail(f"{owner}: {key}={value} names {host}:{port}, but {host} does not listen on {port}")
            return f"127.0.0.1:{self.ports[(host, port)]}"

        value = _ADDRESS.sub(local, value)
        for mount in self.plan.service(owner).volumes:  # container paths -> the volume's local folder
            if value == mount.target or value.startswith(mount.target + "/"):
                value = str(self.data_root / mount.source) + value[len(mount.target) :]
        return value

    def environment(self, service: ServicePlan) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
        declared = self.image_env(service) | service.environment
        return base | {key: self.rewrite(service.name, key, value) for key, value in declared.items()}

    def argv(self, service: ServicePlan) -> list[str]:
        assert service.build is not None, f"{service.name} has no build section"
        runtime = dockerfile.parse(Path(service.build.context) / service.build.dockerfile)[-1]
        entrypoint = list(service.entrypoint) if service.entrypoint is not None else runtime.exec_form("ENTRYPOINT")
        command = list(service.command) if service.command is not None else []
        argv = entrypoint + command
        modules = {"trinity": "trinity.cli", "trinity-serve": "trinity.runtime.serve"}  # the console scripts
        assert argv[0] in modules, f"{service.name}: the entrypoint must be a trinity command, not {argv[0]}"
        return [sys.executable, "-m", modules[argv[0]], *argv[1:]]


class ComposeService(ServiceProcess):
    """ServiceProcess with compose's argv and environment; health comes from compose's own health check."""

    def __init__(self, service: ServicePlan, loopback: Loopback) -> None:
        env = loopback.environment(service)
        super().__init__(service.name, port=int(env["TRINITY_PORT"]))
        self.env = env
        self.argv = loopback.argv(service)
        self.plan = service

    def start(self, timeout: float = 90.0) -> ComposeService:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        assert self.plan.healthcheck is not None, f"{self.service} has no healthcheck"
        probe = self.plan.healthcheck.command
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
def stack(tmp_path_factory) -> Iterator[tuple[Loopback, dict[str, ComposeService]]]:
    plan = load_plan([ROOT / "docker-compose.yml"], env={"TRINITY_AUTH_TOKEN": TOKEN})
    loopback = Loopback(plan, tmp_path_factory.mktemp("volumes"))
    redis: RedisServer | None = None
    started: dict[str, ComposeService] = {}
    try:
        for service in plan.services:  # compose's start order: dependencies first
            for dep, condition in service.depends_on.items():
                assert dep == "redis" or dep in started, f"{service.name} starts before {dep}"
                assert condition == "service_healthy", f"{service.name} waits for {dep} only to start"
            if service.build is None:
                assert service.name == "redis", f"unexpected non-Trinity service {service.name}"
                command = list(service.command or ())
                redis_port = int(command[command.index("--port") + 1]) if "--port" in command else 6379
                redis = start_redis_server(port=free_port())
                loopback.ports[("redis", redis_port)] = int(redis.url.rsplit(":", 1)[1].split("/")[0])
                continue
            started[service.name] = ComposeService(service, loopback).start()
        yield loopback, started
    finally:
        for service in reversed(list(started.values())):
            service.stop()
        if redis is not None:
            redis.stop()


def test_every_trinity_service_is_started_from_the_compose_file(stack):
    _, started = stack
    assert sorted(started) == ["buffer", "explorer", "gateway", "trainer"]
    for name, service in started.items():
        assert service.argv[2:4] == ["trinity.runtime.serve", name]


def test_the_buffer_works_through_the_compose_wiring(stack):
    _, started = stack
    with BufferClient(started["buffer"].address, token=TOKEN) as client:
        client.create_stream(StreamConfig(name="compose-wiring"))
        put = client.put("compose-wiring", [experience(reward=1.0), experience(reward=0.5)])
        assert put.accepted == 2
        batch = client.read("compose-wiring", "wiring-test", 8)
        assert sorted(e.reward for e in batch.experiences) == [0.5, 1.0]
        assert client.ack("compose-wiring", batch.entry_ids) == 2
        assert client.status().service == "buffer"


@pytest.mark.parametrize("name", sorted(STATUS_STUBS))
def test_the_other_services_answer_get_status_with_the_compose_token(stack, name):
    _, started = stack
    with open_channel(started[name].address, token=TOKEN) as channel:
        status = STATUS_STUBS[name](channel).GetStatus(common_pb2.GetStatusRequest(), timeout=10)
    assert status.service == name


def test_a_short_run_through_the_sdk_succeeds(stack, tiny_model, tmp_path):
    """The gateway assigns the run to the compose trainer and explorer, which find the buffer and each
    other (sync group) through the addresses the compose file gives them."""
    _, started = stack
    config = tiny_config(tiny_model, **{"buffer.total_steps": 2, "checkpoint_dir": str(tmp_path)})
    with TrinityClient(started["gateway"].address, token=TOKEN) as client:
        run = client.create_run(config)
        final = run.wait(timeout=300)
        assert gateway_pb2.RunState.Name(final.state) == "RUN_STATE_SUCCEEDED", final.error
        assert (final.train_step, final.model_version) == (2, 2)


def test_every_published_metrics_port_serves_prometheus(stack):
    loopback, started = stack
    for name, service in started.items():
        for mapping in loopback.plan.service(name).ports:
            if mapping.container_port == int(loopback.plan.service(name).environment["TRINITY_METRICS_PORT"]):
                port = loopback.ports[(name, mapping.container_port)]
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                    assert reply.status == 200 and b"# TYPE" in reply.read(), name
        assert service.process is not None and service.process.poll() is None
