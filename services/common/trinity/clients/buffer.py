"""BufferClient: what the Explorer, the Trainer and the SDK use to reach the Buffer."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from trinity.config import MixtureConfig, OfflineDataConfig, StreamConfig, TaskSetConfig
from trinity.config.spec import to_spec
from trinity.runtime.client import call_with_retry, open_channel
from trinity.runtime.limits import MAX_ITEMS
from trinity.runtime.tls import TlsSettings
from trinity.v1 import buffer_pb2, buffer_pb2_grpc, common_pb2


@dataclass
class ReadBatch:
    """Experiences delivered by one read, with the entry ids to acknowledge once they are used."""

    experiences: list[common_pb2.Experience] = field(default_factory=list)
    entry_ids: list[str] = field(default_factory=list)
    delivery_counts: list[int] = field(default_factory=list)
    dropped_stale: int = 0
    reclaimed: int = 0
    dead_lettered: int = 0
    consumer_pending: int = 0  # entries pending under the consumer after this read, these included

    def __len__(self) -> int:
        return len(self.experiences)


class BufferClient:
    """Every call has a deadline; calls that are safe to repeat retry transient failures with backoff.

    Puts are safe to repeat (the Buffer drops duplicates by experience id), acks are idempotent, and a
    read whose reply was lost leaves its entries pending, to be reclaimed: so all of them retry.
    """

    def __init__(
        self, target: str, *, token: str | None = None, tls: TlsSettings | None = None, timeout: float = 30.0
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = open_channel(target, token=token, tls=tls)
        self._stub = buffer_pb2_grpc.BufferServiceStub(self._channel)
        # Puts send bytes assembled by `_put_request_bytes` (see there); the reply is parsed as usual.
        self._put_encoded = self._channel.unary_unary(
            _PUT_METHOD, request_serializer=None, response_deserializer=buffer_pb2.PutExperiencesResponse.FromString
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> BufferClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, method: str, request: object, timeout: float | None = None) -> Any:
        """The reply of `method` (the generated gRPC stubs are untyped; each caller names the reply type)."""
        fn = getattr(self._stub, method)
        return call_with_retry(lambda: fn(request, timeout=timeout or self.timeout))

    # ---- task sets ---------------------------------------------------------------------------------

    def create_taskset(self, config: TaskSetConfig, *, replace: bool = False) -> buffer_pb2.TaskSetInfo:
        spec = to_spec(config, buffer_pb2.TaskSetSpec())
        return self._call("CreateTaskSet", buffer_pb2.CreateTaskSetRequest(spec=spec, replace=replace))

    def taskset(self, name: str) -> buffer_pb2.TaskSetInfo:
        return self._call("GetTaskSet", buffer_pb2.GetTaskSetRequest(name=name))

    def lease_tasks(
        self, taskset: str, consumer: str, batch_size: int, lease_seconds: float = 0
    ) -> buffer_pb2.LeaseTasksResponse:
        request = buffer_pb2.LeaseTasksRequest(
            taskset=taskset, consumer=consumer, batch_size=batch_size, lease_seconds=lease_seconds
        )
        return self._call("LeaseTasks", request)

    def complete_tasks(
        self, taskset: str, consumer: str, results: Iterable[buffer_pb2.TaskResult]
    ) -> buffer_pb2.CompleteTasksResponse:
        request = buffer_pb2.CompleteTasksRequest(taskset=taskset, consumer=consumer, results=list(results))
        return self._call("CompleteTasks", request)

    def renew_task_leases(
        self, taskset: str, consumer: str, lease_ids: Sequence[str], lease_seconds: float = 0
    ) -> buffer_pb2.RenewTaskLeasesResponse:
        """Extend the leases `consumer` still holds; the reply names those renewed and those lost."""
        request = buffer_pb2.RenewTaskLeasesRequest(
            taskset=taskset, consumer=consumer, lease_ids=list(lease_ids), lease_seconds=lease_seconds
        )
        return self._call("RenewTaskLeases", request)

    def release_tasks(self, consumer: str, taskset: str = "") -> int:
        reply = self._call("ReleaseTasks", buffer_pb2.ReleaseTasksRequest(taskset=taskset, consumer=consumer))
        return int(reply.released)

    def create_mixture(self, config: MixtureConfig, *, replace: bool = False) -> buffer_pb2.MixtureInfo:
        """A mixture of existing task sets; `lease_tasks(config.name, ...)` then draws from it."""
        spec = to_spec(config, buffer_pb2.MixtureSpec())
        return self._call("CreateMixture", buffer_pb2.CreateMixtureRequest(spec=spec, replace=replace))

    def mixture(self, name: str) -> buffer_pb2.MixtureInfo:
        return self._call("GetMixture", buffer_pb2.GetMixtureRequest(name=name))

    # ---- streams -----------------------------------------------------------------------------------

    def create_stream(self, config: StreamConfig, *, exist_ok: bool = True) -> buffer_pb2.StreamInfo:
        spec = to_spec(config, buffer_pb2.StreamSpec())
        return self._call("CreateStream", buffer_pb2.CreateStreamRequest(spec=spec, exist_ok=exist_ok))

    def stream(self, name: str) -> buffer_pb2.StreamInfo:
        return self._call("GetStream", buffer_pb2.GetStreamRequest(name=name))

    def put(self, stream: str, experiences: Sequence[common_pb2.Experience]) -> buffer_pb2.PutExperiencesResponse:
        request = _put_request_bytes(stream, experiences)
        return call_with_retry(lambda: self._put_encoded(request, timeout=self.timeout))

    def read(
        self, stream: str, consumer: str, batch_size: int, *, block_ms: int = 0, min_model_version: int = 0
    ) -> ReadBatch:
        request = buffer_pb2.ReadExperiencesRequest(
            stream=stream,
            consumer=consumer,
            batch_size=batch_size,
            block_ms=block_ms,
            min_model_version=min_model_version,
        )
        reply: buffer_pb2.ReadExperiencesResponse = self._call(
            "ReadExperiences", request, timeout=self.timeout + block_ms / 1000
        )
        return ReadBatch(
            experiences=[item.experience for item in reply.items],
            entry_ids=[item.entry_id for item in reply.items],
            delivery_counts=[item.delivery_count for item in reply.items],
            dropped_stale=reply.dropped_stale,
            reclaimed=reply.reclaimed,
            dead_lettered=reply.dead_lettered,
            consumer_pending=reply.consumer_pending,
        )

    def ack(self, stream: str, entry_ids: Sequence[str]) -> int:
        acked = 0
        for ids in _per_request(entry_ids):
            acked += self._call("AckExperiences", buffer_pb2.AckExperiencesRequest(stream=stream, entry_ids=ids)).acked
        return acked

    def nack(
        self,
        stream: str,
        consumer: str,
        entry_ids: Sequence[str] = (),
        *,
        all_pending: bool = False,
        keep: Sequence[str] = (),
    ) -> int:
        """Hand entries back for redelivery; `all_pending` hands back everything pending under `consumer` but `keep`."""
        request = buffer_pb2.NackExperiencesRequest(
            stream=stream, consumer=consumer, entry_ids=entry_ids, all_pending=all_pending, keep_entry_ids=keep
        )
        return int(self._call("NackExperiences", request).requeued)

    def renew(self, stream: str, consumer: str, entry_ids: Sequence[str]) -> int:
        """Keep entries `consumer` holds from being reclaimed for another claim_idle_ms; how many it still held."""
        renewed = 0
        for ids in _per_request(entry_ids):
            request = buffer_pb2.RenewExperiencesRequest(stream=stream, consumer=consumer, entry_ids=ids)
            renewed += self._call("RenewExperiences", request).renewed
        return renewed

    def trim(self, stream: str) -> int:
        return int(self._call("TrimStream", buffer_pb2.TrimStreamRequest(stream=stream)).removed)

    def sample(
        self,
        stream: str,
        limit: int = 0,
        *,
        min_reward: float | None = None,
        max_reward: float | None = None,
        model_version: int | None = None,
    ) -> buffer_pb2.SampleExperiencesResponse:
        """The stream's newest experiences that pass the filters, without consuming them (SampleExperiences)."""
        request = buffer_pb2.SampleExperiencesRequest(
            stream=stream, limit=limit, min_reward=min_reward, max_reward=max_reward, model_version=model_version
        )
        return self._call("SampleExperiences", request)

    # ---- offline data ------------------------------------------------------------------------------

    def load_offline(
        self, stream: str, config: OfflineDataConfig, kind: common_pb2.ExperienceKind
    ) -> buffer_pb2.LoadOfflineDataResponse:
        """Load SFT samples (`EXPERIENCE_KIND_SFT`) or DPO pairs (`EXPERIENCE_KIND_PREFERENCE`) into `stream`."""
        request = to_spec(config, buffer_pb2.LoadOfflineDataRequest(stream=stream, kind=kind))
        return self._call("LoadOfflineData", request, timeout=max(self.timeout, 600))

    def export(self, stream: str, path: str, fmt: str = "", *, overwrite: bool = False) -> int:
        request = buffer_pb2.ExportStreamRequest(stream=stream, path=path, format=fmt, overwrite=overwrite)
        return int(self._call("ExportStream", request, timeout=max(self.timeout, 600)).exported)

    def status(self) -> common_pb2.ServiceStatus:
        return self._call("GetStatus", common_pb2.GetStatusRequest())


