"""The gateway's run state machine, transition by transition: losing and replacing services, the end of a stage
and of a run, failures and cancels (trinity.gateway.supervision, .stages, .launch, .ledger), on real Redis."""

from __future__ import annotations

import pytest

from tests.gateway.run_harness import RECOVERY_S, Gateway
from trinity.config import RunConfig
from trinity.gateway.supervision import ABSENT_SECONDS
from trinity.v1 import gateway_pb2

RUNNING, SUCCEEDED = gateway_pb2.RUN_STATE_RUNNING, gateway_pb2.RUN_STATE_SUCCEEDED
FAILED, CANCELLED = gateway_pb2.RUN_STATE_FAILED, gateway_pb2.RUN_STATE_CANCELLED


@pytest.fixture
def gateway(harness: Gateway) -> Gateway:
    return harness


def test_a_lost_trainer_that_comes_back_in_time_is_restarted_on_the_run_after_the_newest_version(gateway, unique):
    run_id = gateway.launch(unique)
    trainer = gateway.trainer
    gateway.report(run_id, trainer, gateway_pb2.EVENT_KIND_TRAIN, step=3, model_version=3)
    gateway.silence(trainer)
    gateway.orchestrator.sweep()
    assert trainer.instance_id in gateway.run(run_id).lost_unix_ms

    gateway.clock.advance(RECOVERY_S - 1)
    gateway.register(trainer, started=2)  # its supervisor restarted it under the same id
    gateway.orchestrator.sweep()

    run = gateway.run(run_id)
    assert run.state == RUNNING and not run.lost_unix_ms and run.assignments[trainer.instance_id] == "trainer"
    assert [s.resume_model_version for s in trainer.starts] == [0, 3]
    assert ("log", f"trainer {trainer.instance_id} restarted") in gateway.events(run_id)


def test_a_lost_trainer_not_back_in_time_fails_the_run_with_one_line_naming_it(gateway, unique):
    run_id = gateway.launch(unique)
    gateway.silence(gateway.trainer)
    gateway.orchestrator.sweep()
    gateway.clock.advance(RECOVERY_S + 1)
    gateway.orchestrator.sweep()

    run = gateway.run(run_id)
    assert run.state == FAILED
    assert run.error == f"trainer {gateway.trainer.instance_id} lost and not replaced within {RECOVERY_S:.0f}s"
    assert gateway.explorer.stop_reasons() == ["STOP_REASON_FAILED"]


def test_a_replacement_that_keeps_failing_to_start_fails_the_run_at_the_deadline_of_the_loss(gateway, unique):
    run_id = gateway.launch(unique)
    trainer = gateway.trainer
    gateway.silence(trainer)
    gateway.orchestrator.sweep()
    trainer.refuse_start = True
    gateway.clock.advance(RECOVERY_S - 1)
    gateway.register(trainer, started=2)
    gateway.orchestrator.sweep()  # the restarted process refuses to start: lost again, since the same moment
    assert gateway.run(run_id).state == RUNNING

    gateway.clock.advance(2)
    gateway.orchestrator.sweep()
    assert gateway.run(run_id).state == FAILED


def test_a_lost_explorer_after_training_finished_is_not_replaced_and_the_run_succeeds(gateway, unique):
    run_id = gateway.launch(unique)
    explorer = gateway.explorer
    gateway.report(run_id, gateway.trainer, gateway_pb2.EVENT_KIND_FINISHED, final_model_path="/models/final")
    assert explorer.stop_reasons() == ["STOP_REASON_TRAINING_FINISHED"]  # apply the last weights, evaluate, finish
    gateway.silence(explorer)
    gateway.orchestrator.sweep()

    run = gateway.run(run_id)
    assert run.state == SUCCEEDED and explorer.instance_id not in run.assignments
    assert len(explorer.starts) == 1 and run.final_model_path == "/models/final"


def test_a_finished_stage_starts_the_next_from_the_model_it_exported(gateway, unique):
    run_id = gateway.launch(unique, stages=({"buffer": {"total_steps": 1}},))
    gateway.report(run_id, gateway.trainer, gateway_pb2.EVENT_KIND_FINISHED, final_model_path="/models/stage-0")
    gateway.report(run_id, gateway.explorer, gateway_pb2.EVENT_KIND_FINISHED)

    run = gateway.run(run_id)
    assert run.state == RUNNING and run.stage == 1 and not run.finished
    for fake in (gateway.trainer, gateway.explorer):
        start = fake.starts[-1]
        assert start.stage == 1 and RunConfig.model_validate_json(start.config_json).model.path == "/models/stage-0"


def test_an_error_in_a_stage_fails_the_run_and_starts_no_later_stage(gateway, unique):
    run_id = gateway.launch(unique, stages=({"buffer": {"total_steps": 1}},))
    gateway.report(run_id, gateway.explorer, gateway_pb2.EVENT_KIND_ERROR, message="reward function crashed")

    run = gateway.run(run_id)
    assert run.state == FAILED and run.stage == 0
    assert run.error == f"explorer/{gateway.explorer.instance_id}: reward function crashed"
    assert gateway.trainer.stop_reasons() == ["STOP_REASON_FAILED"]
    assert [s.stage for s in gateway.trainer.starts + gateway.explorer.starts] == [0, 0]


