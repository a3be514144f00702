"""The Buffer's gRPC servicer: request validation and mapping; the work happens in BufferStore."""

from __future__ import annotations

from typing import Any

import grpc

from trinity.buffer import metrics
from trinity.buffer.offline import export_entries, offline_experiences
from trinity.buffer.store import BufferStore
from trinity.buffer.streams.experience_stream import ExperienceStream
from trinity.buffer.streams.validation import validate_experiences
from trinity.buffer.wire import PutExperiencesWire, encode_read_response
from trinity.config import OfflineDataConfig, StreamConfig, TaskSetConfig
from trinity.config.spec import from_spec, to_spec
from trinity.runtime.errors import InvalidArgument, ResourceExhausted, grpc_errors, require
from trinity.runtime.status import service_status
from trinity.v1 import buffer_pb2, buffer_pb2_grpc, common_pb2

MAX_BATCH = 10_000
MAX_BLOCK_MS = 60_000


def _batch_size(value: int, field: str) -> int:
    if value <= 0:
        raise InvalidArgument(field, f"must be > 0, got {value}")
    if value > MAX_BATCH:
        raise ResourceExhausted(f"{field}: {value} exceeds the limit of {MAX_BATCH}")
    return value


class BufferServicer(buffer_pb2_grpc.BufferServiceServicer):
    def __init__(self, store: BufferStore, instance_id: str) -> None:
        self.store = store
        self.instance_id = instance_id

    # ---- task sets ---------------------------------------------------------------------------------

    def _taskset_info(self, name: str) -> buffer_pb2.TaskSetInfo:
        taskset = self.store.taskset(name)
        info = taskset.info()
        info.spec.CopyFrom(to_spec(taskset.config, buffer_pb2.TaskSetSpec()))
        return info

    @grpc_errors
    def CreateTaskSet(self, request: buffer_pb2.CreateTaskSetRequest, context: grpc.ServicerContext) -> Any:
        config = from_spec(TaskSetConfig, request.spec, "spec")
        self.store.create_taskset(config, replace=request.replace)
        return self._taskset_info(config.name)

    @grpc_errors
    def GetTaskSet(self, request: buffer_pb2.GetTaskSetRequest, context: grpc.ServicerContext) -> Any:
        return self._taskset_info(require(request.name, "name"))

    @grpc_errors
    def ListTaskSets(self, request: buffer_pb2.ListTaskSetsRequest, context: grpc.ServicerContext) -> Any:
        return buffer_pb2.ListTaskSetsResponse(tasksets=[self._taskset_info(n) for n in self.store.taskset_names()])

    @grpc_errors
    def LeaseTasks(self, request: buffer_pb2.LeaseTasksRequest, context: grpc.ServicerContext) -> Any:
        taskset = self.store.taskset(require(request.taskset, "taskset"))
        if request.lease_seconds < 0:
            raise InvalidArgument("lease_seconds", "must be >= 0 (0 = the task set's default)")
        tasks, exhausted = taskset.lease(
            require(request.consumer, "consumer"), _batch_size(request.batch_size, "batch_size"), request.lease_seconds
        )
        metrics.TASKS_LEASED.labels(request.taskset).inc(len(tasks))
        return buffer_pb2.LeaseTasksResponse(tasks=tasks, exhausted=exhausted)

    @grpc_errors
    def CompleteTasks(self, request: buffer_pb2.CompleteTasksRequest, context: grpc.ServicerContext) -> Any:
        taskset = self.store.taskset(require(request.taskset, "taskset"))
        for i, result in enumerate(request.results):
            require(result.lease_id, f"results[{i}].lease_id")
            if result.pass_rate > 1:
                raise InvalidArgument(f"results[{i}].pass_rate", f"must be <= 1, got {result.pass_rate}")
        completed, unknown = taskset.complete(request.results)
        metrics.TASKS_COMPLETED.labels(request.taskset).inc(completed)
        return buffer_pb2.CompleteTasksResponse(completed=completed, unknown=unknown)

    @grpc_errors
    def ReleaseTasks(self, request: buffer_pb2.ReleaseTasksRequest, context: grpc.ServicerContext) -> Any:
        consumer = require(request.consumer, "consumer")
        names = [request.taskset] if request.taskset else self.store.taskset_names()
        released = sum(self.store.taskset(n).release(consumer) for n in names)
        return buffer_pb2.ReleaseTasksResponse(released=released)

    # ---- streams -----------------------------------------------------------------------------------

    def _stream_info(self, stream: ExperienceStream) -> buffer_pb2.StreamInfo:
        stats = stream.stats()
        return buffer_pb2.StreamInfo(
            spec=to_spec(stream.config, buffer_pb2.StreamSpec()), stats=buffer_pb2.StreamStats(**stats)
        )

    @grpc_errors
    def CreateStream(self, request: buffer_pb2.CreateStreamRequest, context: grpc.ServicerContext) -> Any:
        config = from_spec(StreamConfig, request.spec, "spec")
        return self._stream_info(self.store.create_stream(config, exist_ok=request.exist_ok))

    @grpc_errors
    def GetStream(self, request: buffer_pb2.GetStreamRequest, context: grpc.ServicerContext) -> Any:
        return self._stream_info(self.store.stream(require(request.name, "name")))

    @grpc_errors
    def ListStreams(self, request: buffer_pb2.ListStreamsRequest, context: grpc.ServicerContext) -> Any:
        infos = [self._stream_info(self.store.stream(n)) for n in self.store.stream_names()]
        return buffer_pb2.ListStreamsResponse(streams=infos)

    @grpc_errors
    def DeleteStream(self, request: buffer_pb2.DeleteStreamRequest, context: grpc.ServicerContext) -> Any:
        return buffer_pb2.DeleteStreamResponse(deleted=self.store.delete_stream(require(request.name, "name")))

    @grpc_errors
    def PutExperiences(
        self, request: buffer_pb2.PutExperiencesRequest | PutExperiencesWire, context: grpc.ServicerContext
    ) -> Any:
        """Over gRPC the request arrives as `PutExperiencesWire`: the experiences' bytes go to Redis as sent."""
        payloads = None
        if isinstance(request, PutExperiencesWire):
            payloads = request.payloads
            request = request.request
        stream = self.store.stream(require(request.stream, "stream"))
        if len(request.experiences) > MAX_BATCH:
            raise ResourceExhausted(f"experiences: {len(request.experiences)} exceeds the limit of {MAX_BATCH}")
        validate_experiences(request.experiences)
        result = stream.put(request.experiences, payloads=payloads)
        metrics.PUT.labels(request.stream).inc(result.accepted)
        for reason, n in result.dropped.items():
            metrics.DROPPED.labels(request.stream, reason).inc(n)
        return buffer_pb2.PutExperiencesResponse(accepted=result.accepted, dropped=dict(result.dropped))

    @grpc_errors
    def ReadExperiences(self, request: buffer_pb2.ReadExperiencesRequest, context: grpc.ServicerContext) -> bytes:
        """The serialized ReadExperiencesResponse, assembled around the stored bytes (see `wire`)."""
        stream = self.store.stream(require(request.stream, "stream"))
        if not 0 <= request.block_ms <= MAX_BLOCK_MS:
            raise InvalidArgument("block_ms", f"must be between 0 and {MAX_BLOCK_MS}, got {request.block_ms}")
        result = stream.read(
            require(request.consumer, "consumer"),
            _batch_size(request.batch_size, "batch_size"),
            block_ms=request.block_ms,
            min_model_version=request.min_model_version,
        )
        metrics.DELIVERED.labels(request.stream).inc(len(result.entries))
        if result.dropped_stale:
            metrics.DROPPED.labels(request.stream, "stale").inc(result.dropped_stale)
        return encode_read_response(
            result.entries,
            dropped_stale=result.dropped_stale,
            reclaimed=result.reclaimed,
            dead_lettered=result.dead_lettered,
        )

    @grpc_errors
    def AckExperiences(self, request: buffer_pb2.AckExperiencesRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        if len(request.entry_ids) > MAX_BATCH:
            raise ResourceExhausted(f"entry_ids: {len(request.entry_ids)} exceeds the limit of {MAX_BATCH}")
        acked = stream.ack(list(request.entry_ids))
        metrics.ACKED.labels(request.stream).inc(acked)
        return buffer_pb2.AckExperiencesResponse(acked=acked)

    @grpc_errors
    def NackExperiences(self, request: buffer_pb2.NackExperiencesRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        requeued = stream.nack(require(request.consumer, "consumer"), list(request.entry_ids))
        return buffer_pb2.NackExperiencesResponse(requeued=requeued)

    @grpc_errors
    def TrimStream(self, request: buffer_pb2.TrimStreamRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        return buffer_pb2.TrimStreamResponse(removed=stream.trim())

    # ---- offline data ------------------------------------------------------------------------------

    @grpc_errors
    def LoadOfflineData(self, request: buffer_pb2.LoadOfflineDataRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        config = from_spec(OfflineDataConfig, request, "", request_only=("stream", "kind"))
        experiences, skipped = offline_experiences(config, request.kind)
        loaded = 0
        for start in range(0, len(experiences), 1000):
            loaded += stream.put(experiences[start : start + 1000], apply_stream_operators=False).accepted
        metrics.PUT.labels(request.stream).inc(loaded)
        return buffer_pb2.LoadOfflineDataResponse(loaded=loaded, skipped=skipped)

    @grpc_errors
    def ExportStream(self, request: buffer_pb2.ExportStreamRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        exported = export_entries(stream.entries(), require(request.path, "path"), request.format)
        return buffer_pb2.ExportStreamResponse(exported=exported, path=request.path)

    @grpc_errors
    def GetStatus(self, request: common_pb2.GetStatusRequest, context: grpc.ServicerContext) -> Any:
        return service_status(
            "buffer",
            self.instance_id,
            state="running",
            metrics={"streams": len(self.store.stream_names()), "tasksets": len(self.store.taskset_names())},
        )
