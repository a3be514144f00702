"""A run paused and resumed (PauseRun, ResumeRun; trinity.gateway.pausing): the requests checked at the boundary, the
services stopped and freed as each reports that it left, what they held handed back, and the resumed run started as
replacements are, on real Redis and a real buffer with in-process explorers and trainers (tests/gateway/
run_harness.py) behind a real gRPC server; the SDK and the CLI against that server."""

from __future__ import annotations

import grpc
import pytest

from tests.gateway.run_harness import run_config
from trinity.cli.main import main
from trinity.clients import BufferClient
from trinity.config import naming
from trinity.runtime.client import open_channel
from trinity.sdk import TrinityClient
from trinity.sdk.errors import RunConflict
from trinity.v1 import gateway_pb2, gateway_pb2_grpc

PAUSED, PENDING, RUNNING = gateway_pb2.RUN_STATE_PAUSED, gateway_pb2.RUN_STATE_PENDING, gateway_pb2.RUN_STATE_RUNNING


def _call(address: str, method: str, request: object) -> gateway_pb2.Run:
    with open_channel(address) as channel:
        return getattr(gateway_pb2_grpc.GatewayServiceStub(channel), method)(request, timeout=30)


def _pause(address: str, run_id: str, reason: str = "") -> gateway_pb2.Run:
    return _call(address, "PauseRun", gateway_pb2.PauseRunRequest(run_id=run_id, reason=reason))


def _resume(address: str, run_id: str) -> gateway_pb2.Run:
    return _call(address, "ResumeRun", gateway_pb2.ResumeRunRequest(run_id=run_id))


def _refusal(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args)
    return info.value


def _leave(harness, run_id: str, fake) -> None:
    harness.report(run_id, fake, gateway_pb2.EVENT_KIND_LEAVING, message=f"{fake.service} leaving")


def test_a_paused_run_stops_its_services_and_frees_each_once_it_left_handing_back_what_it_held(
    harness, address, unique, buffer_service
):
    run_id = harness.launch(unique)
    harness.report(run_id, harness.trainer, gateway_pb2.EVENT_KIND_TRAIN, step=3, model_version=3)
    taskset = naming.taskset(run_id, 0, "train")
    with BufferClient(buffer_service.address) as buffer:
        assert len(buffer.lease_tasks(taskset, harness.explorer.instance_id, 2).tasks) == 2

    run = _pause(address, run_id, "make room")
    assert run.state == PAUSED and run.resuming and len(run.assignments) == 2  # assigned until each has stopped
    for fake in (harness.trainer, harness.explorer):
        assert fake.stop_reasons() == ["STOP_REASON_PAUSED"] and fake.stops[0].detail == "make room"
    assert _pause(address, run_id).state == PAUSED  # a retried pause changes nothing
    assert harness.trainer.stop_reasons() == ["STOP_REASON_PAUSED"]
    err = _refusal(_resume, address, run_id)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "still pausing" in err.details()

    _leave(harness, run_id, harness.explorer)
    harness.orchestrator.sweep()
    run = harness.run(run_id)
    assert run.state == PAUSED and dict(run.assignments) == {harness.trainer.instance_id: "trainer"}
    _leave(harness, run_id, harness.trainer)
    harness.orchestrator.sweep()

    run = harness.run(run_id)
    assert run.state == PAUSED and not run.assignments and not run.lost_unix_ms
    assert [len(f.starts) for f in (harness.trainer, harness.explorer)] == [1, 1]  # nobody replaced or relaunched
    events = harness.events(run_id)
    stopped = ", ".join(sorted([harness.explorer.instance_id, harness.trainer.instance_id]))
    assert ("state", f"paused (make room): stopping {stopped} after a checkpoint") in events
    assert ("log", f"re-leased 2 task(s) of {harness.explorer.instance_id}") in events
    assert ("log", f"handed back 0 untrained experience(s) of {harness.trainer.instance_id}") in events
    assert ("log", "paused at train step 3, version 3") in events
    assert not harness.orchestrator.sync_members(run_id)  # no generation waits for anyone


