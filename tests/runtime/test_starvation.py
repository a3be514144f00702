"""No starvation: open WatchRun streams and long-poll reads never starve health checks, heartbeats or a run.

A live tiny run on a local stack, with 200 WatchRun streams of that run (each read to its end, as `trinity run`
reads one) and 100 long-poll ReadExperiences (60 s waits on a stream of their own, sent again whenever one
returns, so none of the run's experiences is taken) held open from this process, on one asyncio loop in a
thread. While they are open the test keeps asking both services for their health and the gateway for its
instances, until the run is over. Under the former thread-per-call servers 32 of either call froze the
service (every health check timed out; the run failed with "trainer ... lost").
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import ServiceProcess
from tests.e2e.conftest import tiny_config
from tests.runtime.redis_waits import blocked_reads, wait_for
from trinity.cli.launcher import LocalStack
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.gateway.runs import TERMINAL
from trinity.runtime.client import open_channel
from trinity.sdk import TrinityClient
from trinity.v1 import buffer_pb2, buffer_pb2_grpc, gateway_pb2, gateway_pb2_grpc

WATCHES, POLLS, CHECKS = 200, 100, 50
DEADLINE = 5.0  # each health check's gRPC deadline
SERVING = health_pb2.HealthCheckResponse.SERVING


class OpenCalls:
    """WatchRun streams and long-poll reads held open from one asyncio loop in a thread of its own."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="open-calls", daemon=True)
        self._thread.start()
        self._channels: list[grpc.aio.Channel] = []
        self.watches: list[asyncio.Task[list[gateway_pb2.RunEvent]]] = []
        self.polls: list[asyncio.Task[None]] = []

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def watch(self, gateway: str, run_id: str, n: int) -> None:
        async def follow(stub: gateway_pb2_grpc.GatewayServiceStub) -> list[gateway_pb2.RunEvent]:
            return [event async for event in stub.WatchRun(gateway_pb2.WatchRunRequest(run_id=run_id))]

        async def start() -> None:
            stub = gateway_pb2_grpc.GatewayServiceStub(self._channel(gateway))
            self.watches += [asyncio.create_task(follow(stub)) for _ in range(n)]

        self._run(start())

    def long_poll(self, buffer: str, stream: str, n: int) -> None:
        async def poll(stub: buffer_pb2_grpc.BufferServiceStub, consumer: str) -> None:
            request = buffer_pb2.ReadExperiencesRequest(stream=stream, consumer=consumer, batch_size=1, block_ms=60_000)
            while True:  # a wait that ends empty is sent again: the poll stays open until cancelled
                await stub.ReadExperiences(request, timeout=90)

        async def start() -> None:
            stub = buffer_pb2_grpc.BufferServiceStub(self._channel(buffer))
            self.polls += [asyncio.create_task(poll(stub, f"idle-{i}")) for i in range(n)]

        self._run(start())

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = grpc.aio.insecure_channel(address)
        self._channels.append(channel)
        return channel

    def watched(self) -> list[list[gateway_pb2.RunEvent]] | None:
        """The events of every watch once all have ended (a watch that failed raises), None while some are open."""

        async def collect() -> list[list[gateway_pb2.RunEvent]] | None:
            if not all(task.done() for task in self.watches):
                return None
            return [task.result() for task in self.watches]

        result: list[list[gateway_pb2.RunEvent]] | None = self._run(collect())
        return result

    def cancel(self, tasks: list[asyncio.Task[Any]]) -> None:
        async def cancel_all() -> None:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self._run(cancel_all())

    def close(self) -> None:
        self.cancel([*self.watches, *self.polls])

        async def close_channels() -> None:
            for channel in self._channels:
                await channel.close()

        self._run(close_channels())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _pid(stack: LocalStack, name: str) -> int:
    process = stack.services[name].process
    assert process is not None, f"{name} is not running"
    return process.pid


@dataclass
class Samples:
    """What the test saw while the calls were open."""

    health: dict[str, list[float]] = field(default_factory=lambda: {"gateway": [], "buffer": []})
    failures: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)  # instances the gateway listed as not alive
    threads: dict[str, int] = field(default_factory=dict)  # most threads seen in each service process


@dataclass
class LoadedRun:
    stack: LocalStack
    calls: OpenCalls
    idle_stream: str
    final: gateway_pb2.Run
    samples: Samples


def _check(channel: grpc.Channel, name: str, samples: Samples) -> None:
    start = time.perf_counter()
    try:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE).status
    except grpc.RpcError as err:
        samples.failures.append(f"{name}: {err.code().name}")
        return
    samples.health[name].append(time.perf_counter() - start)
    if status != SERVING:
        samples.failures.append(f"{name}: {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")


