"""Explorers join and leave a live run (ScaleRun, trinity.gateway.scaling): the request checked at the boundary, and
each sweep's decision, on real Redis and a real buffer with in-process explorers and trainers (tests/gateway/
run_harness.py) behind a real gRPC server; the SDK and the CLI against that server."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tests.gateway.run_harness import EXAMPLES, FakeService, run_config
from trinity.cli.main import main
from trinity.clients import BufferClient
from trinity.config import naming
from trinity.runtime.client import open_channel
from trinity.runtime.limits import MAX_SYNC_WORKERS
from trinity.sdk import AsyncTrinityClient, TrinityClient
from trinity.sdk.client import AsyncRunHandle
from trinity.sdk.errors import InvalidRequest
from trinity.v1 import gateway_pb2, gateway_pb2_grpc

RUNNING = gateway_pb2.RUN_STATE_RUNNING
SCALED_DOWN = "STOP_REASON_SCALED_DOWN"


def _scale(address: str, run_id: str, explorers: int) -> gateway_pb2.Run:
    with open_channel(address) as channel:
        request = gateway_pb2.ScaleRunRequest(run_id=run_id, explorers=explorers)
        return gateway_pb2_grpc.GatewayServiceStub(channel).ScaleRun(request, timeout=30)


def _refusal(address: str, run_id: str, explorers: int) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        _scale(address, run_id, explorers)
    return info.value


def _open_generation(address: str, run_id: str, trainer: FakeService, explorer_workers: int) -> gateway_pb2.SyncGroup:
    """The trainer opens the run's next sync generation, expecting `explorer_workers` members."""
    request = gateway_pb2.OpenSyncGroupRequest(
        run_id=run_id,
        instance_id=trainer.instance_id,
        backend="checkpoint",
        checkpoint_dir="/tmp/weights",
        explorer_workers=explorer_workers,
        timeout_seconds=60.0,
        bucket_mb=64.0,
    )
    with open_channel(address) as channel:
        return gateway_pb2_grpc.GatewayServiceStub(channel).OpenSyncGroup(request, timeout=30)


def _sync_group(address: str, run_id: str) -> gateway_pb2.SyncGroup:
    with open_channel(address) as channel:
        request = gateway_pb2.GetSyncGroupRequest(run_id=run_id)
        return gateway_pb2_grpc.GatewayServiceStub(channel).GetSyncGroup(request, timeout=30)


def _explorers(run: gateway_pb2.Run) -> set[str]:
    return {i for i, role in run.assignments.items() if role == "explorer"}


# ---- the request, at the boundary ---------------------------------------------------------------------------------


@pytest.mark.parametrize("explorers", [0, -1, MAX_SYNC_WORKERS + 1])
def test_an_explorer_count_out_of_bounds_is_invalid_naming_the_field(harness, address, unique, explorers):
    run_id = harness.launch(unique)
    err = _refusal(address, run_id, explorers)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("explorers: ")
    assert harness.run(run_id).explorers == 0


def test_scaling_an_unknown_run_is_not_found(address, unique):
    assert _refusal(address, unique, 2).code() == grpc.StatusCode.NOT_FOUND


def test_scaling_a_run_without_its_id_is_invalid_naming_the_field(address):
    err = _refusal(address, "", 2)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("run_id")


def test_a_run_that_is_not_running_cannot_be_scaled(harness, address, unique):
    pending = harness.orchestrator.create_run(run_config(name=unique), run_id=unique)
    err = _refusal(address, pending.id, 2)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "PENDING" in err.details()
    harness.orchestrator.cancel(pending.id)
    assert _refusal(address, pending.id, 2).code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_stage_without_explorers_cannot_be_scaled(harness, address, unique):
    sft = {
        "batch_size": 2,
        "train_batch_size": 2,
        "total_steps": 1,
        "offline_data": {"path": str(EXAMPLES.parent / "sft" / "train.jsonl"), "messages_key": "messages"},
    }
    run_id = harness.launch(unique, mode="train", algorithm={"algorithm_type": "sft"}, buffer=sft)
    err = _refusal(address, run_id, 2)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "no explorers" in err.details()


def test_a_run_whose_training_finished_cannot_be_scaled(harness, address, unique):
    run_id = harness.launch(unique)
    harness.report(run_id, harness.trainer, gateway_pb2.EVENT_KIND_FINISHED, final_model_path="/models/final")
    assert _refusal(address, run_id, 2).code() == grpc.StatusCode.FAILED_PRECONDITION


# ---- joining ------------------------------------------------------------------------------------------------------


def _join_group(address: str, run_id: str, fake: FakeService) -> grpc.RpcError | gateway_pb2.SyncGroup:
    """The explorer's JoinSyncGroup: the group it joined, or the refusal."""
    with open_channel(address) as channel:
        request = gateway_pb2.JoinSyncGroupRequest(run_id=run_id, instance_id=fake.instance_id)
        try:
            return gateway_pb2_grpc.GatewayServiceStub(channel).JoinSyncGroup(request, timeout=30)
        except grpc.RpcError as err:
            return err


