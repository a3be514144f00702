"""Runs heal: an assigned explorer or trainer that is lost (silent, replaced by a new process under its id, or
leaving) has its work taken back at once, and each sweep of the monitor gives it a replacement: the same instance
id back (a supervisor restarted it) or any free instance of its service. A run fails only when that does not
happen within `recovery_seconds`, with one line naming the service."""

from __future__ import annotations

import grpc

from trinity.clients import BufferClient
from trinity.config import naming
from trinity.gateway.ledger import ROLE_EXPLORER, ROLE_TRAINER, RUNNING, RunLedger, all_finished
from trinity.gateway.pausing import PAUSED, Pauser
from trinity.gateway.runs import TERMINAL
from trinity.gateway.stages import Stages
from trinity.runtime.errors import one_line
from trinity.runtime.failpoints import failpoint
from trinity.runtime.logging import get_logger
from trinity.v1 import explorer_pb2, gateway_pb2

log = get_logger(__name__)

# How long an assigned instance may say it works on something else before it counts as lost: heartbeats come each
# second, and one sent before StartRun arrived may land after it.
ABSENT_SECONDS = 5.0


class Supervisor:
    def __init__(self, ledger: RunLedger, stages: Stages, pauser: Pauser, recovery_seconds: float) -> None:
        self.ledger, self.stages, self.pauser = ledger, stages, pauser
        self.recovery_seconds = recovery_seconds
        self._absent_since: dict[tuple[str, str], int] = {}  # (run, instance) -> unix ms it was first seen absent

    def on_instance_lost(self, instance: gateway_pb2.Instance, why: str) -> None:
        log.warning("instance.lost", instance=instance.instance_id, service=instance.service, why=why)
        for run in self.ledger.runs.all():
            if run.state not in TERMINAL and instance.instance_id in run.assignments:
                self.lose(run.id, instance.instance_id, why)

    def find_absent(self, runs: list[gateway_pb2.Run]) -> None:
        """Lose each live assigned instance whose heartbeats have said for `ABSENT_SECONDS` that it works on another
        run or stage, or none: its StartRun never reached it (the gateway died between assigning and starting it)."""
        now, absent = self.ledger.clock(), {}
        for run in runs:
            if run.state != RUNNING:
                continue
            for instance_id in run.assignments:
                instance = self.ledger.registry.get(instance_id)
                if instance_id in run.finished or instance_id in run.lost_unix_ms or not instance or not instance.alive:
                    continue  # done, already being replaced, or left to the liveness check
                if (instance.run_id, instance.stage) == (run.id, run.stage):
                    continue
                since = absent[run.id, instance_id] = self._absent_since.get((run.id, instance_id), now)
                if now - since > ABSENT_SECONDS * 1000:
                    doing = f"run {instance.run_id} stage {instance.stage}" if instance.run_id else "no run"
                    self.lose(run.id, instance_id, f"assigned to stage {run.stage} but working on {doing}")
        self._absent_since = absent

    def lose(self, run_id: str, instance_id: str, why: str) -> None:
        """Take a lost instance's work back (leased tasks, the batch it read) and wait for a replacement; one of a
        paused run stopped as asked, or died stopping: it is freed instead."""
        with self.ledger.change(run_id) as run:
            role = run.assignments.get(instance_id)
            if run.state in TERMINAL or role is None or instance_id in run.finished or instance_id in run.lost_unix_ms:
                return
            paused = run.state == PAUSED
            if not paused:
                run.lost_unix_ms[instance_id] = self.ledger.clock()
        if paused:
            self._hand_back_quietly(run, instance_id, role)
            self.pauser.release(run_id, instance_id)
            return
        leaving = instance_id in run.leaving  # asked to leave (ScaleRun): gone as asked, dropped by `recover`
        self.ledger.note(run_id, f"{role} {instance_id} " + ("left (run scaled down)" if leaving else f"lost ({why})"))
        self._hand_back_quietly(run, instance_id, role)
        if leaving:
            return  # no sync member since it was asked to leave: the generation stands
        self.ledger.close_generation(run_id)

    def _hand_back_quietly(self, run: gateway_pb2.Run, instance_id: str, role: str) -> None:
        try:
            self._hand_back(run, instance_id, role)
        except grpc.RpcError as err:  # the buffer is down too: the replacement reclaims them itself
            log.warning("run.hand_back_failed", run_id=run.id, instance=instance_id, error=one_line(err))

    def _hand_back(self, run: gateway_pb2.Run, instance_id: str, role: str) -> None:
        buffers = self.ledger.registry.alive("buffer")
        if not buffers:
            return
        with BufferClient(buffers[0].address) as buffer:
            if role == ROLE_EXPLORER:
                released = buffer.release_tasks(instance_id)
                self.ledger.note(run.id, f"re-leased {released} task(s) of {instance_id}")
            else:
                name = self.ledger.stage_config(run).buffer.experience_stream.name
                requeued = buffer.nack(naming.experience_stream(run.id, run.stage, name), instance_id, all_pending=True)
                self.ledger.note(run.id, f"handed back {requeued} untrained experience(s) of {instance_id}")

    def recover(self, runs: list[gateway_pb2.Run]) -> None:
        """Give each lost assignment of a running run a replacement, or fail the run once the first of them has
        gone unreplaced (or its replacements failed to start) past the deadline."""
        for run in runs:
            if run.state != RUNNING or not run.lost_unix_ms:
                continue
            for old, lost_ms in sorted(run.lost_unix_ms.items()):
                role = run.assignments[old]
                if role == ROLE_EXPLORER and (all_finished(run, ROLE_TRAINER) or old in run.leaving):
                    self._retire(run.id, old)  # nothing left for it to explore, or the run wants fewer explorers
                elif not self._replace(run.id, old) and self.ledger.clock() - lost_ms > self.recovery_seconds * 1000:
                    self.ledger.fail(run.id, f"{role} {old} lost and not replaced within {self.recovery_seconds:.0f}s")
                    break

    def _replacement_for(self, old: str, role: str) -> gateway_pb2.Instance | None:
        """The same instance id back (a restarted process), else a free live instance of the service (read
        afresh: an earlier replacement in this sweep may have taken one)."""
        same = self.ledger.registry.get(old)
        if same is not None and same.alive:
            return same
        return next(iter(self.stages.free(role, "", self.ledger.runs.all())), None)

    def _replace(self, run_id: str, old: str) -> bool:
        """Start a replacement of `old` on the run; whether one started."""
        buffers = self.ledger.registry.alive("buffer")
        new = self._replacement_for(old, self.ledger.runs.get(run_id).assignments[old])
        if new is None or not buffers:  # nothing to start, or the buffer is restarting: the next sweep tries again
            return False
        with self.ledger.change(run_id) as run:
            if run.state in TERMINAL:  # cancelled (or failed) since the sweep began: nobody is to start on it
                return False
            role = run.assignments.pop(old)
            lost_ms = run.lost_unix_ms.pop(old)
            run.assignments[new.instance_id] = role
        how = "restarted" if new.instance_id == old else f"replaces {old}"
        self.ledger.note(run_id, f"{role} {new.instance_id} {how}")
        failpoint("gateway.replace")  # the ledger names the replacement, which has not been started yet
        try:
            self.stages.start_on(run, new, buffers[0].address, replacing=True)
        except grpc.RpcError as err:
            # Not started after all: lost again, the deadline still counting from the loss (a replacement that
            # keeps failing to start must not hold the run forever).
            with self.ledger.change(run_id) as run:
                run.lost_unix_ms[new.instance_id] = lost_ms
            log.warning("run.replace_failed", run_id=run_id, instance=new.instance_id, error=one_line(err))
            return False
        if role == ROLE_TRAINER and all_finished(run, ROLE_EXPLORER):
            self.ledger.stop_run([new.instance_id], run_id, explorer_pb2.STOP_REASON_INPUT_EXHAUSTED)
        return True

    def _retire(self, run_id: str, instance_id: str) -> None:
        """Drop a lost explorer that is no longer needed, then see whether the stage is complete."""
        with self.ledger.change(run_id) as run:
            del run.lost_unix_ms[instance_id]
            del run.assignments[instance_id]
            leaving = instance_id in run.leaving
            if leaving:
                run.leaving.remove(instance_id)
        why = f"the run wants {run.explorers} explorer(s)" if leaving else "training has finished"
        self.ledger.note(run_id, f"explorer {instance_id} not replaced: {why}")
        self.stages.advance_if_done(run)
