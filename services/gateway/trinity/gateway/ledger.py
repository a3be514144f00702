"""What every part of a run's lifecycle shares: the runs in Redis, changed under one lock; the registry, the sync
groups and the clock; the calls to explorers and trainers (StartRun, StopRun, Steer); the gateway's own events;
and how a run ends."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from trinity.config import RunConfig
from trinity.gateway.registry import InstanceRegistry
from trinity.gateway.runs import TERMINAL, RunStore
from trinity.gateway.sync_groups import SyncGroups
from trinity.runtime.client import open_channel
from trinity.runtime.errors import NotFound
from trinity.runtime.logging import get_logger
from trinity.runtime.tenants import TenantBook
from trinity.v1 import common_pb2, explorer_pb2, explorer_pb2_grpc, gateway_pb2, trainer_pb2_grpc

log = get_logger(__name__)

ROLE_EXPLORER, ROLE_TRAINER = "explorer", "trainer"  # the roles of Run.assignments, named as their services
STUBS: dict[str, Callable[[grpc.Channel], Any]] = {
    ROLE_EXPLORER: explorer_pb2_grpc.ExplorerServiceStub,
    ROLE_TRAINER: trainer_pb2_grpc.TrainerServiceStub,
}
RUNNING = gateway_pb2.RUN_STATE_RUNNING


def unfinished(run: gateway_pb2.Run, role: str) -> list[str]:
    """The run's instances in `role` that have not finished their part of the stage."""
    return sorted(i for i, r in run.assignments.items() if r == role and i not in run.finished)


def all_finished(run: gateway_pb2.Run, role: str) -> bool:
    """Whether the run has instances in `role` and each has finished its part of the stage."""
    return role in run.assignments.values() and not unfinished(run, role)


def active_explorers(run: gateway_pb2.Run) -> list[str]:
    """The run's explorers that are assigned, not asked to leave and not finished (a finished one receives no more
    weights): the members its sync generations wait for."""
    return sorted(
        i
        for i, role in run.assignments.items()
        if role == ROLE_EXPLORER and i not in run.leaving and i not in run.finished
    )


class RunLedger:
    def __init__(
        self,
        runs: RunStore,
        registry: InstanceRegistry,
        sync_groups: SyncGroups,
        clock: Callable[[], int],
        tenants: TenantBook | None = None,
    ):
        self.runs, self.registry, self.sync_groups = runs, registry, sync_groups
        self.clock = clock  # unix ms: injectable, so that tests step past deadlines instead of sleeping
        self.tenants = tenants or TenantBook()  # their quotas bound what their runs take (trinity.gateway.queue)
        self.stopping = threading.Event()  # this gateway shuts down: nothing starts waiting any more
        self.lock = threading.RLock()  # reports, the monitor and launches change runs from several threads

    @contextmanager
    def change(self, run_id: str) -> Iterator[gateway_pb2.Run]:
        """The run, read under the lock and saved when the block ends, unless the block left it as it was (so a
        run that is over keeps the time it ended as its `updated_unix_ms`)."""
        with self.lock:
            run = self.runs.get(run_id)
            before = run.SerializeToString(deterministic=True)  # map entries in key order: equal runs, equal bytes
            yield run
            if run.SerializeToString(deterministic=True) != before:
                self.runs.save(run)

    def event(
        self,
        run_id: str,
        kind: gateway_pb2.EventKind,
        *,
        message: str = "",
        state: gateway_pb2.RunState = gateway_pb2.RUN_STATE_UNSPECIFIED,
        metrics: dict[str, float] | None = None,
        source: str = "gateway",
    ) -> None:
        """An event the gateway records (its own, or a change a service made at its request) at the run's current
        stage, step and weight version."""
        run = self.runs.get(run_id)
        event = gateway_pb2.RunEvent(run_id=run_id, kind=kind, source=source, message=message, state=state)
        event.metrics.update(metrics or {})
        event.stage, event.step, event.model_version = run.stage, run.train_step, run.model_version
        self.runs.append_event(event)

    def close_generation(self, run_id: str, why: str = "") -> None:
        """End the run's sync generation after a membership change: the trainer opens the next with the run's
        explorers then (`sync_members`); an event says so when one was open (not closed already)."""
        try:
            was_open = self.sync_groups.get(run_id).world_size > 0
        except NotFound:
            return
        group = self.sync_groups.close(run_id, 0)
        if was_open and group is not None and group.generation:
            closed = f"sync group generation {group.generation} closed" + (f" ({why})" if why else "")
            self.event(run_id, gateway_pb2.EVENT_KIND_WEIGHTS, message=closed)

    def note(self, run_id: str, message: str) -> None:
        """A line for people in the run's event log."""
        self.event(run_id, gateway_pb2.EVENT_KIND_LOG, message=message)

    def stage_config(self, run: gateway_pb2.Run) -> RunConfig:
        """The config of the run's current stage; a later stage starts from the weights the last one
        produced unless it names a model itself."""
        base = RunConfig.model_validate_json(run.config_json)
        config = base.stage_configs()[run.stage]
        if run.stage > 0 and run.final_model_path and "path" not in base.stages[run.stage - 1].get("model", {}):
            config = config.model_copy(update={"model": config.model.model_copy(update={"path": run.final_model_path})})
        return config

    def fail(self, run_id: str, reason: str) -> None:
        """Stop the run's services and end it FAILED with `reason`, the one line that says why."""
        run = self.runs.get(run_id)
        if run.state not in TERMINAL:
            self.stop_run(list(run.assignments), run_id, explorer_pb2.STOP_REASON_FAILED, reason)
            self.finish(run_id, gateway_pb2.RUN_STATE_FAILED, reason)

    def finish(self, run_id: str, state: gateway_pb2.RunState, message: str) -> gateway_pb2.Run:
        """End the run in `state` and record it as a state event; a run that is over stays as it ended."""
        with self.change(run_id) as run:
            if run.state in TERMINAL:
                return run
            run.state = state
            run.error = message if state == gateway_pb2.RUN_STATE_FAILED else ""
        self.event(run_id, gateway_pb2.EVENT_KIND_STATE, message=message, state=state)
        log.info("run.finished", run_id=run_id, state=gateway_pb2.RunState.Name(state), message=message)
        return run

    def start_run(self, instance: gateway_pb2.Instance, request: explorer_pb2.StartRunRequest) -> None:
        with open_channel(instance.address) as channel:
            STUBS[instance.service](channel).StartRun(request, timeout=60)

    def stop_run(self, instance_ids: list[str], run_id: str, reason: explorer_pb2.StopReason, detail: str = "") -> None:
        """StopRun on each live one of `instance_ids`; one that does not answer is lost (or soon will be): logged."""
        for instance in filter(None, map(self.registry.get, instance_ids)):
            try:
                if instance.alive:
                    with open_channel(instance.address) as channel:
                        request = explorer_pb2.StopRunRequest(run_id=run_id, reason=reason, detail=detail)
                        STUBS[instance.service](channel).StopRun(request, timeout=30)
            except grpc.RpcError as err:
                log.warning("run.stop_failed", instance=instance.instance_id, error=err.details())

    def steer(self, instance: gateway_pb2.Instance, request: common_pb2.SteerRequest) -> list[common_pb2.SteerChange]:
        with open_channel(instance.address) as channel:
            return list(STUBS[instance.service](channel).Steer(request, timeout=30).changes)