def test_a_run_scaled_up_starts_free_explorers_that_continue_its_weights_and_join_a_generation_once_ready(
    harness, add_explorer, address, unique
):
    run_id = harness.launch(unique)
    harness.report(run_id, harness.trainer, gateway_pb2.EVENT_KIND_TRAIN, step=2, model_version=2)
    assert _open_generation(address, run_id, harness.trainer, 1).world_size == 2
    assert isinstance(_join_group(address, run_id, harness.explorer), gateway_pb2.SyncGroup)
    new = [add_explorer(), add_explorer()]

    assert _scale(address, run_id, 3).explorers == 3
    harness.orchestrator.sweep()

    run = harness.run(run_id)
    assert _explorers(run) == {harness.explorer.instance_id, *(f.instance_id for f in new)}
    for fake in new:  # as a replacement is: the run's stage, after the newest version
        assert [(s.run_id, s.stage, s.resume_model_version) for s in fake.starts] == [(run_id, 0, 2)]
    # While their engines load, nobody waits for them: the generation stands, and a new one would not count them.
    assert _sync_group(address, run_id).ready and harness.orchestrator.sync_members(run_id) == 1

    # Each asks to join once loaded: told to join the next generation, which the gateway opens up for it.
    for count, fake in enumerate(new, start=2):
        refused = _join_group(address, run_id, fake)
        assert isinstance(refused, grpc.RpcError) and refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "joins the next sync generation" in refused.details()
        assert not _sync_group(address, run_id).ready and harness.orchestrator.sync_members(run_id) == count
    # The trainer expects the one explorer of its config; the gateway sizes the generation by the run's explorers.
    assert _open_generation(address, run_id, harness.trainer, 1).world_size == 4
    assert all(isinstance(_join_group(address, run_id, fake), gateway_pb2.SyncGroup) for fake in new)
    events = harness.events(run_id)
    assert ("log", "explorers scaled from 1 to 3") in events
    assert sum(kind == "log" and message.endswith("joins (3 of 3)") for kind, message in events) == 1


def test_a_run_scaled_up_with_no_free_explorer_starts_one_once_it_registers(harness, add_explorer, address, unique):
    run_id = harness.launch(unique)
    _scale(address, run_id, 2)
    harness.orchestrator.sweep()
    assert _explorers(harness.run(run_id)) == {harness.explorer.instance_id}

    late = add_explorer()
    harness.orchestrator.sweep()
    assert late.instance_id in _explorers(harness.run(run_id)) and len(late.starts) == 1
    harness.orchestrator.sweep()
    assert len(late.starts) == 1 and len(_explorers(harness.run(run_id))) == 2  # wanted reached: no more


def test_an_explorer_that_refuses_to_start_is_unassigned_and_another_is_tried(harness, add_explorer, address, unique):
    run_id = harness.launch(unique)
    busy = add_explorer()
    busy.refuse_start = True
    _scale(address, run_id, 2)
    harness.orchestrator.sweep()
    assert _explorers(harness.run(run_id)) == {harness.explorer.instance_id}

    busy.refuse_start = False
    harness.orchestrator.sweep()
    assert _explorers(harness.run(run_id)) == {harness.explorer.instance_id, busy.instance_id}


# ---- leaving ------------------------------------------------------------------------------------------------------


