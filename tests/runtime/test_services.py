"""Every service process: starts alone, health, reflection, auth, graceful drain, Redis outages."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.buffer.helpers import experience
from tests.conftest import ServiceProcess
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.runtime.client import open_channel
from trinity.runtime.redis_server import free_port, start_redis_server
from trinity.v1 import common_pb2, explorer_pb2_grpc, gateway_pb2_grpc, trainer_pb2_grpc
from trinity.v1.buffer_pb2 import GetStreamRequest
from trinity.v1.buffer_pb2_grpc import BufferServiceStub
from trinity.v1.gateway_pb2 import WatchRunRequest

STUBS = {
    "explorer": explorer_pb2_grpc.ExplorerServiceStub,
    "trainer": trainer_pb2_grpc.TrainerServiceStub,
    "gateway": gateway_pb2_grpc.GatewayServiceStub,
}


def _health(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return reply.status


@pytest.mark.parametrize("name", sorted(STUBS))
def test_each_service_starts_alone_and_reports_serving(name):
    service = ServiceProcess(name).start()
    try:
        assert _health(service.address) == health_pb2.HealthCheckResponse.SERVING
        with open_channel(service.address) as channel:
            status = STUBS[name](channel).GetStatus(common_pb2.GetStatusRequest(), timeout=10)
        assert (status.service, status.state, status.run_id) == (name, "idle", "")
    finally:
        assert service.stop() == 0


def test_buffer_starts_its_own_redis_when_none_is_configured():
    env = {k: v for k, v in os.environ.items() if k != "TRINITY_REDIS_URL"}
    service = ServiceProcess("buffer")
    service.env = env
    service.start()
    try:
        with BufferClient(service.address) as client:
            assert client.create_stream(StreamConfig(name="s")).spec.name == "s"
        assert "redis.started" in service.logs()
    finally:
        assert service.stop() == 0


def test_missing_redis_server_fails_with_a_hint():
    env = {k: v for k, v in os.environ.items() if k != "TRINITY_REDIS_URL"}
    env["PATH"] = os.path.dirname(sys.executable)  # python, but no redis-server
    done = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "serve", "buffer", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "redis-server not found on PATH" in done.stderr and "TRINITY_REDIS_URL" in done.stderr


def test_a_second_service_on_a_taken_port_fails_instead_of_sharing_it(buffer_service):
    # With grpc's default SO_REUSEPORT both would bind and split the calls: the buffer's callers would meet the
    # gateway ("Method not found").
    port = int(buffer_service.address.rsplit(":", 1)[1])
    done = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "serve", "gateway", "--port", str(port), "--host", "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert str(port) in done.stdout + done.stderr
    with BufferClient(buffer_service.address) as client:
        assert client.create_stream(StreamConfig(name="still-the-buffer")).spec.name == "still-the-buffer"


def test_reflection_lists_the_service(buffer_service):
    with grpc.insecure_channel(buffer_service.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert {"trinity.v1.BufferService", "grpc.health.v1.Health"} <= names


def test_reflection_describes_every_method_and_its_messages(buffer_service):
    """What `grpcurl describe pkg.Service.Method` does: the file containing the method, then its types."""
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(buffer_service.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = DescriptorPool(database)  # a client's own pool: nothing but what reflection answers
        described = []
        for name in database.get_services():
            for method in pool.FindServiceByName(name).methods:
                database.FindFileContainingSymbol(method.full_name)  # raises KeyError where it is not found
                described += [pool.FindMessageTypeByName(t.full_name) for t in (method.input_type, method.output_type)]
    assert {m.full_name for m in described} >= {"trinity.v1.GetStreamRequest", "grpc.health.v1.HealthCheckResponse"}


def test_a_configured_token_guards_every_rpc_but_health(redis_server):
    env = {"TRINITY_REDIS_URL": redis_server.url, "TRINITY_AUTH_TOKEN": "s3cret"}
    service = ServiceProcess("buffer", env=env).start()
    try:
        assert _health(service.address) == health_pb2.HealthCheckResponse.SERVING  # probes need no token
        for token, ok in (("", False), ("wrong", False), ("s3cret", True)):
            with BufferClient(service.address, token=token) as client:
                if ok:
                    assert client.status().service == "buffer"
                else:
                    with pytest.raises(grpc.RpcError) as info:
                        client.status()
                    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        service.stop()


def test_a_configured_token_guards_streaming_calls_too(redis_server):
    env = {"TRINITY_REDIS_URL": redis_server.url, "TRINITY_AUTH_TOKEN": "s3cret"}
    service = ServiceProcess("gateway", env=env).start()
    try:
        with open_channel(service.address) as channel, pytest.raises(grpc.RpcError) as info:
            list(gateway_pb2_grpc.GatewayServiceStub(channel).WatchRun(WatchRunRequest(run_id="r"), timeout=10))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        service.stop()


def test_sigterm_drains_in_flight_calls_then_exits_cleanly(redis_server, unique):
    service = ServiceProcess("buffer", env={"TRINITY_REDIS_URL": redis_server.url}).start()
    with BufferClient(service.address) as client:
        client.create_stream(StreamConfig(name=unique))
        result: dict[str, object] = {}

        def blocked_read() -> None:
            result["batch"] = client.read(unique, "c", 1, block_ms=4000)

        reader = threading.Thread(target=blocked_read)
        reader.start()
        time.sleep(1.5)  # let the read reach the server and block there
        service.process.send_signal(signal.SIGTERM)
        reader.join(timeout=30)
        assert service.process.wait(timeout=30) == 0
    assert len(result["batch"]) == 0  # the in-flight read finished normally instead of being cut off
    assert "service.stopped" in service.logs()


def test_redis_outage_makes_the_buffer_unhealthy_and_loses_nothing(tmp_path, unique):
    port = free_port()
    data = tmp_path / "redis"
    redis_proc = start_redis_server(port=port, data_dir=data)
    service = ServiceProcess("buffer", env={"TRINITY_REDIS_URL": redis_proc.url}).start()
    try:
        with BufferClient(service.address, timeout=5) as client:
            client.create_stream(StreamConfig(name=unique))
            client.put(unique, [experience(id=f"e{i}") for i in range(4)])
            acked = client.read(unique, "c", 2)
            client.ack(unique, acked.entry_ids)
            time.sleep(1.5)  # AOF fsyncs every second
            redis_proc.stop()
            deadline = time.monotonic() + 20
            while _health(service.address) == health_pb2.HealthCheckResponse.SERVING:
                assert time.monotonic() < deadline, "buffer kept reporting SERVING without Redis"
                time.sleep(0.2)
            with open_channel(service.address) as channel, pytest.raises(grpc.RpcError) as info:
                BufferServiceStub(channel).GetStream(GetStreamRequest(name=unique), timeout=20)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE

            redis_proc = start_redis_server(port=port, data_dir=data)
            deadline = time.monotonic() + 20
            while _health(service.address) != health_pb2.HealthCheckResponse.SERVING:
                assert time.monotonic() < deadline, "buffer did not recover after Redis came back"
                time.sleep(0.2)
            stats = client.stream(unique).stats
            assert (stats.length, stats.acked, stats.pending) == (4, 2, 0)
            rest = client.read(unique, "c", 10)
            assert sorted(e.id for e in rest.experiences) == ["e2", "e3"]
    finally:
        service.stop()
        redis_proc.stop()


def test_metrics_listen_on_the_interface_grpc_binds(redis_server):
    import psutil

    metrics_port = free_port()
    env = {"TRINITY_REDIS_URL": redis_server.url, "TRINITY_METRICS_PORT": str(metrics_port)}
    service = ServiceProcess("buffer", env=env).start()  # --host 127.0.0.1
    try:
        listening = {
            c.laddr.ip
            for c in psutil.Process(service.process.pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == metrics_port
        }
        assert listening == {"127.0.0.1"}
    finally:
        service.stop()
