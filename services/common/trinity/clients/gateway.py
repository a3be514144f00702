"""GatewayClient: the services' and the SDK's way to the control plane."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from trinity.runtime.client import call_with_retry, open_channel
from trinity.runtime.events import kind_name
from trinity.runtime.spans import SpanLog, describe, now_ms
from trinity.runtime.tls import TlsSettings
from trinity.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


class GatewayClient:
    def __init__(
        self, target: str, *, token: str | None = None, tls: TlsSettings | None = None, timeout: float = 30.0
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = open_channel(target, token=token, tls=tls)
        self.stub = gateway_pb2_grpc.GatewayServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, method: str, request: object, timeout: float | None = None):
        fn = getattr(self.stub, method)
        return call_with_retry(lambda: fn(request, timeout=timeout or self.timeout))

    # ---- runs ----------------------------------------------------------------------------------------

    def create_run(self, config_text: str, run_id: str = "") -> gateway_pb2.Run:
        # One request id for every retry of this call: the gateway creates one run for all of them.
        request = gateway_pb2.CreateRunRequest(config_yaml=config_text, run_id=run_id, request_id=uuid.uuid4().hex)
        return self._call("CreateRun", request)

    def get_run(self, run_id: str) -> gateway_pb2.Run:
        return self._call("GetRun", gateway_pb2.GetRunRequest(run_id=run_id))

    def list_runs(self) -> list[gateway_pb2.Run]:
        return list(self._call("ListRuns", gateway_pb2.ListRunsRequest()).runs)

    def cancel_run(self, run_id: str, reason: str = "") -> gateway_pb2.Run:
        return self._call("CancelRun", gateway_pb2.CancelRunRequest(run_id=run_id, reason=reason))

    def watch(self, run_id: str, after_seq: str = "") -> Iterator[gateway_pb2.RunEvent]:
        """Events until the run ends (the stream closes); no deadline, since runs last long."""
        yield from self.stub.WatchRun(gateway_pb2.WatchRunRequest(run_id=run_id, after_seq=after_seq))

    def report(self, event: gateway_pb2.RunEvent) -> gateway_pb2.ReportEventResponse:
        return self._call("ReportEvent", gateway_pb2.ReportEventRequest(event=event))

    # ---- registry ------------------------------------------------------------------------------------

    def register(self, instance: gateway_pb2.Instance) -> gateway_pb2.RegisterResponse:
        return self._call("Register", gateway_pb2.RegisterRequest(instance=instance))

    def heartbeat(self, instance_id: str, run_id: str = "", stage: int = 0) -> bool:
        request = gateway_pb2.HeartbeatRequest(instance_id=instance_id, run_id=run_id, stage=stage)
        return bool(self.stub.Heartbeat(request, timeout=self.timeout).known)

    def instances(self, service: str = "") -> list[gateway_pb2.Instance]:
        return list(self._call("ListInstances", gateway_pb2.ListInstancesRequest(service=service)).instances)

    # ---- sync groups ---------------------------------------------------------------------------------

    def open_sync_group(self, request: gateway_pb2.OpenSyncGroupRequest) -> gateway_pb2.SyncGroup:
        return self._call("OpenSyncGroup", request)

    def join_sync_group(
        self,
        run_id: str,
        instance_id: str,
        has_gpu: bool,
        host_id: str = "",
        gpu_uuids: Sequence[str] = (),
        ranks: int = 1,
    ) -> gateway_pb2.SyncGroup:
        """`ranks`: the member's engine workers, each a rank of the group (tensor x pipeline parallel)."""
        request = gateway_pb2.JoinSyncGroupRequest(
            run_id=run_id,
            instance_id=instance_id,
            has_gpu=has_gpu,
            host_id=host_id,
            gpu_uuids=list(gpu_uuids),
            ranks=ranks,
        )
        return self._call("JoinSyncGroup", request)

    def sync_group(self, run_id: str) -> gateway_pb2.SyncGroup:
        return self._call("GetSyncGroup", gateway_pb2.GetSyncGroupRequest(run_id=run_id))

    def announce_weights(self, run_id: str, generation: int, version: int) -> gateway_pb2.SyncGroup:
        request = gateway_pb2.AnnounceWeightsRequest(run_id=run_id, generation=generation, version=version)
        return self._call("AnnounceWeights", request)

    def report_sync_failure(self, run_id: str, generation: int, instance_id: str, error: str) -> None:
        request = gateway_pb2.ReportSyncFailureRequest(
            run_id=run_id, generation=generation, instance_id=instance_id, error=error
        )
        self._call("ReportSyncFailure", request)

    def rank_secret(self, run_id: str) -> bytes | None:
        """The secret the trainer ranks of `run_id` prove membership with; None from a gateway without a token."""
        return self._call("GetRankSecret", gateway_pb2.GetRankSecretRequest(run_id=run_id)).secret or None

    def status(self) -> common_pb2.ServiceStatus:
        return self._call("GetStatus", common_pb2.GetStatusRequest())


