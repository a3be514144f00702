"""The Gateway's gRPC servicer."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
import redis

from trinity.config.base import NAME_PATTERN
from trinity.gateway.orchestrator import Orchestrator
from trinity.gateway.registry import InstanceRegistry
from trinity.gateway.runs import TERMINAL, RunStore
from trinity.gateway.steering import steer
from trinity.gateway.sync_groups import SyncGroups
from trinity.gateway.tenants import owned, sees
from trinity.runtime.aio import MAX_WAITS, in_pool
from trinity.runtime.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    ServiceError,
    at_most,
    bounded,
    grpc_errors,
    require,
)
from trinity.runtime.limits import MAX_ACTIVE_RUNS, MAX_CONFIG_BYTES, MAX_PATH_CHARS, MAX_TEXT_CHARS
from trinity.runtime.status import service_status
from trinity.runtime.tenants import OPERATOR, Tenant
from trinity.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

SERVICES = ("buffer", "explorer", "trainer")
# What a tenant's token may call (trinity.runtime.server.BearerTokenInterceptor): the runs API and what it reads of
# the services. The rest (registry, events, sync groups, rank secrets) is what the services say to each other.
TENANT_METHODS = (
    "CreateRun",
    "GetRun",
    "ListRuns",
    "CancelRun",
    "WatchRun",
    "GetRunSpans",
    "ScaleRun",
    "PauseRun",
    "ResumeRun",
    "SteerRun",
    "ListInstances",
    "GetStatus",
)
EVENT_SEQ = re.compile(r"\d{1,20}(-\d{1,20})?")  # a Redis stream entry id, as RunEvent.seq carries it


def _check_event(event: gateway_pb2.RunEvent) -> None:
    require(event.run_id, "event.run_id")
    if event.kind not in gateway_pb2.EventKind.values() or event.kind == gateway_pb2.EVENT_KIND_UNSPECIFIED:
        raise InvalidArgument("event.kind", f"{event.kind} is not an EventKind (EVENT_KIND_TRAIN, ...)")
    bounded(event.source, "event.source")
    bounded(event.seq, "event.seq")
    bounded(event.message, "event.message", MAX_TEXT_CHARS)
    bounded(event.final_model_path, "event.final_model_path", MAX_PATH_CHARS)
    at_most(event.metrics, "event.metrics")
    for name in event.metrics:
        bounded(name, "event.metrics")
    at_most(event.spans, "event.spans")
    for span in event.spans:
        bounded(span.detail, "event.spans.detail")


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, orchestrator: Orchestrator, instance_id: str, max_active_runs: int = MAX_ACTIVE_RUNS) -> None:
        self.orchestrator = orchestrator
        self.runs: RunStore = orchestrator.ledger.runs
        self.registry: InstanceRegistry = orchestrator.ledger.registry
        self.sync: SyncGroups = orchestrator.ledger.sync_groups
        self.instance_id = instance_id
        self.max_active_runs = max_active_runs

    # ---- runs ----------------------------------------------------------------------------------------

    @grpc_errors
    def CreateRun(self, request: gateway_pb2.CreateRunRequest, context: grpc.ServicerContext) -> Any:
        config_text = require(request.config_yaml, "config_yaml", MAX_CONFIG_BYTES)
        if request.run_id and not NAME_PATTERN.match(request.run_id):
            raise InvalidArgument("run_id", "letters, digits, '_', '.', '-' (at most 128 characters), or empty")
        # Each run that has not ended waits for services in a thread of its own: their number is bounded.
        active = sum(run.state not in TERMINAL for run in self.runs.all())
        if active >= self.max_active_runs:
            raise ResourceExhausted(
                f"{active} runs are pending or running, the gateway's limit (TRINITY_MAX_ACTIVE_RUNS); "
                "wait for one to end or cancel one (trinity runs cancel <id>)"
            )
        bounded(request.request_id, "request_id")
        caller = self._caller(context)
        return self.orchestrator.create_run(
            config_text, request.run_id, request.request_id, caller=caller, priority=request.priority
        )

    def _caller(self, context: grpc.ServicerContext) -> Tenant:
        """The tenant whose token the call carries, else the operator: the interceptor lets no other token in."""
        metadata = dict(context.invocation_metadata() or ())
        return self.orchestrator.ledger.tenants.caller(str(metadata.get("authorization", ""))) or OPERATOR

    def _own(self, run_id: str, context: grpc.ServicerContext) -> str:
        """`run_id`, set, and a run the caller may act on (PERMISSION_DENIED for another tenant's)."""
        require(run_id, "run_id")
        caller = self._caller(context)
        if not caller.is_operator:
            owned(caller, self.runs.get(run_id))
        return run_id

    @grpc_errors
    def GetRun(self, request: gateway_pb2.GetRunRequest, context: grpc.ServicerContext) -> Any:
        return owned(self._caller(context), self.runs.get(require(request.run_id, "run_id")))

    @grpc_errors
    def ListRuns(self, request: gateway_pb2.ListRunsRequest, context: grpc.ServicerContext) -> Any:
        caller = self._caller(context)
        return gateway_pb2.ListRunsResponse(runs=[run for run in self.runs.all() if sees(caller, run)])

    @grpc_errors
    def CancelRun(self, request: gateway_pb2.CancelRunRequest, context: grpc.ServicerContext) -> Any:
        reason = bounded(request.reason, "reason", MAX_TEXT_CHARS) or "cancelled by user"
        return self.orchestrator.cancel(self._own(request.run_id, context), reason)

    async def WatchRun(
        self, request: gateway_pb2.WatchRunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """A coroutine on the server's loop: a watcher holds no thread however long the run (RunStore.watch),
        and a cancelled one is dropped at once."""
        try:
            if not EVENT_SEQ.fullmatch(request.after_seq or "0"):
                raise InvalidArgument("after_seq", "not an event's seq like 1700000000000-0 (RunEvent.seq)")
            if self.orchestrator.ledger.tenants:  # whose run it is, read in the pool (a Redis call)
                await in_pool(lambda watch, pooled: self._own(watch.run_id, pooled), request, context)
            async for event in self.runs.watch(require(request.run_id, "run_id"), request.after_seq or "0"):
                yield event
        except ServiceError as err:  # no run, or a bad request
            await context.abort(err.code, str(err))
        except redis.MaxConnectionsError:
            message = f"{MAX_WAITS} calls already wait here: close some watches, or spread them over more gateways"
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        except (redis.ConnectionError, redis.TimeoutError) as err:  # the SDK watches on after UNAVAILABLE
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"redis unavailable: {err}")

    @grpc_errors
    def ReportEvent(self, request: gateway_pb2.ReportEventRequest, context: grpc.ServicerContext) -> Any:
        event = request.event
        _check_event(event)
        seq, active = self.orchestrator.report(event)
        return gateway_pb2.ReportEventResponse(seq=seq, run_active=active)

    @grpc_errors
    def GetRunSpans(self, request: gateway_pb2.GetRunSpansRequest, context: grpc.ServicerContext) -> Any:
        spans = self.runs.spans(self._own(request.run_id, context), max(0, request.since_step))
        return gateway_pb2.GetRunSpansResponse(spans=spans)

    @grpc_errors
    def ScaleRun(self, request: gateway_pb2.ScaleRunRequest, context: grpc.ServicerContext) -> Any:
        run_id = self._own(request.run_id, context)
        return self.orchestrator.scaler.scale(run_id, request.explorers, self._caller(context))

    @grpc_errors
    def PauseRun(self, request: gateway_pb2.PauseRunRequest, context: grpc.ServicerContext) -> Any:
        reason = bounded(request.reason, "reason", MAX_TEXT_CHARS) or "paused by user"
        return self.orchestrator.pauser.pause(self._own(request.run_id, context), reason)

    @grpc_errors
    def ResumeRun(self, request: gateway_pb2.ResumeRunRequest, context: grpc.ServicerContext) -> Any:
        return self.orchestrator.pauser.resume(self._own(request.run_id, context))

    @grpc_errors
    def SteerRun(self, request: gateway_pb2.SteerRunRequest, context: grpc.ServicerContext) -> Any:
        return steer(self.orchestrator.ledger, self._own(request.run_id, context), request.steering)

    # ---- registry ------------------------------------------------------------------------------------

    @grpc_errors
    def Register(self, request: gateway_pb2.RegisterRequest, context: grpc.ServicerContext) -> Any:
        instance = request.instance
        require(instance.instance_id, "instance.instance_id")
        require(instance.address, "instance.address")
        bounded(instance.run_id, "instance.run_id")
        if instance.service not in SERVICES:
            raise InvalidArgument("instance.service", f"unknown {instance.service!r}; known: {', '.join(SERVICES)}")
        self.orchestrator.on_registered(self.registry.register(instance))
        return gateway_pb2.RegisterResponse(heartbeat_interval_seconds=self.registry.heartbeat_interval)

    @grpc_errors
    def Heartbeat(self, request: gateway_pb2.HeartbeatRequest, context: grpc.ServicerContext) -> Any:
        instance_id = require(request.instance_id, "instance_id")
        known = self.registry.heartbeat(instance_id, bounded(request.run_id, "run_id"), request.stage)
        return gateway_pb2.HeartbeatResponse(known=known)

    @grpc_errors
    def ListInstances(self, request: gateway_pb2.ListInstancesRequest, context: grpc.ServicerContext) -> Any:
        return gateway_pb2.ListInstancesResponse(instances=self.registry.instances(bounded(request.service, "service")))

    # ---- sync groups ---------------------------------------------------------------------------------

    @grpc_errors
    def OpenSyncGroup(self, request: gateway_pb2.OpenSyncGroupRequest, context: grpc.ServicerContext) -> Any:
        require(request.run_id, "run_id")
        require(request.instance_id, "instance_id")
        group = self.sync.open(request, members=lambda: self.orchestrator.sync_members(request.run_id))
        opened = f"sync group generation {group.generation} opened ({group.host})"
        self.orchestrator.ledger.event(request.run_id, gateway_pb2.EVENT_KIND_WEIGHTS, message=opened)
        return group

    @grpc_errors
    def JoinSyncGroup(self, request: gateway_pb2.JoinSyncGroupRequest, context: grpc.ServicerContext) -> Any:
        require(request.run_id, "run_id")
        require(request.instance_id, "instance_id")
        if request.instance_id in self.orchestrator.leaving(request.run_id):
            # Asked to leave (ScaleRun): it finishes its batch on the weights it has; the generations go on without it.
            raise FailedPrecondition(f"explorer {request.instance_id} is leaving run {request.run_id}")
        if self.orchestrator.scaler.ready(request.run_id, request.instance_id):
            # Its engine has loaded: the generation it was not counted in is closed; it joins the trainer's next.
            raise FailedPrecondition(
                f"explorer {request.instance_id} joins the next sync generation of {request.run_id}"
            )
        return self.sync.join(request)

    @grpc_errors
    def GetSyncGroup(self, request: gateway_pb2.GetSyncGroupRequest, context: grpc.ServicerContext) -> Any:
        return self.sync.get(require(request.run_id, "run_id"))

    @grpc_errors
    def AnnounceWeights(self, request: gateway_pb2.AnnounceWeightsRequest, context: grpc.ServicerContext) -> Any:
        return self.sync.announce(require(request.run_id, "run_id"), request.generation, request.version)

    @grpc_errors
    def ReportSyncFailure(self, request: gateway_pb2.ReportSyncFailureRequest, context: grpc.ServicerContext) -> Any:
        bounded(request.instance_id, "instance_id")
        bounded(request.error, "error", MAX_TEXT_CHARS)
        group = self.sync.close(require(request.run_id, "run_id"), request.generation)
        failed = f"sync generation {request.generation} failed at {request.instance_id}: {request.error}"
        self.orchestrator.ledger.event(request.run_id, gateway_pb2.EVENT_KIND_WEIGHTS, message=failed)
        return group or gateway_pb2.SyncGroup(run_id=request.run_id)

    @grpc_errors
    def GetRankSecret(self, request: gateway_pb2.GetRankSecretRequest, context: grpc.ServicerContext) -> Any:
        run_id = require(request.run_id, "run_id")
        self.runs.get(run_id)  # NOT_FOUND for a run that does not exist: no secret is made for it
        return gateway_pb2.RankSecret(secret=self.sync.rank_secret(run_id))

    @grpc_errors
    def GetStatus(self, request: common_pb2.GetStatusRequest, context: grpc.ServicerContext) -> Any:
        active = [r for r in self.runs.all() if r.state not in TERMINAL]
        return service_status(
            "gateway",
            self.instance_id,
            state="running" if active else "idle",
            metrics={"active_runs": len(active), "instances": len(self.registry.instances())},
        )
