"""Steering a live run: each knob goes to the services that own it (the trainer first: it may refuse, and then
nothing has changed), and every change is recorded as an EVENT_KIND_STEER event."""

from __future__ import annotations

import grpc

from trinity.gateway.ledger import ROLE_EXPLORER, ROLE_TRAINER, RUNNING, RunLedger, unfinished
from trinity.runtime.errors import FailedPrecondition, Unavailable, one_line
from trinity.runtime.logging import get_logger
from trinity.runtime.steering import EXPLORER_KNOBS, KNOBS, TRAINER_KNOBS, check_steerable, check_steering
from trinity.v1 import common_pb2, gateway_pb2

log = get_logger(__name__)


def steer(ledger: RunLedger, run_id: str, steering: common_pb2.Steering) -> gateway_pb2.SteerRunResponse:
    knobs = check_steering(steering)
    run = ledger.runs.get(run_id)
    if run.state != RUNNING:
        state = gateway_pb2.RunState.Name(run.state).removeprefix("RUN_STATE_")
        raise FailedPrecondition(f"run {run_id} is {state}; only a RUNNING run can be steered")
    check_steerable(ledger.stage_config(run).mode, knobs)
    calls: list[tuple[str, common_pb2.Steering]] = []
    for role, owned in ((ROLE_TRAINER, TRAINER_KNOBS), (ROLE_EXPLORER, EXPLORER_KNOBS)):
        part = common_pb2.Steering(**{k: getattr(steering, k) for k in knobs if k in owned})
        calls += [(i, part) for i in unfinished(run, role) if part.ListFields()]
    changes: list[common_pb2.SteerChange] = []
    try:
        for instance_id, part in calls:
            changes += _steer_instance(ledger, run, instance_id, part)
    finally:  # what was applied before a failure is recorded all the same
        for change in changes:
            message, metrics = describe_change(change), {change.knob: change.new_value}
            ledger.event(run_id, gateway_pb2.EVENT_KIND_STEER, source=change.source, message=message, metrics=metrics)
    applied = [k for k in KNOBS if any(c.knob == k for c in changes)]
    log.info("run.steered", run_id=run_id, applied=applied)
    return gateway_pb2.SteerRunResponse(applied=applied, changes=changes)


def _steer_instance(
    ledger: RunLedger, run: gateway_pb2.Run, instance_id: str, steering: common_pb2.Steering
) -> list[common_pb2.SteerChange]:
    instance = ledger.registry.get(instance_id)
    if instance is None or not instance.alive or instance_id in run.lost_unix_ms:
        raise Unavailable(f"{run.assignments[instance_id]} {instance_id} is lost; steer again once it is replaced")
    try:
        return ledger.steer(instance, common_pb2.SteerRequest(run_id=run.id, steering=steering))
    except grpc.RpcError as err:
        if err.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
            raise FailedPrecondition(f"{instance.service} {instance_id}: {err.details()}") from None
        raise Unavailable(f"{instance.service} {instance_id} did not apply it: {one_line(err)}") from None


def describe_change(change: common_pb2.SteerChange) -> str:
    """`learning_rate 1e-06 -> 5e-06`; the pause as words (`exploration paused`)."""
    if change.knob == "pause_exploration":
        return "exploration paused" if change.new_value else "exploration resumed"
    return f"{change.knob} {change.old_value:g} -> {change.new_value:g}"
