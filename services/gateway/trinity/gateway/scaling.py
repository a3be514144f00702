"""Explorers join and leave a live run. `ScaleRun` records how many explorers the run wants (`Run.explorers`); each
sweep of the monitor moves the run toward it: a free explorer instance is assigned and started as a replacement is
(it continues the run's explore steps; once its engine has loaded and it asks to join the sync group, the current
generation is closed and the trainer pushes it the current weights in the next, so the others are not held up while
it loads), and a surplus explorer is asked to leave (`STOP_REASON_SCALED_DOWN`: it finishes its rollout batch, puts
it, reports `leaving`; the supervisor then hands back what it still held and drops it, never replacing it). Which run
gets a free explorer, and which gives spare ones back to a pending run, is the queue's plan (trinity.gateway.queue).

The sync generation follows: the gateway sizes each generation by the run's explorers that are assigned, not
leaving, not finished and not still loading (`SyncGroups.open`), and closes the current one after each change, so
the trainer opens the next with the new membership."""

from __future__ import annotations

import threading

import grpc

from trinity.config.modes import EXPLORER_MODES
from trinity.gateway.ledger import ROLE_EXPLORER, ROLE_TRAINER, RUNNING, RunLedger, active_explorers, all_finished
from trinity.gateway.stages import Stages
from trinity.gateway.tenants import check_scale
from trinity.runtime.errors import FailedPrecondition, InvalidArgument, one_line
from trinity.runtime.limits import MAX_SYNC_WORKERS
from trinity.runtime.logging import get_logger
from trinity.runtime.tenants import OPERATOR, Tenant
from trinity.v1 import explorer_pb2, gateway_pb2

log = get_logger(__name__)


class Scaler:
    def __init__(self, ledger: RunLedger, stages: Stages) -> None:
        self.ledger, self.stages = ledger, stages
        # run -> explorers started on it that have not asked to join its sync group yet (their engines still load):
        # no generation waits for them meanwhile. Kept here only: a restarted gateway counts them at once, as before.
        self._joining: dict[str, set[str]] = {}
        self._joining_lock = threading.Lock()

    def joining(self, run: gateway_pb2.Run) -> set[str]:
        """The run's explorers still loading after they joined (ScaleRun), whom its sync generations do not count."""
        with self._joining_lock:
            return self._joining.get(run.id, set()) & set(run.assignments)

    def ready(self, run_id: str, instance_id: str) -> bool:
        """An explorer asks to join the run's sync group: one that joined the run (ScaleRun) counts from now on, and
        the generation is closed for the trainer to open the next with it; whether it was such a newcomer."""
        with self._joining_lock:
            waiting = self._joining.get(run_id, set())
            if instance_id not in waiting:
                return False
            waiting.discard(instance_id)
        self.ledger.close_generation(run_id, f"explorer {instance_id} is ready")
        return True

    def scale(self, run_id: str, explorers: int, caller: Tenant = OPERATOR) -> gateway_pb2.Run:
        """Record that the run wants `explorers` explorers, within its tenant's quota; the monitor's next sweeps get
        it there as the pool allows (trinity.gateway.queue)."""
        if not 1 <= explorers <= MAX_SYNC_WORKERS:
            raise InvalidArgument("explorers", f"must be between 1 and {MAX_SYNC_WORKERS}, got {explorers}")
        with self.ledger.change(run_id) as run:  # NOT_FOUND for an unknown run
            if run.state != RUNNING:
                state = gateway_pb2.RunState.Name(run.state).removeprefix("RUN_STATE_")
                raise FailedPrecondition(f"run {run_id} is {state}; only a RUNNING run can be scaled")
            mode = self.ledger.stage_config(run).mode
            if mode not in EXPLORER_MODES:
                raise FailedPrecondition(f"stage {run.stage} of run {run_id} is mode {mode.value}: it has no explorers")
            if all_finished(run, ROLE_TRAINER):
                raise FailedPrecondition(f"run {run_id} has finished training; its explorers are wrapping up")
            check_scale(self.ledger, caller, run, explorers)
            before = run.explorers or len(active_explorers(run))
            run.explorers = explorers
        self.ledger.note(run_id, f"explorers scaled from {before} to {explorers}")
        log.info("run.scaled", run_id=run_id, explorers=explorers, before=before)
        return run

    def adjust(self, runs: list[gateway_pb2.Run]) -> None:
        """Move running runs toward the explorers they want, as the queue's plan deals them: ask those beyond what a
        run wants, or the spare a pending run needs, to leave; start free ones on runs that want more."""
        with self._joining_lock:  # forget runs that are over or have moved on
            running = {run.id: run for run in runs if run.state == RUNNING}
            self._joining = {r: ids & set(running[r].assignments) for r, ids in self._joining.items() if r in running}
        decided = self.stages.plan(runs)
        for run_id, (keep, why) in decided.leave.items():
            self._leave(run_id, keep, why)
        for run_id, joining in decided.grow.items():
            for _ in range(joining):
                if not self._join(run_id):
                    break

    def _join(self, run_id: str) -> bool:
        """Assign a free explorer instance to the run and start it; whether one started."""
        buffers = self.ledger.registry.alive("buffer")
        new = next(iter(self.stages.free(ROLE_EXPLORER, "", self.ledger.runs.all())), None)
        if new is None or not buffers:  # none free, or the buffer is restarting: the next sweep tries again
            return False
        with self.ledger.change(run_id) as run:
            if run.state != RUNNING or len(active_explorers(run)) >= run.explorers:
                return False
            run.assignments[new.instance_id] = ROLE_EXPLORER
        wanted = run.explorers
        self.ledger.note(run_id, f"explorer {new.instance_id} joins ({len(active_explorers(run))} of {wanted})")
        try:
            # As a replacement: it continues the run's explore steps and waits for the weights they need.
            self.stages.start_on(run, new, buffers[0].address, replacing=True)
        except grpc.RpcError as err:
            with self.ledger.change(run_id) as run:
                run.assignments.pop(new.instance_id, None)
            self.ledger.note(run_id, f"explorer {new.instance_id} did not start ({one_line(err)}); trying another")
            # A generation may count it already.
            self.ledger.close_generation(run_id, f"explorer {new.instance_id} did not start")
            return False
        # Not a member until its engine has loaded and it asks to join (`ready`): the trainer publishes on meanwhile.
        with self._joining_lock:
            self._joining.setdefault(run_id, set()).add(new.instance_id)
        return True

    def _leave(self, run_id: str, keep: int, why: str) -> None:
        """Ask explorers beyond `keep` to leave: lost ones first (nothing to drain), then the newest ids."""
        with self.ledger.change(run_id) as run:
            active = active_explorers(run)
            surplus = len(active) - keep
            if run.state != RUNNING or surplus <= 0:
                return
            leavers = sorted(active, key=lambda i: (i in run.lost_unix_ms, i), reverse=True)[:surplus]
            run.leaving.extend(leavers)
        for instance_id in leavers:
            self.ledger.note(run_id, f"explorer {instance_id} leaves ({keep} of {run.explorers or len(active)}; {why})")
        self.ledger.close_generation(run_id, f"explorer(s) {', '.join(leavers)} leaving")
        draining = [i for i in leavers if i not in run.lost_unix_ms]  # a lost one is retired by the next recovery
        self.ledger.stop_run(draining, run_id, explorer_pb2.STOP_REASON_SCALED_DOWN, why)
