"""A run paused and resumed. `PauseRun` marks the run PAUSED and stops its services with `STOP_REASON_PAUSED`: the
trainer checkpoints after the step in progress, each explorer puts its rollout batch; each reports `leaving`, and
the supervisor hands back what it still held and frees it for other runs (`release`), never replacing it. The run
is paused once nothing is assigned any more. `ResumeRun` queues it again (PENDING, `queued_unix_ms` now) with
`resuming` set: its stage then starts as replacements start, from the pause's checkpoint, its weight versions going
on from the newest one."""

from __future__ import annotations

from trinity.gateway.ledger import ROLE_TRAINER, RUNNING, RunLedger, all_finished
from trinity.gateway.stages import Stages
from trinity.runtime.errors import FailedPrecondition
from trinity.runtime.logging import get_logger
from trinity.v1 import explorer_pb2, gateway_pb2

log = get_logger(__name__)

PAUSED, PENDING = gateway_pb2.RUN_STATE_PAUSED, gateway_pb2.RUN_STATE_PENDING


def state_name(state: gateway_pb2.RunState) -> str:
    return gateway_pb2.RunState.Name(state).removeprefix("RUN_STATE_")


class Pauser:
    def __init__(self, ledger: RunLedger, stages: Stages) -> None:
        self.ledger, self.stages = ledger, stages

    def pause(self, run_id: str, reason: str) -> gateway_pb2.Run:
        """Stop a pending or running run's services after a checkpoint; a pending one waits out of the queue."""
        with self.ledger.change(run_id) as run:  # NOT_FOUND for an unknown run
            if run.state == PAUSED:
                return run  # a retried pause: already under way, or done
            if run.state not in (PENDING, RUNNING):
                state = state_name(run.state)
                raise FailedPrecondition(f"run {run_id} is {state}; only a pending or running run pauses")
            if self.stages.launching(run_id):
                raise FailedPrecondition(f"run {run_id} is starting its services; pause it once it is RUNNING")
            if all_finished(run, ROLE_TRAINER):
                raise FailedPrecondition(f"run {run_id} has finished training; its explorers are wrapping up")
            # A run that ran resumes where it stopped: its services start as replacements do (`Stages.launch`).
            run.resuming = run.resuming or run.state == RUNNING
            run.state = PAUSED
            # Those lost (their work handed back already) or done with the stage have nothing to stop: freed now.
            for instance_id in [i for i in run.assignments if i in run.lost_unix_ms or i in run.finished]:
                del run.assignments[instance_id]
            run.lost_unix_ms.clear()
            del run.finished[:], run.leaving[:]
            stopping = sorted(run.assignments)
        how = f"stopping {', '.join(stopping)} after a checkpoint" if stopping else "no service to stop"
        self.ledger.event(run_id, gateway_pb2.EVENT_KIND_STATE, message=f"paused ({reason}): {how}", state=PAUSED)
        self.ledger.close_generation(run_id, "the run pauses")  # nobody receives weights any more
        self.ledger.stop_run(stopping, run_id, explorer_pb2.STOP_REASON_PAUSED, reason)
        log.info("run.paused", run_id=run_id, stopping=stopping)
        return run

    def resume(self, run_id: str) -> gateway_pb2.Run:
        """Queue a paused run whose services have all stopped: it starts like a pending run, from its checkpoint."""
        with self.ledger.change(run_id) as run:
            if run.state != PAUSED:
                raise FailedPrecondition(f"run {run_id} is {state_name(run.state)}; only a paused run resumes")
            if run.assignments:
                still = ", ".join(f"{role} {i}" for i, role in sorted(run.assignments.items()))
                raise FailedPrecondition(f"run {run_id} is still pausing ({still} not stopped yet); resume it after")
            run.state = PENDING
            run.queued_unix_ms = self.ledger.clock()
        self.ledger.event(run_id, gateway_pb2.EVENT_KIND_STATE, message="resumed: queued", state=PENDING)
        log.info("run.resumed", run_id=run_id)
        return run

    def release(self, run_id: str, instance_id: str) -> None:
        """A paused run's service stopped (or was lost): free it; the run is paused once none is left."""
        with self.ledger.change(run_id) as run:
            role = run.assignments.pop(instance_id, None)
        if role is None:
            return
        left = len(run.assignments)
        self.ledger.note(run_id, f"{role} {instance_id} stopped for the pause ({left} still stopping)")
        if not left:
            self.ledger.note(run_id, f"paused at train step {run.train_step}, version {run.model_version}")

    def sweep(self, runs: list[gateway_pb2.Run]) -> None:
        """Free each service of a paused run that is gone or works on something else: its `leaving` report was lost
        (the gateway restarted), or it died while stopping."""
        for run in runs:
            if run.state != PAUSED:
                continue
            for instance_id in list(run.assignments):
                instance = self.ledger.registry.get(instance_id)
                if instance is None or not instance.alive or (instance.run_id, instance.stage) != (run.id, run.stage):
                    self.release(run.id, instance_id)
