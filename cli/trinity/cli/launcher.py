"""The local stack behind `trinity run`: Redis and the four services as processes on loopback ports.

The processes run the same entrypoint the containers run (`trinity-serve <service>`), so what works
here works in docker compose and on Kubernetes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trinity.runtime.client import wait_until_serving
from trinity.runtime.redis_server import RedisServer, free_port, start_redis_server
from trinity.runtime.serve import PARENT_ENV


@dataclass
class ServiceHandle:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    service: str
    env: dict[str, str]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class LocalStack:
    """Start with `LocalStack.up(...)`; `down()` stops everything (SIGTERM, then SIGKILL)."""

    log_dir: Path
    redis: RedisServer | None = None
    services: dict[str, ServiceHandle] = field(default_factory=dict)

    @property
    def gateway(self) -> str:
        return self.services["gateway"].address

    @classmethod
    def up(
        cls,
        log_dir: Path,
        *,
        explorers: int = 1,
        trainer_threads: int | None = None,
        explorer_threads: int = 1,
        extra_env: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> LocalStack:
        log_dir.mkdir(parents=True, exist_ok=True)
        stack = cls(log_dir=log_dir)
        try:
            stack.redis = start_redis_server(data_dir=log_dir / "redis")
            cores = os.cpu_count() or 2
            base = {
                **os.environ,
                **(extra_env or {}),
                "TRINITY_REDIS_URL": stack.redis.url,
                "OMP_WAIT_POLICY": "PASSIVE",  # idle OpenMP threads must not spin on 2 cores
                "TOKENIZERS_PARALLELISM": "false",
            }
            stack._start("gateway", base, timeout)
            base["TRINITY_GATEWAY"] = stack.gateway
            # The rest start side by side (they only need the gateway): their imports overlap.
            threads = str(trainer_threads or cores)
            stack._spawn("buffer", base)
            stack._spawn("trainer", {**base, "OMP_NUM_THREADS": threads, "TRINITY_TRAINER_THREADS": threads})
            # Fixed at process start: vLLM's CPU worker disables torch.set_num_threads once it runs.
            for i in range(explorers):
                stack._spawn(f"explorer-{i}", {**base, "OMP_NUM_THREADS": str(explorer_threads)}, service="explorer")
            for name in list(stack.services)[1:]:
                stack._wait(name, timeout)
        except BaseException:
            stack.down()
            raise
        return stack

    def _start(self, name: str, env: dict[str, str], timeout: float, service: str | None = None) -> None:
        self._spawn(name, env, service)
        self._wait(name, timeout)

    def _spawn(self, name: str, env: dict[str, str], service: str | None = None) -> None:
        port = free_port()
        log_path = self.log_dir / f"{name}.log"
        env = {**env, "TRINITY_INSTANCE_ID": f"{name}-{port}"}
        command = [sys.executable, "-m", "trinity.runtime.serve", service or name, "--port", str(port)]
        command += ["--host", "127.0.0.1"]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command, env={**env, PARENT_ENV: str(os.getpid())}, stdout=log, stderr=subprocess.STDOUT
            )
        self.services[name] = ServiceHandle(name, port, process, log_path, service or name, env)

    def _wait(self, name: str, timeout: float) -> None:
        handle = self.services[name]
        try:
            wait_until_serving(handle.address, timeout=timeout)
        except TimeoutError:
            tail = handle.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} did not start within {timeout:.0f}s; its log ends with:\n{tail}") from None

    def restart(self, name: str, timeout: float = 120.0) -> ServiceHandle:
        """Kill a service process hard and start it again, as the same instance (for failure drills)."""
        old = self.services[name]
        old.process.kill()
        old.process.wait()
        self._start(name, old.env, timeout, service=old.service)
        return self.services[name]

    def down(self, grace: float = 30.0) -> None:
        """Stop services in reverse start order: explorers and trainer drain before buffer and gateway."""
        for handle in reversed(list(self.services.values())):
            if handle.process.poll() is None:
                handle.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for handle in self.services.values():
            remaining = max(0.1, deadline - time.monotonic())
            try:
                handle.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                handle.process.kill()
                handle.process.wait()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
