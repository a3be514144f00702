"""How a run treats a service that leaves: SIGTERM drains and hands over; a service that never comes back
fails the run after the recovery deadline, with one line naming it."""

from __future__ import annotations

import signal

import pytest

from tests.e2e.conftest import tiny_config
from trinity.cli.launcher import LocalStack, RestartPolicy
from trinity.sdk import TrinityClient
from trinity.v1 import gateway_pb2


@pytest.mark.system  # a whole run: minutes on 2 cores
def test_a_sigtermed_trainer_checkpoints_hands_over_and_the_run_goes_on(tiny_model, tmp_path):
    config = tiny_config(
        tiny_model,
        **{
            "buffer.total_steps": 6,
            "synchronizer.timeout_seconds": 30,
            "explorer.eval_interval": 100,
            "checkpoint_dir": str(tmp_path / "ckpt"),
        },
    )
    stack = LocalStack.up(tmp_path / "logs", explorers=1, extra_env={"TRINITY_DRAIN_SECONDS": "1"})
    try:
        with TrinityClient(stack.gateway) as client:
            run = client.create_run(config)
            events: list[gateway_pb2.RunEvent] = []
            for event in run.watch():
                events.append(event)
                if event.kind == gateway_pb2.EVENT_KIND_TRAIN and event.step == 2 and stack.restarts["trainer"] == 0:
                    trainer = stack.services["trainer"].process
                    assert trainer is not None
                    trainer.send_signal(signal.SIGTERM)
            final = run.wait(timeout=300)
        assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error
        trainer_events = [e for e in events if e.source.startswith("trainer/")]
        leaving = [e for e in trainer_events if e.kind == gateway_pb2.EVENT_KIND_LEAVING]
        assert len(leaving) == 1 and "checkpoint at step" in leaving[0].message
        finished = [e for e in trainer_events if e.kind == gateway_pb2.EVENT_KIND_FINISHED]
        assert len(finished) == 1 and finished[0].step == 6  # never a "final" model from the drained one
        messages = [e.message for e in events]
        assert any("lost (it is shutting down)" in m for m in messages)
        stopped_at = leaving[0].step
        assert any(f"at step {stopped_at}" in m and m.startswith("resumed from") for m in messages)
        versions = [e.model_version for e in trainer_events if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
        assert versions == sorted(set(versions))
    finally:
        stack.down()


@pytest.mark.system  # a whole run: minutes on 2 cores
def test_a_trainer_that_never_comes_back_fails_the_run_with_one_line_naming_it(tiny_model, tmp_path):
    config = tiny_config(tiny_model, **{"buffer.total_steps": 50, "checkpoint_dir": str(tmp_path / "ckpt")})
    env = {"TRINITY_LIVENESS_SECONDS": "2", "TRINITY_RECOVERY_SECONDS": "3"}
    stack = LocalStack.up(tmp_path / "logs", explorers=1, extra_env=env, policy=RestartPolicy(limit=0))
    try:
        with TrinityClient(stack.gateway) as client:
            run = client.create_run(config)
            for event in run.watch():
                if event.kind == gateway_pb2.EVENT_KIND_TRAIN and event.step == 1:
                    trainer = stack.services["trainer"].process
                    assert trainer is not None
                    trainer.kill()
            final = run.wait(timeout=120)
        assert final.state == gateway_pb2.RUN_STATE_FAILED
        trainer_id = stack.services["trainer"].env["TRINITY_INSTANCE_ID"]
        assert final.error == f"trainer {trainer_id} lost and not replaced within 3s"
    finally:
        stack.down()
