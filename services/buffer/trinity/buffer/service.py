"""The Buffer's gRPC servicer: request validation and mapping; the work happens in BufferStore."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import grpc
import redis
import redis.asyncio
from google.protobuf.message import Message

from trinity.buffer import metrics
from trinity.buffer.offline import export_entries, offline_experiences
from trinity.buffer.sampling import DEFAULT_LIMIT, MAX_LIMIT, SampleFilter, sample
from trinity.buffer.store import BufferStore
from trinity.buffer.streams.experience_stream import ExperienceStream, ReadResult
from trinity.buffer.streams.validation import validate_experiences
from trinity.buffer.tasksets.mixture import Mixture
from trinity.buffer.wire import PutExperiencesWire, encode_read_response
from trinity.config import MixtureConfig, OfflineDataConfig, StreamConfig, TaskSetConfig
from trinity.config.spec import from_spec, to_spec
from trinity.runtime.aio import in_pool
from trinity.runtime.errors import (
    InvalidArgument,
    ResourceExhausted,
    at_most,
    bounded,
    grpc_errors,
    in_range,
    require,
)
from trinity.runtime.limits import MAX_ITEMS, MAX_NAME_CHARS, MAX_PATH_CHARS, MAX_TEXT_CHARS
from trinity.runtime.status import service_status
from trinity.v1 import buffer_pb2, buffer_pb2_grpc, common_pb2

MAX_BLOCK_MS = 60_000
MAX_LEASE_SECONDS = 86_400.0  # TaskSetConfig.lease_seconds allows no more
ENTRY_ID = re.compile(r"\d{1,20}-\d{1,20}")  # a Redis stream entry id; Redis refuses any other form


def _batch_size(value: int, field: str) -> int:
    if value <= 0:
        raise InvalidArgument(field, f"must be > 0, got {value}")
    if value > MAX_ITEMS:
        raise ResourceExhausted(f"{field}: {value} exceeds the limit of {MAX_ITEMS}")
    return value


def _entry_ids(ids: Sequence[str], field: str = "entry_ids") -> list[str]:
    at_most(ids, field)
    for i, entry_id in enumerate(ids):
        if not ENTRY_ID.fullmatch(entry_id):
            raise InvalidArgument(f"{field}[{i}]", "not a stream entry id like 1700000000000-0 (from ReadExperiences)")
    return list(ids)


# Messages whose strings are texts (a prompt template's system prompt, examples and format string), not names.
_TEXT_MESSAGES = frozenset({"trinity.v1.PromptTemplate", "trinity.v1.FewShotExample"})


def _bounded_spec(message: Message, field: str) -> Message:
    """A spec (a task set's, a stream's, an offline load's): a path fits a path, a template's text a text, every
    other string a name, and every repeated or map field its count, at any depth."""
    text = message.DESCRIPTOR.full_name in _TEXT_MESSAGES
    for descriptor, value in message.ListFields():
        where = f"{field}.{descriptor.name}" if field else descriptor.name
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            at_most(value, where)
            for key, item in value.items():
                bounded(str(key), where)
                if isinstance(item, str):
                    bounded(item, f"{where}[{key!r}]")
        elif descriptor.is_repeated:
            at_most(value, where)
            for i, item in enumerate(value):
                if isinstance(item, Message):
                    _bounded_spec(item, f"{where}[{i}]")
                elif isinstance(item, str):
                    bounded(item, f"{where}[{i}]")
        elif isinstance(value, Message):
            _bounded_spec(value, where)
        elif isinstance(value, str):
            limit = MAX_TEXT_CHARS if text else MAX_PATH_CHARS if descriptor.name == "path" else MAX_NAME_CHARS
            bounded(value, where, limit)
    return message


class BufferServicer(buffer_pb2_grpc.BufferServiceServicer):
    def __init__(self, store: BufferStore, instance_id: str, waits: redis.asyncio.Redis) -> None:
        self.store = store
        self.instance_id = instance_id
        self.waits = waits  # the client long polls wait with, on the server's loop

    # ---- task sets ---------------------------------------------------------------------------------

    def _taskset_info(self, name: str) -> buffer_pb2.TaskSetInfo:
        taskset = self.store.taskset(name)
        info = taskset.info()
        info.spec.CopyFrom(to_spec(taskset.config, buffer_pb2.TaskSetSpec()))
        return info

    @grpc_errors
    def CreateTaskSet(self, request: buffer_pb2.CreateTaskSetRequest, context: grpc.ServicerContext) -> Any:
        config = from_spec(TaskSetConfig, _bounded_spec(request.spec, "spec"), "spec")
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
        source = self.store.tasks_from(require(request.taskset, "taskset"))  # a task set or a mixture
        in_range(request.lease_seconds, "lease_seconds", 0, MAX_LEASE_SECONDS)  # 0 = the task set's default
        tasks, exhausted = source.lease(
            require(request.consumer, "consumer"), _batch_size(request.batch_size, "batch_size"), request.lease_seconds
        )
        for taskset, count in Counter(t.taskset for t in tasks).items():  # a mixture's tasks count for their member
            metrics.TASKS_LEASED.labels(taskset).inc(count)
        return buffer_pb2.LeaseTasksResponse(tasks=tasks, exhausted=exhausted)

    @grpc_errors
    def CompleteTasks(self, request: buffer_pb2.CompleteTasksRequest, context: grpc.ServicerContext) -> Any:
        taskset = self.store.taskset(require(request.taskset, "taskset"))
        at_most(request.results, "results")
        for i, result in enumerate(request.results):
            require(result.lease_id, f"results[{i}].lease_id")
            bounded(result.task_id, f"results[{i}].task_id")
            if not (math.isfinite(result.pass_rate) and result.pass_rate <= 1):
                raise InvalidArgument(
                    f"results[{i}].pass_rate", f"must be a number <= 1 (< 0 = not scored), got {result.pass_rate}"
                )
        completed, unknown = taskset.complete(request.results)
        metrics.TASKS_COMPLETED.labels(request.taskset).inc(completed)
        return buffer_pb2.CompleteTasksResponse(completed=completed, unknown=unknown)

    @grpc_errors
    def RenewTaskLeases(self, request: buffer_pb2.RenewTaskLeasesRequest, context: grpc.ServicerContext) -> Any:
        taskset = self.store.taskset(require(request.taskset, "taskset"))
        consumer = require(request.consumer, "consumer")
        if not request.lease_ids:
            raise InvalidArgument("lease_ids", "must name at least one lease (Task.lease_id)")
        at_most(request.lease_ids, "lease_ids")
        for i, lease_id in enumerate(request.lease_ids):
            require(lease_id, f"lease_ids[{i}]")
        in_range(request.lease_seconds, "lease_seconds", 0, MAX_LEASE_SECONDS)  # 0 = the task set's default
        renewed, lost, deadline_ms = taskset.renew(consumer, request.lease_ids, request.lease_seconds)
        return buffer_pb2.RenewTaskLeasesResponse(renewed=renewed, lost=lost, lease_deadline_ms=deadline_ms)

    @grpc_errors
    def ReleaseTasks(self, request: buffer_pb2.ReleaseTasksRequest, context: grpc.ServicerContext) -> Any:
        consumer = require(request.consumer, "consumer")
        names = [bounded(request.taskset, "taskset")] if request.taskset else self.store.taskset_names()
        released = sum(self.store.tasks_from(n).release(consumer) for n in names)  # a mixture: every member's
        return buffer_pb2.ReleaseTasksResponse(released=released)

    def _mixture_info(self, mixture: Mixture) -> buffer_pb2.MixtureInfo:
        info = mixture.info()
        info.spec.CopyFrom(to_spec(mixture.config, buffer_pb2.MixtureSpec()))
        return info

    @grpc_errors
    def CreateMixture(self, request: buffer_pb2.CreateMixtureRequest, context: grpc.ServicerContext) -> Any:
        config = from_spec(MixtureConfig, _bounded_spec(request.spec, "spec"), "spec")
        return self._mixture_info(self.store.create_mixture(config, replace=request.replace))

    @grpc_errors
    def GetMixture(self, request: buffer_pb2.GetMixtureRequest, context: grpc.ServicerContext) -> Any:
        return self._mixture_info(self.store.mixture(require(request.name, "name")))

    # ---- streams -----------------------------------------------------------------------------------

    def _stream_info(self, stream: ExperienceStream) -> buffer_pb2.StreamInfo:
        stats = stream.stats()
        return buffer_pb2.StreamInfo(
            spec=to_spec(stream.config, buffer_pb2.StreamSpec()), stats=buffer_pb2.StreamStats(**stats)
        )

    @grpc_errors
    def CreateStream(self, request: buffer_pb2.CreateStreamRequest, context: grpc.ServicerContext) -> Any:
        config = from_spec(StreamConfig, _bounded_spec(request.spec, "spec"), "spec")
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
        at_most(request.experiences, "experiences")
        validate_experiences(request.experiences)
        result = stream.put(request.experiences, payloads=payloads)
        metrics.PUT.labels(request.stream).inc(result.accepted)
        for reason, n in result.dropped.items():
            metrics.DROPPED.labels(request.stream, reason).inc(n)
        return buffer_pb2.PutExperiencesResponse(accepted=result.accepted, dropped=dict(result.dropped))

    async def ReadExperiences(
        self, request: buffer_pb2.ReadExperiencesRequest, context: grpc.aio.ServicerContext
    ) -> bytes:
        """The serialized ReadExperiencesResponse, assembled around the stored bytes (see `wire`).

        A coroutine: a long poll (`block_ms`) waits on the server's loop and holds no thread while it waits
        (a cancelled one drops its Redis connection at once); the reads around the wait run in the pool.
        """
        stream, result = await in_pool(self._read_now, request, context)
        if not result.entries and request.block_ms > 0 and await self._appended(stream, request.block_ms):
            _, again = await in_pool(self._read_now, request, context)
            again.dropped_stale += result.dropped_stale
            again.dead_lettered += result.dead_lettered
            result = again
        metrics.DELIVERED.labels(request.stream).inc(len(result.entries))
        if result.dropped_stale:
            metrics.DROPPED.labels(request.stream, "stale").inc(result.dropped_stale)
        return encode_read_response(
            result.entries,
            dropped_stale=result.dropped_stale,
            reclaimed=result.reclaimed,
            dead_lettered=result.dead_lettered,
            consumer_pending=result.consumer_pending,
        )

    @grpc_errors
    def _read_now(
        self, request: buffer_pb2.ReadExperiencesRequest, context: grpc.ServicerContext
    ) -> tuple[ExperienceStream, ReadResult]:
        stream = self.store.stream(require(request.stream, "stream"))
        if not 0 <= request.block_ms <= MAX_BLOCK_MS:
            raise InvalidArgument("block_ms", f"must be between 0 and {MAX_BLOCK_MS}, got {request.block_ms}")
        result = stream.read(
            require(request.consumer, "consumer"),
            _batch_size(request.batch_size, "batch_size"),
            min_model_version=request.min_model_version,
        )
        return stream, result

    async def _appended(self, stream: ExperienceStream, block_ms: int) -> bool:
        try:
            return await stream.wait_for_append(self.waits, block_ms)
        except redis.RedisError:
            return True  # the read after it answers as any call does when Redis fails (UNAVAILABLE, NOT_FOUND)

    @grpc_errors
    def AckExperiences(self, request: buffer_pb2.AckExperiencesRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        acked = stream.ack(_entry_ids(request.entry_ids))
        metrics.ACKED.labels(request.stream).inc(acked)
        return buffer_pb2.AckExperiencesResponse(acked=acked)

    @grpc_errors
    def NackExperiences(self, request: buffer_pb2.NackExperiencesRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        consumer = require(request.consumer, "consumer")
        keep = set(_entry_ids(request.keep_entry_ids, "keep_entry_ids"))
        pending = [e for e in stream.pending_of(consumer) if e not in keep] if request.all_pending else []
        requeued = stream.nack(consumer, [*_entry_ids(request.entry_ids), *pending])
        return buffer_pb2.NackExperiencesResponse(requeued=requeued)

    @grpc_errors
    def RenewExperiences(self, request: buffer_pb2.RenewExperiencesRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        renewed = stream.renew(require(request.consumer, "consumer"), _entry_ids(request.entry_ids))
        return buffer_pb2.RenewExperiencesResponse(renewed=renewed)

    @grpc_errors
    def TrimStream(self, request: buffer_pb2.TrimStreamRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        return buffer_pb2.TrimStreamResponse(removed=stream.trim())

    @grpc_errors
    def SampleExperiences(self, request: buffer_pb2.SampleExperiencesRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        if not 0 <= request.limit <= MAX_LIMIT:
            raise InvalidArgument(
                "limit", f"must be between 1 and {MAX_LIMIT} (0 = {DEFAULT_LIMIT}), got {request.limit}"
            )
        for field in ("min_reward", "max_reward"):
            if request.HasField(field) and math.isnan(getattr(request, field)):
                raise InvalidArgument(field, "must be a number, got NaN")
        return sample(stream, request.limit or DEFAULT_LIMIT, SampleFilter.of(request))

    # ---- offline data ------------------------------------------------------------------------------

    @grpc_errors
    def LoadOfflineData(self, request: buffer_pb2.LoadOfflineDataRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        config = from_spec(OfflineDataConfig, _bounded_spec(request, ""), "", request_only=("stream", "kind"))
        experiences, skipped = offline_experiences(config, request.kind, self.store.roots)
        loaded = 0
        for start in range(0, len(experiences), 1000):
            loaded += stream.put(experiences[start : start + 1000], apply_stream_operators=False).accepted
        metrics.PUT.labels(request.stream).inc(loaded)
        return buffer_pb2.LoadOfflineDataResponse(loaded=loaded, skipped=skipped)

    @grpc_errors
    def ExportStream(self, request: buffer_pb2.ExportStreamRequest, context: grpc.ServicerContext) -> Any:
        stream = self.store.stream(require(request.stream, "stream"))
        path = require(request.path, "path", MAX_PATH_CHARS)
        exported = export_entries(
            stream.entries(), path, request.format, roots=self.store.roots, overwrite=request.overwrite
        )
        return buffer_pb2.ExportStreamResponse(exported=exported, path=request.path)

    @grpc_errors
    def GetStatus(self, request: common_pb2.GetStatusRequest, context: grpc.ServicerContext) -> Any:
        return service_status(
            "buffer",
            self.instance_id,
            state="running",
            metrics={"streams": len(self.store.stream_names()), "tasksets": len(self.store.taskset_names())},
        )
