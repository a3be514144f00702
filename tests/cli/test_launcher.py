"""The local launcher's supervisor (restarts as the same instance, a restart limit, nothing left behind, Redis
keeps what it acknowledged) and the run watch that `trinity run` follows through a gateway restart."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis

from tests.e2e.conftest import tiny_config
from trinity.cli.launcher import LocalStack, RestartPolicy
from trinity.clients import GatewayClient
from trinity.runtime.allocator import jemalloc_library
from trinity.sdk import TrinityClient
from trinity.v1 import gateway_pb2

QUICK = RestartPolicy(backoff=0.1)  # the default's first back-off is 1 s

# A launcher in its own process: it prints the pids it started, then lives until it is killed.
LAUNCHER = """
import json, sys, time
from pathlib import Path
from trinity.cli.launcher import LocalStack
stack = LocalStack.up(Path(sys.argv[1]), roles=("gateway", "buffer"))
print(json.dumps([stack.redis.process.pid] + [h.process.pid for h in stack.services.values()]), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_killed_service_is_restarted_on_its_port_as_the_same_instance(tmp_path):
    stack = LocalStack.up(tmp_path, roles=("gateway", "buffer"), policy=QUICK)
    try:
        before = stack.services["buffer"]
        port, pid = before.port, before.process.pid
        instance_id = psutil.Process(pid).environ()["TRINITY_INSTANCE_ID"]
        after = stack.restart("buffer")  # returns once the replacement is SERVING
        assert after.process.pid != pid
        assert after.port == port
        assert psutil.Process(after.process.pid).environ()["TRINITY_INSTANCE_ID"] == instance_id
        assert stack.restarts == {"redis": 0, "gateway": 0, "buffer": 1}
    finally:
        stack.down()


def test_a_process_past_its_restart_limit_stays_down_and_is_reported(tmp_path):
    reported: list[str] = []
    policy = RestartPolicy(limit=1, backoff=0.1)
    stack = LocalStack.up(tmp_path, roles=("gateway", "buffer"), policy=policy, on_give_up=reported.append)
    try:
        stack.kill("buffer")  # the one restart allowed
        with pytest.raises(RuntimeError, match="stays down"):
            stack.kill("buffer")
        assert reported == [stack.given_up["buffer"]]
        assert reported[0].startswith("buffer exited (killed by SIGKILL); restarted 1 times")
        assert stack.services["buffer"].process.poll() is not None
    finally:
        stack.down()


def test_a_sigkilled_launcher_leaves_no_process_behind(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    line = launcher.stdout.readline()
    if not line:
        launcher.wait()
        pytest.fail(f"the launcher did not start its stack:\n{launcher.stderr.read().decode()[-3000:]}")
    children = json.loads(line)
    assert all(_alive(pid) for pid in children)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 60
    while left := [pid for pid in children if _alive(pid)]:
        assert time.monotonic() < deadline, f"still running after the launcher was killed: {left}"
        time.sleep(0.2)


def test_what_redis_acknowledged_survives_its_sigkill_and_restart(tmp_path):
    stack = LocalStack.up(tmp_path, roles=("gateway",), policy=QUICK)
    try:
        with redis.Redis.from_url(stack.redis.url) as client, client.pipeline(transaction=False) as pipe:
            for i in range(1000):
                pipe.xadd("acknowledged", {"i": str(i)})
            pipe.execute()
        stack.kill("redis")  # at once: nothing waits for the once-a-second fsync
        stack.redis.wait_until_ready()
        with redis.Redis.from_url(stack.redis.url) as client:  # the same port, the same data directory
            assert client.xlen("acknowledged") == 1000
        assert stack.restarts["redis"] == 1
    finally:
        stack.down()


def test_a_watch_resumes_across_a_gateway_restart_without_repeating_or_missing_events(tmp_path, tiny_model):
    stack = LocalStack.up(tmp_path, roles=("gateway",), policy=QUICK)
    try:
        with TrinityClient(stack.gateway) as client, GatewayClient(stack.gateway) as reporter:
            run = client.create_run(tiny_config(tiny_model))  # stays PENDING: no service to run it

            def report(message: str) -> None:
                reporter.report(gateway_pb2.RunEvent(run_id=run.id, kind=gateway_pb2.EVENT_KIND_LOG, message=message))

            seen: list[gateway_pb2.RunEvent] = []

            def follow() -> None:
                for event in run.watch():
                    seen.append(event)

            watcher = threading.Thread(target=follow)
            watcher.start()
            report("before")
            _wait_until(lambda: any(e.message == "before" for e in seen), "the watch to see the first event")
            stack.restart("gateway")  # SIGKILL: the watch's stream breaks
            report("after")
            run.cancel()
            watcher.join(timeout=120)
            assert not watcher.is_alive(), "the watch did not end with the run"
            log = list(run.watch())  # the whole event log of the ended run, in one stream
        assert [e.seq for e in seen] == [e.seq for e in log]
        assert [e.message for e in seen if e.message in ("before", "after")] == ["before", "after"]
    finally:
        stack.down()


def test_the_console_starts_beside_the_stack_and_reaches_its_gateway(tmp_path):
    import httpx

    stack = LocalStack.up(tmp_path, roles=("gateway",), policy=QUICK)
    try:
        url = stack.add_console(0)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/")
        assert httpx.get(url + "health", timeout=10).json() == {"status": "ok", "gateway": True}
        console = stack.services["console"].process
    finally:
        stack.down()
    assert console.poll() is not None  # stopped with the stack


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as maps:
        return maps.read()


@pytest.mark.skipif(jemalloc_library() is None, reason="jemalloc is not installed (Debian: libjemalloc2)")
def test_the_trainer_runs_on_jemalloc_and_the_gateway_on_the_system_allocator(tmp_path):
    stack = LocalStack.up(tmp_path, roles=("gateway", "trainer"), policy=QUICK)
    try:
        assert "libjemalloc" in _maps(stack.services["trainer"].process.pid)
        assert "libjemalloc" not in _maps(stack.services["gateway"].process.pid)
    finally:
        stack.down()


def _logged_at(log: Path, event: str) -> float:
    """When a service's JSON log says `event` (seconds since the epoch)."""
    from datetime import datetime

    (line,) = [json.loads(line) for line in log.read_text().splitlines() if f'"event": "{event}"' in line]
    return datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()


def test_down_stops_the_gateway_only_after_the_trainer_has_stopped(tmp_path):
    # The trainer's last reports go to the gateway: signalled together, they retried until its shutdown timeout.
    stack = LocalStack.up(tmp_path, roles=("gateway", "buffer", "trainer"), policy=QUICK)
    stack.down()
    trainer_stopped = _logged_at(tmp_path / "trainer.log", "service.stopped")
    assert trainer_stopped <= _logged_at(tmp_path / "gateway.log", "service.signal")
    assert trainer_stopped <= _logged_at(tmp_path / "buffer.log", "service.signal")