def test_a_run_scaled_down_asks_the_surplus_to_leave_and_drops_them_once_gone(
    harness, add_explorer, address, unique, buffer_service
):
    run_id = harness.launch(unique)
    others = {f.instance_id: f for f in (add_explorer(), add_explorer())}
    _scale(address, run_id, 3)
    harness.orchestrator.sweep()
    fakes = {harness.explorer.instance_id: harness.explorer, **others}

    _scale(address, run_id, 1)
    harness.orchestrator.sweep()

    run = harness.run(run_id)
    leavers = sorted(fakes)[1:]  # the newest ids go
    assert sorted(run.leaving) == leavers and _explorers(run) == set(fakes)  # assigned until gone
    assert {i: f.stop_reasons() for i, f in fakes.items()} == {i: [SCALED_DOWN] if i in leavers else [] for i in fakes}
    assert _open_generation(address, run_id, harness.trainer, 1).world_size == 2  # the staying one only
    with open_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
        request = gateway_pb2.JoinSyncGroupRequest(run_id=run_id, instance_id=leavers[0])
        gateway_pb2_grpc.GatewayServiceStub(channel).JoinSyncGroup(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "leaving" in info.value.details()

    # One leaver still held tasks (its batch was handed back, not finished); each reports that it leaves.
    taskset = naming.taskset(run_id, 0, "train")
    with BufferClient(buffer_service.address) as buffer:
        assert len(buffer.lease_tasks(taskset, leavers[0], 2).tasks) == 2
    for instance_id in leavers:
        harness.report(run_id, fakes[instance_id], gateway_pb2.EVENT_KIND_LEAVING, message="explorer leaving")
    harness.orchestrator.sweep()

    run = harness.run(run_id)
    staying = sorted(fakes)[0]
    assert _explorers(run) == {staying} and not run.leaving and not run.lost_unix_ms and run.state == RUNNING
    assert all(len(fakes[i].starts) == 1 for i in fakes)  # nobody restarted or replaced
    events = harness.events(run_id)
    assert ("log", f"re-leased 2 task(s) of {leavers[0]}") in events
    for instance_id in leavers:
        assert ("log", f"explorer {instance_id} left (run scaled down)") in events
        assert ("log", f"explorer {instance_id} not replaced: the run wants 1 explorer(s)") in events
    harness.orchestrator.sweep()
    assert _explorers(harness.run(run_id)) == {staying}  # the leavers are free again, and not wanted back


def test_a_lost_explorer_is_the_first_to_leave_and_is_dropped_without_being_stopped(
    harness, add_explorer, address, unique
):
    run_id = harness.launch(unique)
    second = add_explorer()
    _scale(address, run_id, 2)
    harness.orchestrator.sweep()
    harness.silence(second)
    harness.orchestrator.sweep()  # lost; no free explorer to replace it
    assert second.instance_id in harness.run(run_id).lost_unix_ms

    _scale(address, run_id, 1)
    harness.orchestrator.sweep()
    harness.orchestrator.sweep()

    run = harness.run(run_id)
    assert _explorers(run) == {harness.explorer.instance_id} and not run.leaving and not run.lost_unix_ms
    assert second.stop_reasons() == [] and harness.explorer.stop_reasons() == []


def test_a_new_stage_starts_with_the_explorers_its_config_names(harness, add_explorer, address, unique):
    run_id = harness.launch(unique, stages=({"buffer": {"total_steps": 1}},))
    second = add_explorer()
    _scale(address, run_id, 2)
    harness.orchestrator.sweep()
    for fake in (harness.trainer, harness.explorer, second):
        harness.report(run_id, fake, gateway_pb2.EVENT_KIND_FINISHED, final_model_path="/models/stage-0")

    run = harness.run(run_id)
    assert run.stage == 1 and run.explorers == 0 and len(_explorers(run)) == 1
    harness.orchestrator.sweep()
    assert len(_explorers(harness.run(run_id))) == 1


# ---- the SDK and the CLI ------------------------------------------------------------------------------------------


def test_the_sdk_scales_a_run_and_refuses_a_bad_count_naming_it(harness, address, unique):
    run_id = harness.launch(unique)
    with TrinityClient(address) as client:
        assert client.run(run_id).scale(2).explorers == 2
        with pytest.raises(InvalidRequest, match=r"^explorers: "):
            client.run(run_id).scale(0)

    async def scale_async() -> gateway_pb2.Run:
        async with AsyncTrinityClient(address) as client:
            return await AsyncRunHandle(client, run_id).scale(3)

    assert asyncio.run(scale_async()).explorers == 3
    assert harness.run(run_id).explorers == 3


def test_trinity_runs_scale_sets_the_explorers_and_exits_2_naming_a_bad_argument(harness, address, unique, capsys):
    run_id = harness.launch(unique)
    assert main(["runs", "scale", run_id, "--explorers", "2", "--gateway", address]) == 0
    assert '"explorers": 2' in capsys.readouterr().out

    with pytest.raises(SystemExit) as exited:
        main(["runs", "scale", run_id, "--explorers", "0", "--gateway", address])
    assert exited.value.code == 2 and "--explorers" in capsys.readouterr().err
    assert main(["runs", "scale", run_id, "--gateway", address]) == 2
    assert "--explorers" in capsys.readouterr().err
    assert main(["runs", "scale", run_id, "--explorers", str(MAX_SYNC_WORKERS + 1), "--gateway", address]) == 2
    assert "explorers: must be between 1 and" in capsys.readouterr().err
    assert harness.run(run_id).explorers == 2


def test_an_explorer_that_finishes_first_leaves_the_next_generation_to_those_still_exploring(
    harness, add_explorer, address, unique
):
    """Its task set ran out while another explorer still had a batch in flight: the trainer's next publish must not
    wait for it (it receives no more weights)."""
    run_id = harness.launch(unique)
    second = add_explorer()
    _scale(address, run_id, 2)
    harness.orchestrator.sweep()
    _join_group(address, run_id, second)  # its engine loaded
    assert _open_generation(address, run_id, harness.trainer, 1).world_size == 3

    harness.report(run_id, second, gateway_pb2.EVENT_KIND_FINISHED, message="explorer finished")

    assert not _sync_group(address, run_id).ready  # closed: it counted the finished one
    assert harness.orchestrator.sync_members(run_id) == 1
    assert _open_generation(address, run_id, harness.trainer, 2).world_size == 2
    assert ("weights", f"sync group generation 1 closed (explorer {second.instance_id} finished)") in harness.events(
        run_id
    )
    assert harness.trainer.stop_reasons() == []  # the other explorer explores on: no drain yet
