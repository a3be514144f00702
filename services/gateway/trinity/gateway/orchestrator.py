"""The run lifecycle: validate, prepare the Buffer, assign services, follow events, heal, finish or fail. All run
state lives in Redis, so a restarted gateway picks the runs up where they were. The orchestrator hands calls and
events to the parts that each do one job (ledger, stages, supervision, steering) and runs the monitor."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from trinity.config import parse_run_config
from trinity.config.errors import ConfigError
from trinity.config.resolved import resolved_run
from trinity.gateway.ledger import ROLE_TRAINER, RunLedger
from trinity.gateway.pausing import Pauser
from trinity.gateway.registry import InstanceRegistry
from trinity.gateway.runs import TERMINAL, Queued, RunStore, now_ms
from trinity.gateway.scaling import Scaler, active_explorers
from trinity.gateway.stages import Stages
from trinity.gateway.supervision import Supervisor
from trinity.gateway.sync_groups import SyncGroups
from trinity.gateway.tenants import check_config, check_priority, check_runs
from trinity.runtime.errors import InvalidArgument, NotFound
from trinity.runtime.events import kind_name
from trinity.runtime.logging import get_logger
from trinity.runtime.tenants import OPERATOR, Tenant, TenantBook
from trinity.v1 import explorer_pb2, gateway_pb2

log = get_logger(__name__)


def in_thread(fn: Callable[..., object], *args: object) -> None:
    threading.Thread(target=fn, args=args, daemon=True).start()


def take_spans(event: gateway_pb2.RunEvent) -> list[gateway_pb2.Span]:
    """The event's finished spans, for the run's timeline, each marked with the event's source and stage. The event
    keeps its spans only when it is an EVENT_KIND_SPAN (a phase begun or ended, which watchers follow live): a step's
    spans would otherwise double the event log's size."""
    for span in event.spans:
        span.source, span.stage = event.source, event.stage
    finished = [span for span in event.spans if span.end_unix_ms]
    if event.kind != gateway_pb2.EVENT_KIND_SPAN:
        del event.spans[:]
    return finished


