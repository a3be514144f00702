"""The compose files as Docker Compose itself resolves them (`docker-compose config`: interpolated, merged,
normalised), so that the tests read what compose will run, not their own parse of the YAML."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = [ROOT / "docker-compose.yml"]
GPU = [*BASE, ROOT / "docker-compose.gpu.yml"]


def compose_command() -> list[str]:
    """Debian's docker-compose 1.29, or the v2 plugin (`docker compose`); skips when neither is installed."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    pytest.skip("Docker Compose is not installed (apt-get install docker-compose)")


TOKEN = "compose-test-token"  # compose refuses to render without TRINITY_AUTH_TOKEN


def config(files: list[Path], env: dict[str, str], *profiles: str) -> subprocess.CompletedProcess[str]:
    """`config` run on `files`, with `env` as the only TRINITY_* variables."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")} | env
    args = [*compose_command(), *(a for f in files for a in ("-f", str(f)))]
    args += [a for p in profiles for a in ("--profile", p)]
    return subprocess.run([*args, "config"], capture_output=True, text=True, cwd=ROOT, env=environ)


def resolved(files: list[Path], env: dict[str, str] | None = None, *profiles: str) -> dict[str, Any]:
    """The whole compose model that `config` prints, with `env` (plus TOKEN, unless it sets one) as the only
    TRINITY_* variables."""
    done = config(files, {"TRINITY_AUTH_TOKEN": TOKEN} | (env or {}), *profiles)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@dataclass(frozen=True)
class Mount:
    source: str
    target: str


def mounts(service: dict[str, Any]) -> list[Mount]:
    """Volumes in either of the forms compose prints: `source:target[:mode]` (1.29) or mappings (v2)."""
    out = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            out.append(Mount(str(volume["source"]), str(volume["target"])))
        else:
            source, target, *_ = volume.split(":")
            out.append(Mount(source, target))
    return out


def container_ports(service: dict[str, Any]) -> list[int]:
    """The container side of each published port (`host:published:target/proto` or a v2 mapping)."""
    ports = []
    for port in service.get("ports", []):
        target = port["target"] if isinstance(port, dict) else port.split("/")[0].rsplit(":", 1)[-1]
        ports.append(int(target))
    return ports


def published(service: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(host ip, host port or range, container port) of each published port."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((port.get("host_ip", ""), str(port.get("published", "")), int(port["target"])))
        else:
            *host, target = port.split("/")[0].split(":")
            ip, host_port = (host[0], host[1]) if len(host) == 2 else ("", host[0])
            out.append((ip, host_port, int(target)))
    return out


def start_order(services: dict[str, dict[str, Any]]) -> list[str]:
    """Dependencies first, as compose starts them (`depends_on`), ties broken by name."""
    order: list[str] = []
    pending = dict(services)
    while pending:
        ready = sorted(n for n, s in pending.items() if set(s.get("depends_on", {})) <= set(order))
        assert ready, f"depends_on has a cycle among {sorted(pending)}"
        order.append(ready[0])
        del pending[ready[0]]
    return order
