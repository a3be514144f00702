"""The local stack behind `trinity run`: Redis and the four services as processes on loopback ports,
kept alive by a supervisor.

The processes run the same entrypoint the containers run (`trinity-serve <service>`), so what works
here works in docker compose and on Kubernetes. As compose's restart policy and Kubernetes' back-off do,
the supervisor restarts a process that dies while the stack is up (any exit, SIGKILL included) with the
same port and the same TRINITY_INSTANCE_ID: addresses stay valid for the others, and a restarted trainer
or explorer is recognisably the same instance slot. Redis comes back on its port and its data directory
(append-only file). Every process gets SIGKILL when the launcher dies, however it dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any, Protocol

import structlog
from tenacity import RetryCallState, Retrying, stop_after_attempt, wait_exponential

from trinity.runtime.allocator import with_jemalloc
from trinity.runtime.client import wait_until_serving
from trinity.runtime.redis_server import (
    RedisServer,
    die_with_parent,
    find_redis_server,
    free_port,
    redis_server_command,
)
from trinity.runtime.serve import PARENT_ENV

ROLES = ("gateway", "buffer", "trainer", "explorer")
CORE_GRACE_S = 5.0  # LocalStack.down: what the buffer and gateway get to drain however long the others took
SUPERVISOR_LOG = "supervisor.log"


@dataclass(frozen=True)
class RestartPolicy:
    """How a process that died while the stack is up comes back: after `backoff` seconds, doubling with
    each restart up to `max_backoff`, at most `limit` times over the stack's life; then it stays down."""

    limit: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0

    def retrying(self, sleep: Callable[[float], None], before_sleep: Callable[[RetryCallState], None]) -> Retrying:
        return Retrying(
            stop=stop_after_attempt(self.limit + 1),
            wait=wait_exponential(multiplier=self.backoff, max=self.max_backoff),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        )


class ProcessExited(Exception):
    def __init__(self, name: str, returncode: int) -> None:
        if returncode < 0:
            try:
                how = f"killed by {signal.Signals(-returncode).name}"
            except ValueError:
                how = f"killed by signal {-returncode}"
        else:
            how = f"exit code {returncode}"
        super().__init__(f"{name} exited ({how})")


class _HoldsProcess(Protocol):
    process: subprocess.Popen[bytes] | None


@dataclass
class ServiceHandle:
    name: str
    port: int
    log_path: Path
    service: str
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None  # the current incarnation: a restart replaces it

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class _Slot:
    """One supervised process: the thread that starts every incarnation of it, and where it keeps the current one."""

    name: str
    owner: _HoldsProcess
    spawn: Callable[[], subprocess.Popen[bytes]]
    log_path: Path
    thread: threading.Thread | None = None


