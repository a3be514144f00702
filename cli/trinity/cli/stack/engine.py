"""Carry out a StackPlan on a Docker engine through the Docker SDK for Python (`docker` package)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trinity.cli.stack.plan import ServicePlan, StackPlan

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
_NANOS = 1_000_000_000
_ENDPOINT_API = "1.44"  # the engine API version whose endpoint settings carry per-network aliases


class EngineUnavailable(RuntimeError):
    """No Docker engine answered; the message says where it looked."""


def connect() -> Any:
    """A docker client that has answered a ping, or EngineUnavailable."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        raise EngineUnavailable("the Docker SDK for Python is not installed (pip install 'trinity[deploy]')") from None
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as err:
        where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        raise EngineUnavailable(f"no Docker engine answers at {where} ({err})") from None
    return client


def container_name(plan: StackPlan, service: ServicePlan) -> str:
    return f"{plan.project}-{service.name}-1"


def container_spec(plan: StackPlan, service: ServicePlan) -> dict[str, Any]:
    """Keyword arguments for `client.containers.create`: the service exactly as the plan states it."""
    from docker.types import DeviceRequest, EndpointConfig

    spec: dict[str, Any] = {
        "image": service.image,
        "name": container_name(plan, service),
        "environment": dict(service.environment),
        "labels": {PROJECT_LABEL: plan.project, SERVICE_LABEL: service.name},
        "network": plan.network,
        # The service name is the DNS name other services use (gateway:50051, redis:6379).
        "networking_config": {plan.network: EndpointConfig(version=_ENDPOINT_API, aliases=[service.name])},
        "ports": {
            f"{port.container_port}/{port.protocol}": (port.host_ip or "0.0.0.0", port.host_ports[0])
            for port in service.ports
            if port.host_ports  # a range publishes its first port for the single replica `up` starts
        },
        "volumes": {
            (plan.volume_name(m.source) if m.kind == "volume" else m.source): {
                "bind": m.target,
                "mode": "ro" if m.read_only else "rw",
            }
            for m in service.volumes
        },
        "restart_policy": {"Name": service.restart} if service.restart not in ("no", "") else None,
        "detach": True,
    }
    if service.entrypoint is not None:
        spec["entrypoint"] = list(service.entrypoint)
    if service.command is not None:
        spec["command"] = list(service.command)
    if service.healthcheck is not None:
        check = service.healthcheck
        spec["healthcheck"] = {
            "test": list(check.test),
            "interval": int(check.interval_s * _NANOS),
            "timeout": int(check.timeout_s * _NANOS),
            "retries": check.retries,
            "start_period": int(check.start_period_s * _NANOS),
        }
    if service.gpus is not None:
        count = -1 if service.gpus == "all" else int(service.gpus)
        spec["device_requests"] = [DeviceRequest(driver="nvidia", count=count, capabilities=[["gpu"]])]
    return {key: value for key, value in spec.items() if value is not None}


@dataclass
class ServiceState:
    name: str
    container: str
    state: str  # created, running, exited, missing
    health: str  # healthy, unhealthy, starting, none

    def ready_for(self, condition: str) -> bool:
        if condition == "service_healthy":
            return self.health == "healthy"
        if condition == "service_completed_successfully":
            return self.state == "exited"
        return self.state == "running"


class StackEngine:
    """up / down / status of one plan on one engine."""

    def __init__(self, client: Any, plan: StackPlan, *, echo: Callable[[str], None] = print) -> None:
        self.client = client
        self.plan = plan
        self.echo = echo

    def state(self, service: ServicePlan) -> ServiceState:
        from docker.errors import NotFound

        name = container_name(self.plan, service)
        try:
            container = self.client.containers.get(name)
        except NotFound:
            return ServiceState(service.name, name, "missing", "none")
        status = container.attrs.get("State", {})
        health = status.get("Health", {}).get("Status", "none")
        return ServiceState(service.name, name, str(status.get("Status", "unknown")), str(health))

    def ensure_image(self, service: ServicePlan, *, build: bool) -> None:
        from docker.errors import ImageNotFound

        try:
            self.client.images.get(service.image)
            present = True
        except ImageNotFound:
            present = False
        if service.build is not None and (build or not present):
            self.echo(f"building {service.image} from {service.build.dockerfile}")
            self.client.images.build(
                path=service.build.context,
                dockerfile=service.build.dockerfile,
                buildargs=service.build.args,
                tag=service.image,
                rm=True,
            )
        elif not present:
            self.echo(f"pulling {service.image}")
            self.client.images.pull(service.image)

    def ensure_network_and_volumes(self) -> None:
        from docker.errors import NotFound

        labels = {PROJECT_LABEL: self.plan.project}
        try:
            self.client.networks.get(self.plan.network)
        except NotFound:
            self.echo(f"creating network {self.plan.network}")
            self.client.networks.create(self.plan.network, driver="bridge", labels=labels)
        for volume in self.plan.volumes:
            try:
                self.client.volumes.get(volume)
            except NotFound:
                self.echo(f"creating volume {volume}")
                self.client.volumes.create(name=volume, labels=labels)

    def wait_for(self, service: ServicePlan, condition: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            current = self.state(service)
            if current.ready_for(condition):
                return
            stopped = current.state in ("exited", "dead", "missing")
            if current.health == "unhealthy" or (stopped and condition != "service_completed_successfully"):
                raise RuntimeError(
                    f"{service.name} is {current.state}/{current.health}; see `docker logs {current.container}`"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{service.name} not {condition} after {timeout:.0f}s (now {current.state}/{current.health})"
                )
            time.sleep(1.0)

    def up(self, *, build: bool = False, timeout: float = 600.0) -> None:
        for service in self.plan.services:
            self.ensure_image(service, build=build)
        self.ensure_network_and_volumes()
        for service in self.plan.services:
            for dep, condition in service.depends_on.items():
                self.wait_for(self.plan.service(dep), condition, timeout)
            if self.state(service).state == "running":
                self.echo(f"{service.name}: already running")
                continue
            spec = container_spec(self.plan, service)
            if self.state(service).state != "missing":
                self.client.containers.get(spec["name"]).remove(force=True)
            self.client.containers.create(**spec).start()
            self.echo(f"{service.name}: started {spec['name']}")
        for service in self.plan.services:
            if service.healthcheck is not None:
                self.wait_for(service, "service_healthy", timeout)
                self.echo(f"{service.name}: healthy")

    def down(self, *, volumes: bool = False) -> None:
        from docker.errors import NotFound

        for service in reversed(self.plan.services):
            try:
                container = self.client.containers.get(container_name(self.plan, service))
            except NotFound:
                continue
            container.stop(timeout=30)
            container.remove()
            self.echo(f"{service.name}: removed")
        for name in (self.plan.network, *(self.plan.volumes if volumes else ())):
            getter = self.client.networks if name == self.plan.network else self.client.volumes
            try:
                getter.get(name).remove()
                self.echo(f"removed {name}")
            except NotFound:
                pass

    def status(self) -> list[ServiceState]:
        return [self.state(service) for service in self.plan.services]