_PUT_METHOD = "/{}/PutExperiences".format(buffer_pb2.DESCRIPTOR.services_by_name["BufferService"].full_name)
_EXPERIENCES_TAG = b"\x12"  # PutExperiencesRequest.experiences: field 2, length-delimited


def _put_request_bytes(stream: str, experiences: Sequence[common_pb2.Experience]) -> bytes:
    """The serialized PutExperiencesRequest, built from each experience's own serialization.

    Equal to `PutExperiencesRequest(...).SerializeToString(deterministic=True)`, at half the
    cost: building that message deep-copies every experience before serializing it all again. (The
    Buffer's own wire helpers live in `trinity.buffer.wire`, which clients must not import.)
    """
    name = stream.encode()
    parts = [b"\x0a", _varint(len(name)), name] if name else []
    for experience in experiences:
        payload = experience.SerializeToString(deterministic=True)  # map fields in key order
        parts += (_EXPERIENCES_TAG, _varint(len(payload)), payload)
    return b"".join(parts)


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int (a length here)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def is_status(err: BaseException, code: grpc.StatusCode) -> bool:
    return isinstance(err, grpc.RpcError) and err.code() == code


def _per_request(entry_ids: Sequence[str]) -> Iterable[Sequence[str]]:
    """Entry ids in requests the buffer takes (at most MAX_ITEMS each): a trainer acknowledges and renews what it
    trained since its last checkpoint, `save_interval` batches, which can exceed one request."""
    return (entry_ids[i : i + MAX_ITEMS] for i in range(0, len(entry_ids), MAX_ITEMS))
