"""Failure drills on a live local stack: an explorer killed mid-run, a gateway restarted."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import ServiceProcess
from tests.e2e.conftest import tiny_config
from trinity.cli.launcher import LocalStack
from trinity.clients import BufferClient
from trinity.config import RunConfig, naming
from trinity.sdk import TrinityClient
from trinity.v1 import gateway_pb2


@pytest.mark.system  # a whole run: minutes on 2 cores
def test_a_killed_explorer_is_replaced_and_the_run_finishes(tiny_model, tmp_path):
    config = tiny_config(
        tiny_model,
        **{
            "buffer.total_steps": 5,
            "synchronizer.timeout_seconds": 30,
            "buffer.taskset.lease_seconds": 30,
            "checkpoint_dir": str(tmp_path / "ckpt"),
        },
    )
    stack = LocalStack.up(tmp_path / "logs", explorers=1)
    try:
        with TrinityClient(stack.gateway) as client:
            run = client.create_run(config)
            killed = threading.Event()
            events: list[gateway_pb2.RunEvent] = []
            for event in run.watch():
                events.append(event)
                if event.kind == gateway_pb2.EVENT_KIND_TRAIN and event.step == 2 and not killed.is_set():
                    killed.set()
                    stack.restart("explorer-0")  # SIGKILL; the supervisor starts it again as the same instance
            final = run.wait(timeout=120)
        assert gateway_pb2.RunState.Name(final.state) == "RUN_STATE_SUCCEEDED", final.error
        assert killed.is_set()
        messages = [e.message for e in events]
        instance_id = stack.services["explorer-0"].env["TRINITY_INSTANCE_ID"]
        assert any(m.startswith(f"explorer {instance_id} lost (") for m in messages)
        assert f"explorer {instance_id} restarted" in messages
        assert any("generation 2 opened" in m for m in messages)  # the sync group was re-formed
        assert final.train_step == 5 and final.model_version == 5
        stream = naming.experience_stream(run.id, 0, "experiences")
        with BufferClient(stack.services["buffer"].address) as buffer:
            stats = buffer.stream(stream).stats
        assert stats.pending == 0 and stats.dead_letters == 0
        assert stats.put == stats.acked + stats.lag  # everything put was trained or is still queued
        assert stats.acked == 5 * RunConfig.model_validate(config).train_batch_size
    finally:
        stack.down()


def test_run_state_survives_a_gateway_restart(redis_server, tiny_model):
    env = {"TRINITY_REDIS_URL": redis_server.url}
    gateway = ServiceProcess("gateway", env=env).start()
    with TrinityClient(gateway.address) as client:
        run_id = client.create_run(tiny_config(tiny_model)).id  # PENDING: no services registered
    assert gateway.stop() == 0
    restarted = ServiceProcess("gateway", env=env, port=gateway.port).start()
    try:
        with TrinityClient(restarted.address) as client:
            run = client.run(run_id)
            assert run.status().state == gateway_pb2.RUN_STATE_PENDING
            assert run.cancel().state == gateway_pb2.RUN_STATE_CANCELLED
            assert [r.id for r in client.list_runs() if r.id == run_id] == [run_id]
    finally:
        restarted.stop()


def test_an_engine_that_cannot_load_fails_the_run_and_marks_the_explorer_unhealthy(tiny_model, tmp_path):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from trinity.runtime.client import open_channel

    NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')  # no weights, no tokenizer
    config = tiny_config(tiny_model)
    config["model"]["path"] = str(broken)
    stack = LocalStack.up(tmp_path / "logs", explorers=1)
    try:
        with TrinityClient(stack.gateway) as client:
            final = client.create_run(config).wait(timeout=180)
        assert final.state == gateway_pb2.RUN_STATE_FAILED
        assert "explorer" in final.error or "trainer" in final.error
        # the trainer may fail first; the explorer's engine fails on its own and takes it out of rotation
        deadline = time.monotonic() + 120
        with open_channel(stack.services["explorer-0"].address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while health.Check(health_pb2.HealthCheckRequest(), timeout=10).status != NOT_SERVING:
                assert time.monotonic() < deadline, "the explorer stayed SERVING with a broken engine"
                time.sleep(0.5)
    finally:
        stack.down()
