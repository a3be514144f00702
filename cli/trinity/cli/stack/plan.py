"""The stack plan: what `trinity stack up` creates, in which order, with which settings.

Derived from docker-compose.yml (plus override files) alone, so the compose file stays the one source
for images, commands, variables, ports, volumes, health checks and start order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity.cli.stack.compose import ComposeError, load_compose

DEFAULT_FILE = "docker-compose.yml"
GPU_FILE = "docker-compose.gpu.yml"
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str | int | float) -> float:
    """Compose durations ('10s', '1m30s', '500ms') in seconds."""
    if isinstance(text, int | float):
        return float(text)
    total, number = 0.0, ""
    rest = text.strip()
    while rest:
        if rest[0].isdigit() or rest[0] == ".":
            number += rest[0]
            rest = rest[1:]
            continue
        unit = "ms" if rest.startswith("ms") else rest[0]
        if unit not in _DURATION_UNITS or not number:
            raise ComposeError(f"cannot read duration {text!r} (use forms like 10s, 1m30s, 500ms)")
        total += float(number) * _DURATION_UNITS[unit]
        number, rest = "", rest[len(unit) :]
    if number:  # a bare number is seconds
        total += float(number)
    return total


@dataclass(frozen=True)
class PortMapping:
    """`host:container`; `host_ports` is a range when replicas share one published range."""

    container_port: int
    host_ports: tuple[int, ...] = ()
    host_ip: str = ""
    protocol: str = "tcp"

    @property
    def published(self) -> str:
        """The host side as compose writes it: `9101` or `9103-9110`."""
        if len(self.host_ports) > 1:
            return f"{self.host_ports[0]}-{self.host_ports[-1]}"
        return str(self.host_ports[0]) if self.host_ports else ""

    @classmethod
    def parse(cls, spec: str | int | dict, where: str) -> PortMapping:
        if isinstance(spec, dict):
            published = str(spec.get("published", ""))
            return cls(
                int(spec["target"]), _port_range(published, where), spec.get("host_ip", ""), spec.get("protocol", "tcp")
            )
        text, _, protocol = str(spec).partition("/")
        parts = text.rsplit(":", 2)
        container = int(parts[-1])
        host = _port_range(parts[-2], where) if len(parts) >= 2 else ()
        host_ip = parts[0] if len(parts) == 3 else ""
        return cls(container, host, host_ip, protocol or "tcp")


def _port_range(text: str, where: str) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        low, _, high = text.partition("-")
        return tuple(range(int(low), int(high or low) + 1))
    except ValueError:
        raise ComposeError(f"{where}: cannot read published port {text!r}") from None


@dataclass(frozen=True)
class VolumeMount:
    source: str  # a named volume (project-prefixed when created) or a host path
    target: str
    read_only: bool = False
    kind: str = "volume"  # or "bind"

    @classmethod
    def parse(cls, spec: str | dict, base_dir: Path) -> VolumeMount:
        if isinstance(spec, dict):
            source, target = str(spec.get("source", "")), str(spec["target"])
            return cls(source, target, bool(spec.get("read_only", False)), str(spec.get("type", "volume")))
        parts = spec.split(":")
        source, target = parts[0], parts[1] if len(parts) > 1 else parts[0]
        read_only = len(parts) > 2 and "ro" in parts[2].split(",")
        if source.startswith((".", "/", "~")):
            path = Path(os.path.expanduser(source))
            return cls(str((base_dir / path).resolve() if not path.is_absolute() else path), target, read_only, "bind")
        return cls(source, target, read_only, "volume")


@dataclass(frozen=True)
class Healthcheck:
    test: tuple[str, ...]
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0

    @classmethod
    def parse(cls, spec: dict) -> Healthcheck:
        test = spec.get("test", [])
        test = ("CMD-SHELL", test) if isinstance(test, str) else tuple(str(part) for part in test)
        return cls(
            test=tuple(test),
            interval_s=parse_duration(spec.get("interval", "30s")),
            timeout_s=parse_duration(spec.get("timeout", "30s")),
            retries=int(spec.get("retries", 3)),
            start_period_s=parse_duration(spec.get("start_period", "0s")),
        )

    @property
    def command(self) -> list[str]:
        """The argv the probe runs (CMD form); a CMD-SHELL test runs under `sh -c`."""
        if self.test[:1] == ("CMD-SHELL",):
            return ["sh", "-c", self.test[1]]
        return list(self.test[1:] if self.test[:1] == ("CMD",) else self.test)


@dataclass(frozen=True)
class Build:
    context: str
    dockerfile: str
    args: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServicePlan:
    name: str
    image: str
    build: Build | None
    entrypoint: tuple[str, ...] | None
    command: tuple[str, ...] | None
    environment: dict[str, str]
    ports: tuple[PortMapping, ...]
    volumes: tuple[VolumeMount, ...]
    depends_on: dict[str, str]  # service -> condition (service_healthy, service_started, ...)
    healthcheck: Healthcheck | None
    gpus: int | str | None  # a GPU count, "all", or None
    restart: str
    profiles: tuple[str, ...]


@dataclass(frozen=True)
class StackPlan:
    project: str
    network: str
    volumes: tuple[str, ...]  # named volumes as created (project-prefixed)
    services: tuple[ServicePlan, ...]  # in start order: every service after those it depends on

    def service(self, name: str) -> ServicePlan:
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(f"no service {name!r} in the plan (have: {', '.join(s.name for s in self.services)})")

    def volume_name(self, source: str) -> str:
        return f"{self.project}_{source}"

    def describe(self) -> str:
        """A human-readable account of what `up` does, in order."""
        lines = [f"project {self.project}", f"  network {self.network}"]
        lines += [f"  volume  {name}" for name in self.volumes]
        for step, service in enumerate(self.services, start=1):
            how = f"build {service.build.dockerfile}" if service.build else "pull"
            waits = ", ".join(f"{dep} {cond.removeprefix('service_')}" for dep, cond in service.depends_on.items())
            ports = ", ".join(f"{p.published}->{p.container_port}" for p in service.ports if p.host_ports)
            gpus = f", gpus {service.gpus}" if service.gpus is not None else ""
            lines.append(f"  {step}. {service.name}: {service.image} ({how}){gpus}")
            if waits:
                lines.append(f"       after {waits}")
            if ports:
                lines.append(f"       ports {ports}")
            if service.healthcheck:
                lines.append(f"       health {' '.join(service.healthcheck.command)}")
        return "\n".join(lines)


def _as_argv(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(value.split())
    return tuple(str(part) for part in value)


def _environment(value: Any) -> dict[str, str]:
    if isinstance(value, list):
        pairs = (item.split("=", 1) if "=" in item else (item, os.environ.get(item, "")) for item in value)
        return {key: val for key, val in pairs}
    return {str(key): "" if val is None else str(val) for key, val in (value or {}).items()}


def _gpus(service: dict) -> int | str | None:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    for device in devices:
        if "gpu" in device.get("capabilities", []):
            count = device.get("count", "all")
            return "all" if str(count) == "all" else int(count)
    return None


def _service(name: str, spec: dict, project: str, base_dir: Path) -> ServicePlan:
    where = f"services.{name}"
    build = spec.get("build")
    if isinstance(build, str):
        build = {"context": build}
    image = spec.get("image") or f"{project}-{name}"
    depends = spec.get("depends_on", {})
    if isinstance(depends, list):
        depends = {dep: {"condition": "service_started"} for dep in depends}
    return ServicePlan(
        name=name,
        image=str(image),
        build=Build(
            context=str((base_dir / build.get("context", ".")).resolve()),
            dockerfile=str(build.get("dockerfile", "Dockerfile")),
            args={str(k): str(v) for k, v in (build.get("args") or {}).items()},
        )
        if build
        else None,
        entrypoint=_as_argv(spec.get("entrypoint")),
        command=_as_argv(spec.get("command")),
        environment=_environment(spec.get("environment")),
        ports=tuple(PortMapping.parse(port, f"{where}.ports") for port in spec.get("ports", [])),
        volumes=tuple(VolumeMount.parse(volume, base_dir) for volume in spec.get("volumes", [])),
        depends_on={dep: str((cond or {}).get("condition", "service_started")) for dep, cond in depends.items()},
        healthcheck=Healthcheck.parse(spec["healthcheck"]) if spec.get("healthcheck") else None,
        gpus=_gpus(spec),
        restart=str(spec.get("restart", "no")),
        profiles=tuple(spec.get("profiles", [])),
    )


def start_order(services: Mapping[str, ServicePlan]) -> list[str]:
    """Dependencies first; among services that are ready together, file order (deterministic)."""
    order: list[str] = []
    placed: set[str] = set()
    pending = list(services)
    while pending:
        ready = [name for name in pending if set(services[name].depends_on) <= placed]
        if not ready:
            raise ComposeError(f"depends_on has a cycle among: {', '.join(pending)}")
        order.append(ready[0])
        placed.add(ready[0])
        pending.remove(ready[0])
    return order


def compose_files(directory: Path, *, gpu: bool = False, extra: list[Path] | None = None) -> list[Path]:
    files = [directory / DEFAULT_FILE]
    if gpu:
        files.append(directory / GPU_FILE)
    return files + list(extra or [])


def load_plan(
    files: list[Path],
    *,
    env: Mapping[str, str] | None = None,
    profiles: set[str] | frozenset[str] = frozenset(),
    project: str | None = None,
) -> StackPlan:
    """The plan for `files` under `env` (default: this process's environment) with `profiles` active."""
    model = load_compose(files, os.environ if env is None else env)
    base_dir = files[0].resolve().parent
    project = project or str(model.get("name") or base_dir.name)
    every = {name: _service(name, spec or {}, project, base_dir) for name, spec in model["services"].items()}
    active = {name: svc for name, svc in every.items() if not svc.profiles or set(svc.profiles) & set(profiles)}
    for service in active.values():
        for dep in service.depends_on:
            if dep not in active:
                why = "is not defined" if dep not in every else f"needs profile {', '.join(every[dep].profiles)}"
                raise ComposeError(f"services.{service.name}.depends_on: {dep} {why}")
    used = {mount.source for svc in active.values() for mount in svc.volumes if mount.kind == "volume"}
    declared = set((model.get("volumes") or {}).keys())
    if used - declared:
        raise ComposeError(
            f"named volumes used but not declared under `volumes:`: {', '.join(sorted(used - declared))}"
        )
    return StackPlan(
        project=project,
        network=f"{project}_default",
        volumes=tuple(f"{project}_{name}" for name in (model.get("volumes") or {}) if name in used),
        services=tuple(active[name] for name in start_order(active)),
    )
