"""One run at a time per service instance: what the explorer and trainer servicers share.

StartRun is idempotent (a retried assignment of the same run and stage is a no-op); a different run
while one is active is refused with FAILED_PRECONDITION; StopRun stops the current run if it matches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from trinity.config import RunConfig
from trinity.runtime.errors import FailedPrecondition, InvalidArgument, bounded
from trinity.runtime.limits import MAX_TEXT_CHARS
from trinity.runtime.logging import get_logger
from trinity.runtime.status import service_status
from trinity.v1 import common_pb2, explorer_pb2, gateway_pb2

ACTIVE = ("starting", "running")
# What a runner reports as it ends its part: a run over elsewhere does not stop it from reporting these.
LAST_KINDS = frozenset({gateway_pb2.EVENT_KIND_FINISHED, gateway_pb2.EVENT_KIND_ERROR, gateway_pb2.EVENT_KIND_LEAVING})


class Runner(Protocol):
    run_id: str
    stage: int
    state: str

    @property
    def model_version(self) -> int: ...

    def start(self) -> None: ...

    def stop(self, reason: explorer_pb2.StopReason, detail: str = "") -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


log = get_logger(__name__)


class RunHost:
    def __init__(
        self,
        service: str,
        instance_id: str,
        make_runner: Callable[[explorer_pb2.StartRunRequest, RunConfig], Any],
        metrics: Callable[[Any], dict[str, float]],
    ) -> None:
        self.service = service
        self.instance_id = instance_id
        self.make_runner = make_runner
        self.metrics = metrics
        self.runner: Any = None
        self._assigned = ("", 0)  # the run and stage StartRun last accepted: what heartbeats report
        self._lock = threading.Lock()

    def current_run(self) -> tuple[str, int]:
        """The run (and stage) this instance was last started on, ("", 0) before any: from the moment StartRun
        accepts it, through a slow runner construction, until the next StartRun."""
        return self._assigned

    def status(self) -> common_pb2.ServiceStatus:
        runner = self.runner
        if runner is None:
            return service_status(self.service, self.instance_id)
        return service_status(
            self.service,
            self.instance_id,
            state=runner.state,
            run_id=runner.run_id,
            model_version=runner.model_version,
            metrics=self.metrics(runner),
        )

    def start(self, request: explorer_pb2.StartRunRequest) -> common_pb2.ServiceStatus:
        if not request.run_id:
            raise InvalidArgument("run_id", "must be set")
        config = RunConfig.model_validate_json(request.config_json)
        with self._lock:
            current = self.runner
            if current is not None and current.state in ACTIVE:
                if current.run_id == request.run_id and current.stage == request.stage:
                    return self.status()  # a retried assignment
                raise FailedPrecondition(f"busy with run {current.run_id!r}; stop it first")
            before, self._assigned = self._assigned, (request.run_id, request.stage)
            try:
                self.runner = self.make_runner(request, config)
                self.runner.start()
            except BaseException:
                self._assigned = before
                raise
        return self.status()

    def stop(self, request: explorer_pb2.StopRunRequest) -> common_pb2.ServiceStatus:
        if request.reason not in explorer_pb2.StopReason.values():
            raise InvalidArgument("reason", f"unknown stop reason {request.reason}")
        bounded(request.detail, "detail", MAX_TEXT_CHARS)
        runner = self.runner
        if runner is not None and (not request.run_id or runner.run_id == request.run_id):
            runner.stop(request.reason, request.detail)
        return self.status()

    def shutdown(self, timeout: float = 60.0) -> None:
        """After the RPC drain (`service.draining`), the run's own wrap-up (a trainer's step and checkpoint, an
        explorer's rollout batch) gets up to `timeout` s; both waits are logged, so the exit matches its logs."""
        runner = self.runner
        if runner is not None:
            log.info("service.run_stopping", run_id=runner.run_id, state=runner.state, timeout_seconds=timeout)
            started = time.monotonic()
            runner.stop(explorer_pb2.STOP_REASON_SHUTDOWN, "service shutting down")
            runner.join(timeout=timeout)
            log.info(
                "service.run_stopped", run_id=runner.run_id, state=runner.state, seconds=time.monotonic() - started
            )


class _Reports(Protocol):
    """What `ReportingRunner._report` reads of its runner: `step` may be an attribute or a property."""

    reporter: Any  # trinity.clients.gateway.RunReporter
    _stop: threading.Event

    @property
    def step(self) -> int: ...

    @property
    def model_version(self) -> int: ...


class ReportingRunner:
    """Mixin of the explorer and trainer runners: report an event; stop when the run is over."""

    reporter: Any  # trinity.clients.gateway.RunReporter
    _stop: threading.Event

    @property
    def model_version(self) -> int:
        """The weight version the runner serves or trains; each runner says where it comes from."""
        raise NotImplementedError

    def _report(
        self: _Reports,
        kind: gateway_pb2.EventKind,
        *,
        step: int | None = None,
        message: str = "",
        metrics: dict | None = None,
        final_model_path: str = "",
    ) -> None:
        active = self.reporter.report(
            kind,
            step=self.step if step is None else step,
            model_version=self.model_version,
            message=message,
            metrics=metrics,
            final_model_path=final_model_path,
        )
        if not active and kind not in LAST_KINDS:
            self._stop.set()  # the run is over (cancelled or failed elsewhere)