def _sample_until_over(stack: LocalStack, run_id: str) -> Samples:
    """Health of both services and the gateway's instance list, over and over, until the run is over and each
    service answered CHECKS health checks."""
    samples = Samples()
    pids = {name: _pid(stack, name) for name in ("gateway", "buffer")}
    with open_channel(stack.gateway) as gateway, open_channel(stack.services["buffer"].address) as buffer:
        stub = gateway_pb2_grpc.GatewayServiceStub(gateway)
        while True:
            _check(gateway, "gateway", samples)
            _check(buffer, "buffer", samples)
            instances = stub.ListInstances(gateway_pb2.ListInstancesRequest(), timeout=DEADLINE).instances
            samples.dead += [f"{i.service} {i.instance_id}" for i in instances if not i.alive]
            for name, pid in pids.items():
                samples.threads[name] = max(samples.threads.get(name, 0), psutil.Process(pid).num_threads())
            over = stub.GetRun(gateway_pb2.GetRunRequest(run_id=run_id), timeout=DEADLINE).state in TERMINAL
            if over and min(len(times) for times in samples.health.values()) >= CHECKS:
                return samples
            time.sleep(0.1)  # probes, not a load of their own on two cores


@pytest.fixture(scope="module")
def loaded_run(tiny_model, tmp_path_factory) -> Iterator[LoadedRun]:
    tmp = tmp_path_factory.mktemp("starvation")
    stack = LocalStack.up(tmp / "logs", explorers=1)
    calls = OpenCalls()
    try:
        buffer = stack.services["buffer"]
        assert stack.redis is not None
        redis_url = stack.redis.url
        idle_stream = "idle-" + tmp.name[-8:]
        with BufferClient(buffer.address) as client:
            client.create_stream(StreamConfig(name=idle_stream))
        calls.long_poll(buffer.address, idle_stream, POLLS)
        wait_for(lambda: blocked_reads(redis_url, _pid(stack, "buffer")) >= POLLS, f"{POLLS} long polls waiting")
        with TrinityClient(stack.gateway) as client:
            run = client.create_run(tiny_config(tiny_model))
            calls.watch(stack.gateway, run.id, WATCHES)
            samples = _sample_until_over(stack, run.id)
            final = run.status()
        wait_for(lambda: calls.watched() is not None, "every watch ended with the run")
        yield LoadedRun(stack, calls, idle_stream, final, samples)
    finally:
        calls.close()
        stack.down()


def _ms(times: list[float], q: float) -> float:
    return sorted(times)[min(len(times) - 1, int(q * len(times)))] * 1000


def test_health_answers_while_streams_and_long_polls_are_open(loaded_run):
    samples = loaded_run.samples
    for name, times in samples.health.items():
        print(
            f"\n{name} health with {WATCHES} WatchRun + {POLLS} long polls open: {len(times)} checks, "
            f"p50 {statistics.median(times) * 1000:.1f} ms, p99 {_ms(times, 0.99):.1f} ms, "
            f"max {max(times) * 1000:.1f} ms; most threads {samples.threads[name]}"
        )
    assert samples.failures == []  # every check answered SERVING within its deadline


def test_heartbeats_keep_every_instance_alive(loaded_run):
    assert loaded_run.samples.dead == []
    (events, *_) = loaded_run.calls.watched()
    assert [e.message for e in events if "lost" in e.message] == []


def test_the_run_succeeds(loaded_run):
    final = loaded_run.final
    assert gateway_pb2.RunState.Name(final.state) == "RUN_STATE_SUCCEEDED", final.error
    assert final.train_step == 3


def test_every_watch_follows_the_run_to_its_end(loaded_run):
    watched = loaded_run.calls.watched()
    assert len(watched) == WATCHES
    first = [e.seq for e in watched[0]]
    assert all([e.seq for e in events] == first for events in watched)  # each saw every event, once, in order
    assert watched[0][-1].state == gateway_pb2.RUN_STATE_SUCCEEDED


def test_cancelled_long_polls_stop_waiting_and_the_buffer_answers(loaded_run):
    stack, calls = loaded_run.stack, loaded_run.calls
    assert stack.redis is not None
    calls.cancel(calls.polls)
    wait_for(lambda: blocked_reads(stack.redis.url, _pid(stack, "buffer")) == 0, "no Redis wait left in the buffer")
    with BufferClient(stack.services["buffer"].address) as client:
        assert len(client.read(loaded_run.idle_stream, "after", 1)) == 0


def test_cancelled_watches_stop_waiting_on_redis(redis_server, tiny_model):
    gateway = ServiceProcess("gateway", env={"TRINITY_REDIS_URL": redis_server.url}).start()
    assert gateway.process is not None
    calls = OpenCalls()
    try:
        with TrinityClient(gateway.address) as client:
            run = client.create_run(tiny_config(tiny_model))  # stays PENDING: no services registered
            calls.watch(gateway.address, run.id, WATCHES)
            wait_for(lambda: blocked_reads(redis_server.url, gateway.process.pid) > 0, "watches waiting on Redis")
            calls.cancel(calls.watches)
            wait_for(lambda: blocked_reads(redis_server.url, gateway.process.pid) == 0, "no Redis wait left")
            assert run.cancel().state == gateway_pb2.RUN_STATE_CANCELLED  # the gateway answers; no run left behind
    finally:
        calls.close()
        gateway.stop()