def test_a_next_stage_that_cannot_be_prepared_fails_the_run_saying_why(gateway, unique):
    missing = {"buffer": {"taskset": {"path": f"/tmp/{unique}-absent.jsonl"}}}
    run_id = gateway.launch(unique, stages=(missing,))
    gateway.report(run_id, gateway.trainer, gateway_pb2.EVENT_KIND_FINISHED)
    gateway.report(run_id, gateway.explorer, gateway_pb2.EVENT_KIND_FINISHED)

    run = gateway.run(run_id)
    assert run.state == FAILED and run.stage == 1
    assert run.error.startswith("launch failed: ") and f"{unique}-absent.jsonl" in run.error and "\n" not in run.error


def test_a_run_cancelled_while_its_trainer_is_lost_is_not_restarted_when_the_trainer_returns(gateway, unique):
    run_id = gateway.launch(unique)
    trainer = gateway.trainer
    gateway.silence(trainer)
    gateway.orchestrator.sweep()
    gateway.orchestrator.cancel(run_id, "cancelled by user")
    gateway.register(trainer, started=2)
    gateway.orchestrator.sweep()

    assert gateway.run(run_id).state == CANCELLED
    assert len(trainer.starts) == 1 and trainer.stop_reasons() == []  # it was gone when the cancel was sent
    assert gateway.explorer.stop_reasons() == ["STOP_REASON_CANCELLED"]


SERVING_ON = {"mode": "serve", "explorer": {"keep_serving_after_last_step": True}}


def test_a_serve_run_serving_on_after_its_training_succeeds_when_it_is_stopped(gateway, unique):
    run_id = gateway.launch(unique, **SERVING_ON)
    gateway.report(run_id, gateway.trainer, gateway_pb2.EVENT_KIND_FINISHED, final_model_path="/models/final")
    assert gateway.run(run_id).state == RUNNING  # the explorer serves on, told that training finished
    gateway.orchestrator.cancel(run_id, "terminated (SIGTERM)")

    run = gateway.run(run_id)
    assert run.state == SUCCEEDED and run.final_model_path == "/models/final"
    assert gateway.explorer.stop_reasons() == ["STOP_REASON_TRAINING_FINISHED", "STOP_REASON_CANCELLED"]
    assert ("state", "training finished; serving stopped (terminated (SIGTERM))") in gateway.events(run_id)


def test_a_serve_run_stopped_before_its_training_finished_is_cancelled(gateway, unique):
    run_id = gateway.launch(unique, **SERVING_ON)
    gateway.orchestrator.cancel(run_id, "terminated (SIGTERM)")
    assert gateway.run(run_id).state == CANCELLED


def test_an_assigned_instance_whose_start_never_arrived_is_started_once_it_says_so_long_enough(gateway, unique):
    # A gateway that died between writing an assignment and calling StartRun: the instance's heartbeats say it works
    # on no run (a process restarted under the same id, waiting for its start).
    run_id = gateway.launch(unique)
    explorer = gateway.explorer
    gateway.registry.heartbeat(explorer.instance_id, "", 0)
    gateway.orchestrator.sweep()
    gateway.clock.advance(ABSENT_SECONDS - 1)
    gateway.orchestrator.sweep()
    assert len(explorer.starts) == 1 and not gateway.run(run_id).lost_unix_ms  # one late heartbeat is no loss

    gateway.clock.advance(2)
    gateway.orchestrator.sweep()
    run = gateway.run(run_id)
    assert run.state == RUNNING and not run.lost_unix_ms and run.assignments[explorer.instance_id] == "explorer"
    assert [s.run_id for s in explorer.starts] == [run_id, run_id]
    lost = f"explorer {explorer.instance_id} lost (assigned to stage 0 but working on no run)"
    assert ("log", lost) in gateway.events(run_id)


def test_an_instance_whose_heartbeats_name_its_run_and_stage_is_left_alone(gateway, unique):
    run_id = gateway.launch(unique)
    for fake in (gateway.trainer, gateway.explorer):
        gateway.registry.heartbeat(fake.instance_id, run_id, 0)
    gateway.clock.advance(ABSENT_SECONDS * 10)
    gateway.orchestrator.sweep()
    assert len(gateway.trainer.starts) == len(gateway.explorer.starts) == 1
    assert not gateway.run(run_id).lost_unix_ms


def test_a_stage_begun_by_a_gateway_that_died_before_starting_it_is_started_by_the_next_sweep(gateway, unique):
    run_id = gateway.launch(unique, stages=({"buffer": {"total_steps": 1}},))
    with gateway.orchestrator.ledger.change(run_id) as run:  # what such a gateway left: stage 1, nothing assigned
        run.stage += 1
        run.assignments.clear()
    gateway.orchestrator.sweep()
    gateway.orchestrator.stages.pool.shutdown(wait=True)  # the launch the sweep handed to the pool

    run = gateway.run(run_id)
    assert run.state == RUNNING and run.stage == 1 and len(run.assignments) == 2
    assert [s.stage for s in gateway.trainer.starts] == [s.stage for s in gateway.explorer.starts] == [0, 1]
    assert ("log", "stage 1 was not started: starting it") in gateway.events(run_id)