def sync_spec(group: gateway_pb2.SyncGroup):
    """The negotiated group as the sync layer's spec (the trainer member is rank 0)."""
    from trinity.sync import SyncGroupSpec
    from trinity.sync.spec import TRAINER_MEMBER

    ranks = {TRAINER_MEMBER: 0}
    for member in group.members[1:]:
        # A member with several engine workers holds a rank per worker: its own name for the first, then name#i.
        ranks |= {
            (f"{member.instance_id}#{i}" if i else member.instance_id): member.rank + i
            for i in range(member.ranks or 1)
        }
    return SyncGroupSpec.model_validate(  # validates the negotiated backend name too
        {
            "name": group.run_id.replace("/", "_")[:120],
            "generation": group.generation,
            "backend": group.backend,
            "host": group.host or "127.0.0.1",
            "port": group.port,
            "world_size": group.world_size,
            "ranks": ranks,
            "timeout_s": group.timeout_seconds,
            "join_timeout_s": max(group.timeout_seconds, 60.0),
            "bucket_mb": group.bucket_mb,
            "checkpoint_dir": group.checkpoint_dir or None,
            "secret": group.secret or None,
        }
    )


class RunReporter:
    """A service's voice in a run's event log. Reporting never raises: a lost event must not stop
    rollouts or training. `report` returns False once the run is over (cancelled or failed elsewhere).

    Spans timed into `spans` ride on the next event reported (docs/console.md, "Timeline"); `phase` announces a
    long phase as it begins and ends."""

    def __init__(self, gateway: GatewayClient, run_id: str, source: str, stage: int) -> None:
        self.gateway = gateway
        self.run_id = run_id
        self.source = source
        self.stage = stage
        self.spans = SpanLog()

    def report(
        self,
        kind: gateway_pb2.EventKind,
        *,
        step: int,
        model_version: int,
        message: str = "",
        metrics: dict | None = None,
        final_model_path: str = "",
        spans: Sequence[gateway_pb2.Span] = (),
    ) -> bool:
        event = gateway_pb2.RunEvent(
            run_id=self.run_id,
            kind=kind,
            source=self.source,
            step=step,
            model_version=model_version,
            metrics=metrics or {},
            message=message,
            stage=self.stage,
            final_model_path=final_model_path,
            event_id=uuid.uuid4().hex,  # the same across retries of this report
            spans=[*spans, *self.spans.drain()],
        )
        try:
            return bool(self.gateway.report(event).run_active)
        except Exception as err:  # noqa: BLE001 - reporting must not kill the loop that reports
            from trinity.runtime.logging import get_logger

            get_logger(__name__).warning("run.report_failed", kind=kind_name(kind), error=str(err))
            return True

    @contextmanager
    def phase(self, phase: gateway_pb2.Phase, *, step: int, model_version: int, detail: str = "") -> Iterator[None]:
        """A phase people wait on (start-up, evaluation), announced as it begins and as it ends: an EVENT_KIND_SPAN
        each, whose message says what it does ("starting vLLM", "evaluating v0: 160 samples")."""
        span = gateway_pb2.Span(
            phase=phase, step=step, model_version=model_version, start_unix_ms=now_ms(), detail=detail
        )
        self._report_span(span)
        try:
            yield
        finally:
            span.end_unix_ms = max(now_ms(), span.start_unix_ms)
            self._report_span(span)

    def _report_span(self, span: gateway_pb2.Span) -> None:
        self.report(
            gateway_pb2.EVENT_KIND_SPAN,
            step=span.step,
            model_version=span.model_version,
            message=describe(span),
            spans=[span],  # copied into the event: the span may still change (its end)
        )