def _spawn(command: list[str], env: dict[str, str] | None, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:  # appended: a restarted process's log follows its predecessor's
        # Started from the slot's thread, which outlives the process: the death signal is tied to it.
        return subprocess.Popen(
            die_with_parent(command), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )


@dataclass
class LocalStack:
    """Start with `LocalStack.up(...)`; `down()` stops everything (SIGTERM, then SIGKILL).

    `restarts` counts each process's restarts ("redis" and the service names); `given_up` holds, for a
    process past the restart limit, the line that says so (also written to supervisor.log in the log
    directory and handed to `on_give_up`).
    """

    log_dir: Path
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    on_give_up: Callable[[str], None] | None = None
    redis: RedisServer | None = None
    services: dict[str, ServiceHandle] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    given_up: dict[str, str] = field(default_factory=dict)
    _ports: set[int] = field(default_factory=set, repr=False)
    _slots: dict[str, _Slot] = field(default_factory=dict, repr=False)
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _stopping: threading.Event = field(default_factory=threading.Event, repr=False)
    _log_file: IO[str] = field(init=False, repr=False)
    _log: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._log_file = (self.log_dir / SUPERVISOR_LOG).open("a")
        self._log = structlog.wrap_logger(
            structlog.WriteLogger(self._log_file),
            wrapper_class=structlog.BoundLogger,
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.JSONRenderer(),
            ],
        )

    def _new_port(self) -> int:
        """A free port none of this stack's processes was handed: a port is only taken once its process binds it,
        so two services started side by side could otherwise be handed the same one."""
        port = free_port()
        while port in self._ports:
            port = free_port()
        self._ports.add(port)
        return port

    @property
    def gateway(self) -> str:
        return self.services["gateway"].address

    @classmethod
    def up(
        cls,
        log_dir: Path,
        *,
        roles: Collection[str] = ROLES,
        explorers: int = 1,
        trainer_threads: int | None = None,
        explorer_threads: int = 1,
        extra_env: dict[str, str] | None = None,
        timeout: float = 120.0,
        policy: RestartPolicy | None = None,
        on_give_up: Callable[[str], None] | None = None,
        trackers_dir: Path | None = None,
        visible_devices: Mapping[str, str] | None = None,
    ) -> LocalStack:
        """Redis, the gateway, then the other `roles` side by side; returns once every service is SERVING. With
        `trackers_dir`, the trackers service too, writing every run's TensorBoard, MLflow and W&B files there.
        `visible_devices` is the CUDA_VISIBLE_DEVICES of the processes it names ("trainer", "explorer-0", ...:
        `placement.visible_devices`); the others inherit the launcher's."""
        gpus = {name: {"CUDA_VISIBLE_DEVICES": value} for name, value in (visible_devices or {}).items()}
        if not set(roles) <= set(ROLES) or "gateway" not in roles:
            raise ValueError(f"roles: a subset of {', '.join(ROLES)} with the gateway in it (got {sorted(roles)})")
        log_dir.mkdir(parents=True, exist_ok=True)
        stack = cls(log_dir=log_dir, policy=policy or RestartPolicy(), on_give_up=on_give_up)
        try:
            stack._start_redis(timeout)
            assert stack.redis is not None
            cores = os.cpu_count() or 2
            base = {
                **os.environ,
                **(extra_env or {}),
                "TRINITY_REDIS_URL": stack.redis.url,
                "OMP_WAIT_POLICY": "PASSIVE",  # idle OpenMP threads must not spin on 2 cores
                "TOKENIZERS_PARALLELISM": "false",
            }
            stack._add_service("gateway", base)
            stack.wait_serving("gateway", timeout)
            base["TRINITY_GATEWAY"] = stack.gateway
            # The rest start side by side (they only need the gateway): their imports overlap.
            threads = str(trainer_threads or cores)
            if "buffer" in roles:
                stack._add_service("buffer", base)
            # The trainer's and the explorers' steps allocate gigabytes of changing sizes: jemalloc (runtime.allocator).
            tensors = with_jemalloc(base)
            if "trainer" in roles:
                trainer_env = {
                    **tensors,
                    "OMP_NUM_THREADS": threads,
                    "TRINITY_TRAINER_THREADS": threads,
                    **gpus.get("trainer", {}),
                }
                stack._add_service("trainer", trainer_env)
            if "explorer" in roles:
                # Fixed at process start: vLLM's CPU worker disables torch.set_num_threads once it runs.
                for i in range(explorers):
                    explorer_env = {
                        **tensors,
                        "OMP_NUM_THREADS": str(explorer_threads),
                        **gpus.get(f"explorer-{i}", {}),
                    }
                    stack._add_service(f"explorer-{i}", explorer_env, service="explorer")
            if trackers_dir is not None:
                stack._add_service("trackers", {**base, "TRINITY_TRACKERS_DIR": str(trackers_dir)})
            for name in list(stack.services)[1:]:
                stack.wait_serving(name, timeout)
        except BaseException:
            stack.down()
            raise
        return stack

    def _start_redis(self, timeout: float) -> None:
        port, directory = self._new_port(), self.log_dir / "redis"
        directory.mkdir(exist_ok=True)
        self.redis = RedisServer(url=f"redis://127.0.0.1:{port}/0", data_dir=directory)
        # Its early errors (a taken port) land in the file it logs to once started.
        command = redis_server_command(find_redis_server(), port, directory)
        self._supervise("redis", self.redis, command, None, directory / "redis.log")
        self.redis.wait_until_ready(timeout)

    def _add_service(self, name: str, env: dict[str, str], service: str | None = None) -> None:
        port = self._new_port()
        env = {**env, "TRINITY_INSTANCE_ID": f"{name}-{port}", PARENT_ENV: str(os.getpid())}
        handle = ServiceHandle(name, port, self.log_dir / f"{name}.log", service or name, env)
        command = [sys.executable, "-m", "trinity.runtime.serve", handle.service, "--port", str(port)]
        command += ["--host", "127.0.0.1"]
        self.services[name] = handle
        self._supervise(name, handle, command, env, handle.log_path)

    def add_console(self, port: int, timeout: float = 60.0) -> str:
        """The console (the web UI) on `port` (0: any free one), supervised like the services; its URL once it
        answers. It serves HTTP, not gRPC: its health is its /health page."""
        port = port or self._new_port()
        env = {**self.services["gateway"].env, "TRINITY_GATEWAY": self.gateway, "TRINITY_CONSOLE_HOST": "127.0.0.1"}
        handle = ServiceHandle("console", port, self.log_dir / "console.log", "console", env)
        self.services["console"] = handle  # last in: stopped first
        command = [sys.executable, "-m", "trinity.console.server", "--port", str(port)]
        self._supervise("console", handle, command, env, handle.log_path)
        url = f"http://{handle.address}/"
        deadline = time.monotonic() + timeout
        while "console" not in self.given_up and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "health", timeout=2) as reply:
                    if reply.status == 200:
                        return url
            except OSError:
                self._stopping.wait(0.2)
        reason = self.given_up.get("console") or f"the console did not answer within {timeout:.0f}s"
        raise RuntimeError(f"{reason}; its log ends with:\n{handle.log_path.read_text(errors='replace')[-3000:]}")

    def _supervise(
        self, name: str, owner: _HoldsProcess, command: list[str], env: dict[str, str] | None, log_path: Path
    ) -> None:
        """Start `command` from a thread of its own that restarts it when it dies; return once it is started."""
        slot = _Slot(name, owner, partial(_spawn, command, env, log_path), log_path)
        self._slots[name] = slot
        self.restarts[name] = 0
        slot.thread = threading.Thread(target=self._keep_alive, args=(slot,), name=f"supervise-{name}", daemon=True)
        slot.thread.start()
        with self._changed:
            self._changed.wait_for(
                lambda: owner.process is not None or name in self.given_up or self._stopping.is_set()
            )

    def _keep_alive(self, slot: _Slot) -> None:
        retrying = self.policy.retrying(sleep=self._pause, before_sleep=partial(self._on_exit, slot))
        try:
            for attempt in retrying:
                with attempt:
                    self._run(slot, restarts=attempt.retry_state.attempt_number - 1)
        except Exception as err:  # noqa: BLE001 - its last exit (or failed start) past the limit
            self._give_up(slot, err)

    def _run(self, slot: _Slot, restarts: int) -> None:
        """One incarnation: start it (unless the stack is stopping) and wait for it to exit."""
        with self._changed:  # down() sets _stopping under this lock: no process starts after it looked
            if self._stopping.is_set():
                return
            process = slot.owner.process = slot.spawn()
            self.restarts[slot.name] = restarts
            self._changed.notify_all()
        if restarts:
            self._log.info("process.restarted", name=slot.name, restarts=restarts, pid=process.pid)
        returncode = process.wait()
        if not self._stopping.is_set():
            raise ProcessExited(slot.name, returncode)

    def _pause(self, seconds: float) -> None:
        self._stopping.wait(seconds)  # a back-off that down() cuts short

    def _on_exit(self, slot: _Slot, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        backoff = state.next_action.sleep if state.next_action is not None else 0.0
        self._log.warning("process.exited", name=slot.name, error=str(error), restart_in_seconds=backoff)

    def _give_up(self, slot: _Slot, err: Exception) -> None:
        restarts = self.restarts[slot.name]
        line = f"{err}; restarted {restarts} times, the limit: it stays down (log: {slot.log_path})"
        self._log.error("process.given_up", name=slot.name, restarts=restarts, error=str(err))
        if self.on_give_up is not None:
            self.on_give_up(line)
        with self._changed:  # last: whoever sees it in `given_up` may rely on the report having been made
            self.given_up[slot.name] = line
            self._changed.notify_all()

    def wait_serving(self, name: str, timeout: float = 120.0) -> None:
        """Until the service reports SERVING; fails at once when the supervisor gives up on it."""
        handle = self.services[name]
        deadline = time.monotonic() + timeout
        while name not in self.given_up and time.monotonic() < deadline:
            try:
                wait_until_serving(handle.address, timeout=min(5.0, max(0.1, deadline - time.monotonic())))
                return
            except TimeoutError:
                continue
        reason = self.given_up.get(name) or f"{name} did not start within {timeout:.0f}s"
        tail = handle.log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{reason}; its log ends with:\n{tail}")

    def kill(self, name: str, timeout: float = 120.0) -> None:
        """SIGKILL a process ("redis" or a service name); return once the supervisor has started its
        replacement, after the policy's back-off. Raises if none comes."""
        slot = self._slots[name]
        with self._changed:
            old = slot.owner.process
            assert old is not None, f"{name} was never started"
            old.kill()
            replaced = self._changed.wait_for(lambda: slot.owner.process is not old or name in self.given_up, timeout)
        if name in self.given_up:
            raise RuntimeError(self.given_up[name])
        if not replaced:
            raise TimeoutError(f"{name} was not restarted within {timeout:.0f}s; see {self.log_dir / SUPERVISOR_LOG}")

    def restart(self, name: str, timeout: float = 120.0) -> ServiceHandle:
        """Kill a service hard and return once its replacement (same port, same instance id) is SERVING."""
        self.kill(name, timeout)
        self.wait_serving(name, timeout)
        return self.services[name]

    def down(self, grace: float = 30.0) -> None:
        """Stop services in waves, within `grace` s in all: the trackers first (their drain writes the runs that just
        ended, which needs the gateway up), then explorers and trainer (their last reports need the gateway: signalled
        together with it, they retried until their own shutdown timeouts of 30 and 60 s), then buffer and gateway,
        which get at least `CORE_GRACE_S` of their own."""
        with self._changed:
            self._stopping.set()  # from here on nothing is restarted
            self._changed.notify_all()
        running = {n: h.process for n, h in reversed(self.services.items()) if h.process and h.process.poll() is None}
        core = ("buffer", "gateway")
        waves = (
            [p for n, p in running.items() if n == "trackers"],
            [p for n, p in running.items() if n != "trackers" and n not in core],
            [p for n, p in running.items() if n in core],
        )
        deadline = time.monotonic() + grace
        for index, wave in enumerate(waves):
            floor = CORE_GRACE_S if index == len(waves) - 1 else 0.1
            for process in wave:
                process.send_signal(signal.SIGTERM)
            for process in wave:
                try:
                    process.wait(timeout=max(floor, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
        for slot in self._slots.values():
            if slot.thread is not None:
                slot.thread.join(timeout=10)
        self._log_file.close()