class Orchestrator:
    def __init__(
        self,
        runs: RunStore,
        registry: InstanceRegistry,
        sync_groups: SyncGroups,
        *,
        assign_timeout: float = 600.0,
        recovery_seconds: float = 300.0,
        clock: Callable[[], int] = now_ms,
        spawn: Callable[..., None] = in_thread,
        tenants: TenantBook | None = None,
    ) -> None:
        """`clock` (unix ms) times the deadlines; `spawn` runs what a reported event sets off (a failure, a
        finished part, a departure) so that the reporting service's call returns at once; `tenants` are the named
        tokens whose quotas bound their runs (docs/tenants.md)."""
        self.ledger = RunLedger(runs, registry, sync_groups, clock, tenants)
        self.stages = Stages(self.ledger, assign_timeout)
        self.pauser = Pauser(self.ledger, self.stages)
        self.supervisor = Supervisor(self.ledger, self.stages, self.pauser, recovery_seconds)
        self.scaler = Scaler(self.ledger, self.stages)
        self._spawn = spawn
        self._monitor_thread: threading.Thread | None = None

    def create_run(
        self,
        config_text: str,
        run_id: str = "",
        request_id: str = "",
        *,
        caller: Tenant = OPERATOR,
        priority: int = 0,
    ) -> gateway_pb2.Run:
        """Queue a run of `caller` at `priority`, within its tenant's quotas (trinity.gateway.tenants)."""
        check_priority(caller, priority)
        try:
            config = parse_run_config(config_text)
            resolved_run(config)  # every stage validates and resolves, as `trinity check` shows it
        except ConfigError as err:
            raise InvalidArgument("", f"invalid run config: {err}") from None
        check_config(caller, config)
        queued = Queued(caller.name, priority, admit=functools.partial(check_runs, caller))
        run, created = self.ledger.runs.create_once(
            config.name, config.model_dump_json(), run_id, request_id, queue=queued
        )
        if created:  # else a retry of the request that created it, which has said so
            self.ledger.event(run.id, gateway_pb2.EVENT_KIND_STATE, message="run accepted", state=run.state)
        return run  # the monitor launches it once its services are free

    def cancel(self, run_id: str, reason: str = "cancelled") -> gateway_pb2.Run:
        """Stop the run: CANCELLED, unless it only served on after its training finished
        (`explorer.keep_serving_after_last_step`), which is how such a run ends: SUCCEEDED."""
        run = self.ledger.runs.get(run_id)
        if run.state in TERMINAL:
            return run
        self.ledger.stop_run(list(run.assignments), run_id, explorer_pb2.STOP_REASON_CANCELLED, reason)
        if self._serving_after_training(run):
            return self.ledger.finish(
                run_id, gateway_pb2.RUN_STATE_SUCCEEDED, f"training finished; serving stopped ({reason})"
            )
        return self.ledger.finish(run_id, gateway_pb2.RUN_STATE_CANCELLED, reason)

    def sync_members(self, run_id: str) -> int:
        """The explorers the run's next sync generation waits for (assigned, not leaving); 0 for a run unknown here
        or with none assigned (the trainer's own count stands)."""
        run = self._known(run_id)
        return len(set(active_explorers(run)) - self.scaler.joining(run))

    def leaving(self, run_id: str) -> list[str]:
        """The run's explorers asked to leave (ScaleRun); none for a run unknown here."""
        return list(self._known(run_id).leaving)

    def _known(self, run_id: str) -> gateway_pb2.Run:
        """The run, or an empty one where this gateway does not know it (a trainer syncing for a run of its own)."""
        try:
            return self.ledger.runs.get(run_id)
        except NotFound:
            return gateway_pb2.Run(id=run_id)

    def _serving_after_training(self, run: gateway_pb2.Run) -> bool:
        trainers = [i for i, role in run.assignments.items() if role == ROLE_TRAINER]
        trained = bool(trainers) and all(i in run.finished for i in trainers)
        return trained and self.ledger.stage_config(run).explorer.keep_serving_after_last_step

    def report(self, event: gateway_pb2.RunEvent) -> tuple[str, bool]:
        """Record a service's event and move the run along (progress, completion, failure); returns the event's
        seq and whether the run is still active."""
        if self.ledger.runs.get(event.run_id).state in TERMINAL:
            return "", False
        seq, new = self.ledger.runs.append_once(event, take_spans(event))
        if not new:
            return seq, True
        with self.ledger.change(event.run_id) as run:
            if event.kind == gateway_pb2.EVENT_KIND_TRAIN:
                run.train_step = max(run.train_step, event.step)
            elif event.kind == gateway_pb2.EVENT_KIND_EXPLORE:
                run.explore_step = max(run.explore_step, event.step)
            run.model_version = max(run.model_version, event.model_version)
            for key, value in event.metrics.items():
                run.latest_metrics[f"{kind_name(event.kind)}/{key}"] = value
        instance_id = event.source.partition("/")[2]
        if event.kind == gateway_pb2.EVENT_KIND_ERROR:
            self._spawn(self.ledger.fail, run.id, f"{event.source}: {event.message}")
        elif event.kind == gateway_pb2.EVENT_KIND_FINISHED:
            self._spawn(self.stages.on_finished, run.id, instance_id, event.final_model_path)
        elif event.kind == gateway_pb2.EVENT_KIND_LEAVING:
            # A draining service: its work is handed on now, not once the liveness window has passed.
            self._spawn(self.supervisor.lose, run.id, instance_id, "it is shutting down")
        return seq, True

    def on_registered(self, previous: gateway_pb2.Instance | None) -> None:
        """A new process registered under a known instance id: the incarnation it replaced is lost."""
        if previous is not None and previous.alive:
            self._spawn(self.supervisor.on_instance_lost, previous, "its process was replaced")

    def start_monitor(self, interval: float = 0.5) -> None:
        self._monitor_thread = threading.Thread(target=self._monitor, args=(interval,), name="monitor", daemon=True)
        self._monitor_thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the monitor and wait for it (and for launches under way), so that nothing still calls Redis
        or the services while the process exits."""
        self.ledger.stopping.set()
        if self._monitor_thread is not None:
            self._monitor_thread.join(timeout)
        self.stages.pool.shutdown(wait=True, cancel_futures=True)

    def sweep(self) -> None:
        """The monitor's periodic work, once: lost instances, replacements, explorers joining and leaving
        (ScaleRun), pending launches."""
        for instance in self.ledger.registry.sweep():
            self.supervisor.on_instance_lost(instance, "no heartbeat")
        self.supervisor.find_absent(self.ledger.runs.all())
        runs = self.ledger.runs.all()  # one read for the rest; a launch or a replacement re-reads what it changes
        self.supervisor.recover(runs)
        self.pauser.sweep(runs)
        self.scaler.adjust(self.ledger.runs.all())  # afresh: a recovery may have changed the assignments
        self.stages.relaunch(runs)
        self.stages.schedule_pending(runs)

    def _monitor(self, interval: float) -> None:
        while not self.ledger.stopping.wait(interval):
            try:
                self.sweep()
            except Exception:
                log.exception("monitor.sweep_failed")