def test_a_resumed_run_is_queued_and_starts_its_services_from_its_newest_version(harness, address, unique):
    run_id = harness.launch(unique)
    harness.report(run_id, harness.trainer, gateway_pb2.EVENT_KIND_TRAIN, step=2, model_version=2)
    _pause(address, run_id)
    for fake in (harness.explorer, harness.trainer):
        _leave(harness, run_id, fake)
    harness.clock.advance(60)

    run = _resume(address, run_id)
    assert run.state == PENDING and run.queued_unix_ms == harness.clock.ms and run.created_unix_ms < run.queued_unix_ms
    harness.orchestrator.sweep()
    harness.orchestrator.stages.pool.shutdown(wait=True)  # the launch runs in the pool: wait for it

    run = harness.run(run_id)
    assert run.state == RUNNING and run.resuming
    for fake in (harness.trainer, harness.explorer):  # as replacements: the stage, after the newest version
        assert [(s.run_id, s.stage, s.resume_model_version) for s in fake.starts] == [(run_id, 0, 0), (run_id, 0, 2)]
    assert ("state", "resumed: queued") in harness.events(run_id)


def test_a_pending_run_paused_leaves_the_queue_and_starts_afresh_once_resumed(harness, address, unique):
    pending = harness.orchestrator.create_run(run_config(name=unique), run_id=unique)
    run = _pause(address, pending.id)
    assert run.state == PAUSED and not run.resuming
    harness.orchestrator.sweep()
    assert harness.run(pending.id).state == PAUSED and not harness.trainer.starts  # not launched while paused
    assert ("state", "paused (paused by user): no service to stop") in harness.events(pending.id)

    _resume(address, pending.id)
    harness.orchestrator.sweep()
    harness.orchestrator.stages.pool.shutdown(wait=True)
    assert harness.run(pending.id).state == RUNNING
    assert [s.resume_model_version for s in harness.trainer.starts] == [0]


def test_a_service_that_dies_while_its_run_pauses_is_freed(harness, address, unique):
    run_id = harness.launch(unique)
    _pause(address, run_id)
    harness.silence(harness.trainer)
    _leave(harness, run_id, harness.explorer)
    harness.orchestrator.sweep()
    run = harness.run(run_id)
    assert run.state == PAUSED and not run.assignments


def test_the_services_of_a_paused_run_start_another_run(harness, address, unique):
    first = harness.launch(unique)
    _pause(address, first)
    for fake in (harness.explorer, harness.trainer):
        _leave(harness, first, fake)
    second = harness.launch(f"{unique}-2")
    assert {s.run_id for s in harness.trainer.starts} == {first, second}
    err = _refusal(_resume, address, second)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "RUNNING" in err.details()
    assert harness.orchestrator.cancel(first).state == gateway_pb2.RUN_STATE_CANCELLED  # a paused run can be ended


@pytest.mark.parametrize("ending", ["cancel", "training finished"])
def test_a_run_that_ended_or_finished_training_cannot_be_paused(harness, address, unique, ending):
    run_id = harness.launch(unique)
    if ending == "cancel":
        harness.orchestrator.cancel(run_id)
    else:
        harness.report(run_id, harness.trainer, gateway_pb2.EVENT_KIND_FINISHED, final_model_path="/models/final")
    err = _refusal(_pause, address, run_id)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert harness.run(run_id).state != PAUSED


def test_pausing_or_resuming_an_unknown_run_or_none_is_refused_naming_it(address, unique):
    assert _refusal(_pause, address, unique).code() == grpc.StatusCode.NOT_FOUND
    assert _refusal(_resume, address, unique).code() == grpc.StatusCode.NOT_FOUND
    for call in (_pause, _resume):
        err = _refusal(call, address, "")
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("run_id")


def test_the_sdk_and_the_cli_pause_and_resume_a_run(harness, address, unique, capsys):
    run_id = harness.launch(unique)
    with TrinityClient(address) as client:
        handle = client.run(run_id)
        assert handle.pause("sdk").state == PAUSED
        with pytest.raises(RunConflict, match="still pausing"):
            handle.resume()
    for fake in (harness.explorer, harness.trainer):
        _leave(harness, run_id, fake)
    assert main(["runs", "resume", run_id, "--gateway", address]) == 0
    assert '"state": "RUN_STATE_PENDING"' in capsys.readouterr().out
    assert main(["runs", "pause", run_id, "--gateway", address]) == 0
    assert '"state": "RUN_STATE_PAUSED"' in capsys.readouterr().out
    assert main(["runs", "list", "--gateway", address]) == 0
    assert f"{run_id}\tPAUSED\tstep 0\tversion 0\tpriority 0\n" in capsys.readouterr().out
