"""The Gateway's gRPC servicer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from trinity.gateway.orchestrator import Orchestrator
from trinity.gateway.registry import InstanceRegistry
from trinity.gateway.runs import TERMINAL, RunStore
from trinity.gateway.sync_groups import SyncGroups
from trinity.runtime.errors import InvalidArgument, grpc_errors, require
from trinity.runtime.status import service_status
from trinity.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

SERVICES = ("buffer", "explorer", "trainer")


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, orchestrator: Orchestrator, instance_id: str) -> None:
        self.orchestrator = orchestrator
        self.runs: RunStore = orchestrator.runs
        self.registry: InstanceRegistry = orchestrator.registry
        self.sync: SyncGroups = orchestrator.sync_groups
        self.instance_id = instance_id

    # ---- runs ----------------------------------------------------------------------------------------

    @grpc_errors
    def CreateRun(self, request: gateway_pb2.CreateRunRequest, context: grpc.ServicerContext) -> Any:
        return self.orchestrator.create_run(require(request.config_yaml, "config_yaml"), request.run_id)

    @grpc_errors
    def GetRun(self, request: gateway_pb2.GetRunRequest, context: grpc.ServicerContext) -> Any:
        return self.runs.get(require(request.run_id, "run_id"))

    @grpc_errors
    def ListRuns(self, request: gateway_pb2.ListRunsRequest, context: grpc.ServicerContext) -> Any:
        return gateway_pb2.ListRunsResponse(runs=self.runs.all())

    @grpc_errors
    def CancelRun(self, request: gateway_pb2.CancelRunRequest, context: grpc.ServicerContext) -> Any:
        return self.orchestrator.cancel(require(request.run_id, "run_id"), request.reason or "cancelled by user")

    def WatchRun(self, request: gateway_pb2.WatchRunRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        if not request.run_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "run_id: must be set")
        try:
            self.runs.get(request.run_id)
        except Exception as err:  # noqa: BLE001 - NotFound, or Redis down: the watch cannot start
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        after = request.after_seq or "0"
        while context.is_active():
            saw_any = False
            for event in self.runs.events(request.run_id, after, block_ms=500):
                saw_any = True
                after = event.seq
                yield event
            if not saw_any and self.runs.get(request.run_id).state in TERMINAL:
                # Nothing new and the run is over: one last look closes the race with the final event.
                tail = list(self.runs.events(request.run_id, after, block_ms=0))
                yield from tail
                return

    @grpc_errors
    def ReportEvent(self, request: gateway_pb2.ReportEventRequest, context: grpc.ServicerContext) -> Any:
        event = request.event
        require(event.run_id, "event.run_id")
        require(event.kind, "event.kind")
        seq, active = self.orchestrator.report(event)
        return gateway_pb2.ReportEventResponse(seq=seq, run_active=active)

    # ---- registry ------------------------------------------------------------------------------------

    @grpc_errors
    def Register(self, request: gateway_pb2.RegisterRequest, context: grpc.ServicerContext) -> Any:
        instance = request.instance
        require(instance.instance_id, "instance.instance_id")
        require(instance.address, "instance.address")
        if instance.service not in SERVICES:
            raise InvalidArgument("instance.service", f"unknown {instance.service!r}; known: {', '.join(SERVICES)}")
        self.registry.register(instance)
        return gateway_pb2.RegisterResponse(heartbeat_interval_seconds=self.registry.heartbeat_interval)

    @grpc_errors
    def Heartbeat(self, request: gateway_pb2.HeartbeatRequest, context: grpc.ServicerContext) -> Any:
        known = self.registry.heartbeat(require(request.instance_id, "instance_id"), request.run_id)
        return gateway_pb2.HeartbeatResponse(known=known)

    @grpc_errors
    def ListInstances(self, request: gateway_pb2.ListInstancesRequest, context: grpc.ServicerContext) -> Any:
        return gateway_pb2.ListInstancesResponse(instances=self.registry.instances(request.service))

    # ---- sync groups ---------------------------------------------------------------------------------

    @grpc_errors
    def OpenSyncGroup(self, request: gateway_pb2.OpenSyncGroupRequest, context: grpc.ServicerContext) -> Any:
        require(request.run_id, "run_id")
        require(request.instance_id, "instance_id")
        group = self.sync.open(request)
        self.orchestrator.event(
            request.run_id, "weights", message=f"sync group generation {group.generation} opened ({group.host})"
        )
        return group

    @grpc_errors
    def JoinSyncGroup(self, request: gateway_pb2.JoinSyncGroupRequest, context: grpc.ServicerContext) -> Any:
        return self.sync.join(
            require(request.run_id, "run_id"), require(request.instance_id, "instance_id"), request.has_gpu
        )

    @grpc_errors
    def GetSyncGroup(self, request: gateway_pb2.GetSyncGroupRequest, context: grpc.ServicerContext) -> Any:
        return self.sync.get(require(request.run_id, "run_id"))

    @grpc_errors
    def AnnounceWeights(self, request: gateway_pb2.AnnounceWeightsRequest, context: grpc.ServicerContext) -> Any:
        return self.sync.announce(require(request.run_id, "run_id"), request.generation, request.version)

    @grpc_errors
    def ReportSyncFailure(self, request: gateway_pb2.ReportSyncFailureRequest, context: grpc.ServicerContext) -> Any:
        group = self.sync.close(require(request.run_id, "run_id"), request.generation)
        self.orchestrator.event(
            request.run_id,
            "weights",
            message=f"sync generation {request.generation} failed at {request.instance_id}: {request.error}",
        )
        return group or gateway_pb2.SyncGroup(run_id=request.run_id)

    @grpc_errors
    def GetStatus(self, request: common_pb2.GetStatusRequest, context: grpc.ServicerContext) -> Any:
        active = [r for r in self.runs.all() if r.state not in TERMINAL]
        return service_status(
            "gateway",
            self.instance_id,
            state="running" if active else "idle",
            metrics={"active_runs": len(active), "instances": len(self.registry.instances())},
        )
