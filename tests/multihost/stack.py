"""The services of a run spread over test hosts: each started on its host with the same entrypoint as in a
container (`python -m trinity.runtime.serve <service>`), bound to every address of its namespace and advertising
the host's own address, so every other host dials it across the bridge.

Redis, the gateway and the buffer share one host (the control plane and its state: a deployment keeps them
together too, and Redis is reached over that host's loopback only). The trainer ranks and the explorers each get
hosts of their own: every link the run depends on (the ranks' collectives, the weight-sync group, experiences,
control) then crosses a veth. The test process (root namespace) reaches the gateway over the bridge.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tests.multihost.netns import IFNAME, NetnsHost
from trinity.runtime.client import wait_until_serving
from trinity.runtime.redis_server import find_redis_server, redis_server_command

REDIS_PORT = 6379
REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/0"  # on the control host
PORTS = {"gateway": 50051, "buffer": 50052, "explorer": 50053, "trainer": 50054}  # each host has its own ports


def host_env(host: NetnsHost, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process on `host`: gloo on the host's veth (the hostname resolves to 127.0.0.1, where
    gloo would otherwise bind), one compute thread each (two cores for the whole run)."""
    return {
        **os.environ,
        "GLOO_SOCKET_IFNAME": IFNAME,
        "VLLM_HOST_IP": host.address,
        "OMP_NUM_THREADS": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
        **(extra or {}),
    }


def start_redis(
    host: NetnsHost, log_dir: Path, timeout: float = 30.0, *, on_network: bool = False
) -> subprocess.Popen[bytes]:
    """redis-server on `host`'s loopback (protected mode refuses other addresses), for the services beside it;
    `on_network`: on its eth0 address too, unprotected, for a link that leaves the host (through a fault proxy)."""
    directory = Path(tempfile.mkdtemp(prefix="redis-", dir=log_dir))
    command = redis_server_command(find_redis_server(), REDIS_PORT, directory)
    if on_network:
        command[command.index("--bind") + 1 : command.index("--bind") + 2] = ["127.0.0.1", host.address]
        command[command.index("--protected-mode") + 1] = "no"
    process = host.popen(command, env=host_env(host), log=log_dir / "redis.out")
    # Asked from inside the host, where its loopback is; the check itself is bounded by `timeout`.
    ready = "import sys; from trinity.runtime.redis_server import RedisServer as R; R(sys.argv[1]).wait_until_ready()"
    done = host.run([sys.executable, "-c", ready, REDIS_URL], timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"redis-server on {host.label} did not answer: {done.stderr[-2000:]}")
    return process


def start_service(
    host: NetnsHost, service: str, log_dir: Path, env: Mapping[str, str], timeout: float = 120.0
) -> subprocess.Popen[bytes]:
    """`service` on `host` at its port in PORTS; returns once it reports SERVING at the host's address."""
    port = PORTS[service]
    command = [sys.executable, "-m", "trinity.runtime.serve", service, "--port", str(port), "--host", "0.0.0.0"]
    settings = {"TRINITY_ADVERTISE_HOST": host.address, "TRINITY_INSTANCE_ID": f"{service}-{host.label}", **env}
    log = log_dir / f"{service}-{host.label}.log"
    process = host.popen(command, env=host_env(host, settings), log=log)
    try:
        wait_until_serving(f"{host.address}:{port}", timeout=timeout)
    except TimeoutError:
        raise RuntimeError(f"{service} on {host.label} did not start:\n{log.read_text()[-4000:]}") from None
    return process
