"""Typed clients over the Gateway, in a blocking and an asyncio flavour."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc

from trinity.config.run import load_config_yaml
from trinity.runtime.client import open_async_channel, open_channel
from trinity.runtime.settings import auth_token
from trinity.runtime.tls import TlsSettings
from trinity.sdk.errors import GatewayUnavailable, TrinityError, translate
from trinity.sdk.metrics import RunMetrics
from trinity.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

TERMINAL = {gateway_pb2.RUN_STATE_SUCCEEDED, gateway_pb2.RUN_STATE_FAILED, gateway_pb2.RUN_STATE_CANCELLED}
DEFAULT_GATEWAY = "127.0.0.1:50051"


def _create_request(config: str | Path | dict[str, Any], run_id: str, priority: int) -> gateway_pb2.CreateRunRequest:
    """A CreateRun with a request id of its own: gRPC retries a call whose connection dropped (retry policy of
    `trinity.runtime.client`), and the gateway answers the retry with the run the first attempt created."""
    return gateway_pb2.CreateRunRequest(
        config_yaml=config_text(config), run_id=run_id, request_id=uuid.uuid4().hex, priority=priority
    )


def config_text(config: str | Path | dict[str, Any]) -> str:
    """A run config given as a dict, a YAML/JSON file path, or YAML text."""
    if isinstance(config, dict):
        return json.dumps(config)
    if isinstance(config, Path) or (
        isinstance(config, str) and "\n" not in config and config.endswith((".yaml", ".yml", ".json"))
    ):
        path = Path(config)
        if not path.exists():
            raise TrinityError(f"config file {path} does not exist")
        from trinity.config import load_run_config

        # Relative data paths in a file are relative to the file; the gateway may run elsewhere.
        return load_run_config(path).model_dump_json()
    load_config_yaml(config)  # a syntax error, an alias or an oversized text is reported here, before the round trip
    return str(config)


class RunHandle:
    def __init__(self, client: TrinityClient, run_id: str) -> None:
        self.client = client
        self.id = run_id

    def status(self) -> gateway_pb2.Run:
        return self.client._call("GetRun", gateway_pb2.GetRunRequest(run_id=self.id))

    def watch(self, after_seq: str = "", *, reconnect_seconds: float = 120.0) -> Iterator[gateway_pb2.RunEvent]:
        """Events from the start (or after `after_seq`) until the run ends.

        A lost gateway (UNAVAILABLE: it is restarting, or its Redis is) does not end the watch: it is opened
        again after the last event seen, so no event comes twice or goes missing, as long as the gateway
        answers again within `reconnect_seconds`; GatewayUnavailable otherwise.
        """
        seen = after_seq
        lost_since: float | None = None
        while True:
            try:
                for event in self.client.stub.WatchRun(gateway_pb2.WatchRunRequest(run_id=self.id, after_seq=seen)):
                    seen, lost_since = event.seq, None
                    yield event
                return
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise translate(err, self.client.target) from None
                lost_since = lost_since or time.monotonic()
                left = lost_since + reconnect_seconds - time.monotonic()
                if left > 0:
                    # The pause keeps a gateway whose Redis is down (its channel stays READY) from being asked
                    # in a tight loop; a gateway that is down is waited for with gRPC's reconnection back-off.
                    time.sleep(min(1.0, left))
                    try:
                        grpc.channel_ready_future(self.client._channel).result(timeout=max(0.0, left - 1.0))
                        continue
                    except grpc.FutureTimeoutError:
                        pass
                raise GatewayUnavailable(
                    f"lost the gateway at {self.client.target} while watching run {self.id}: no answer for "
                    f"{reconnect_seconds:.0f}s"
                ) from None

    def metrics(self, snapshot_seconds: float = 2.0) -> RunMetrics:
        """Every metric reported so far; for a live run, what arrives within `snapshot_seconds`."""
        metrics = RunMetrics()
        call = self.client.stub.WatchRun(gateway_pb2.WatchRunRequest(run_id=self.id), timeout=snapshot_seconds)
        try:
            for event in call:
                metrics.add(event)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise translate(err, self.client.target) from None
        return metrics

    def spans(self, since_step: int = 0) -> list[gateway_pb2.Span]:
        """The run's timeline from step `since_step` on: what each service did when (TrinityClient.spans)."""
        return self.client.spans(self.id, since_step)

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> gateway_pb2.Run:
        """The run once it has ended; a gateway that does not answer is asked again until `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                run = self.status()
            except GatewayUnavailable:
                if deadline is not None and time.monotonic() > deadline:
                    raise
            else:
                if run.state in TERMINAL:
                    return run
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"run {self.id} still {gateway_pb2.RunState.Name(run.state)} after {timeout}s")
            time.sleep(poll)

    def cancel(self, reason: str = "cancelled by user") -> gateway_pb2.Run:
        return self.client._call("CancelRun", gateway_pb2.CancelRunRequest(run_id=self.id, reason=reason))

    def scale(self, explorers: int) -> gateway_pb2.Run:
        """Have the live run use `explorers` explorers (TrinityClient.scale_run)."""
        return self.client.scale_run(self.id, explorers)

    def pause(self, reason: str = "paused by user") -> gateway_pb2.Run:
        """Stop the run's services after a checkpoint, freeing them (TrinityClient.pause_run)."""
        return self.client.pause_run(self.id, reason)

    def resume(self) -> gateway_pb2.Run:
        """Queue the paused run again (TrinityClient.resume_run)."""
        return self.client.resume_run(self.id)

    def steer(
        self,
        *,
        pause_exploration: bool | None = None,
        temperature: float | None = None,
        learning_rate: float | None = None,
    ) -> gateway_pb2.SteerRunResponse:
        """Change knobs of the live run (docs/console.md, "Steering"); None leaves a knob as it is."""
        return self.client.steer_run(
            self.id, pause_exploration=pause_exploration, temperature=temperature, learning_rate=learning_rate
        )


class TrinityClient:
    def __init__(
        self,
        gateway: str = DEFAULT_GATEWAY,
        *,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        tls_server_name: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        """`token` and the TLS settings default to TRINITY_AUTH_TOKEN and TRINITY_TLS_CA/_CERT/_KEY/_SERVER_NAME.
        With a CA (a PEM path) the gateway is dialled over TLS; with a certificate and its key the client can also
        prove who it is to a gateway that requires mutual TLS; `tls_server_name` is the name to verify in the
        gateway's certificate when it is not the host dialled (docs/security.md)."""
        self.target = gateway
        self.timeout = timeout
        tls = TlsSettings.from_env(ca=tls_ca, cert=tls_cert, key=tls_key, server_name=tls_server_name)
        self._channel = open_channel(gateway, token=token, tls=tls)
        self.stub = gateway_pb2_grpc.GatewayServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> TrinityClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as err:
            raise translate(err, self.target) from None

    def create_run(self, config: str | Path | dict[str, Any], run_id: str = "", priority: int = 0) -> RunHandle:
        """Queue a run: pending runs start by `priority` (0-100, higher first; at most the token's tenant's
        `max_priority`), then in the order they came (docs/tenants.md). QuotaExceeded beyond the tenant's quotas,
        NotPermitted above its max_priority, InvalidRequest for a bad config or a priority out of 0-100."""
        run = self._call("CreateRun", _create_request(config, run_id, priority))
        return RunHandle(self, run.id)

    def run(self, run_id: str) -> RunHandle:
        self._call("GetRun", gateway_pb2.GetRunRequest(run_id=run_id))
        return RunHandle(self, run_id)

    def list_runs(self) -> list[gateway_pb2.Run]:
        return list(self._call("ListRuns", gateway_pb2.ListRunsRequest()).runs)

    def scale_run(self, run_id: str, explorers: int) -> gateway_pb2.Run:
        """Have a RUNNING run use `explorers` explorers from now on (`Run.explorers`): the gateway starts free explorer
        instances on it, or asks the surplus to finish their rollout batch and leave; each change is a run event.
        InvalidRequest for a count out of bounds (naming `explorers`), RunNotFound, RunConflict when the run is not
        running or its stage has no explorers."""
        return self._call("ScaleRun", gateway_pb2.ScaleRunRequest(run_id=run_id, explorers=explorers))

    def pause_run(self, run_id: str, reason: str = "paused by user") -> gateway_pb2.Run:
        """Pause a pending or running run (RUN_STATE_PAUSED): its trainer checkpoints after the step in progress,
        its explorers put their rollout batch, and each service is freed for other runs as it stops; the run is
        paused once `assignments` is empty. A paused run pauses again as a no-op. RunNotFound, RunConflict when the
        run has ended, is starting its services, or has finished training."""
        return self._call("PauseRun", gateway_pb2.PauseRunRequest(run_id=run_id, reason=reason))

    def resume_run(self, run_id: str) -> gateway_pb2.Run:
        """Queue a paused run again (PENDING): it starts when its services are free, from the checkpoint its pause
        wrote, its weight versions going on increasing. RunConflict when it is not paused or still pausing."""
        return self._call("ResumeRun", gateway_pb2.ResumeRunRequest(run_id=run_id))

    def steer_run(
        self,
        run_id: str,
        *,
        pause_exploration: bool | None = None,
        temperature: float | None = None,
        learning_rate: float | None = None,
    ) -> gateway_pb2.SteerRunResponse:
        """Change knobs of a RUNNING run: InvalidRequest for a value out of bounds (naming the field), RunConflict
        when the run cannot take it (not running, a serve run's temperature, a Megatron trainer's learning rate)."""
        steering = common_pb2.Steering(
            pause_exploration=pause_exploration, temperature=temperature, learning_rate=learning_rate
        )
        return self._call("SteerRun", gateway_pb2.SteerRunRequest(run_id=run_id, steering=steering))

    def instances(self, service: str = "") -> list[gateway_pb2.Instance]:
        """The services registered with the gateway (all, or of one service), with their liveness."""
        return list(self._call("ListInstances", gateway_pb2.ListInstancesRequest(service=service)).instances)

    def spans(self, run_id: str, since_step: int = 0) -> list[gateway_pb2.Span]:
        """A run's timeline from step `since_step` on, in order of start: each `Span` names a phase (PHASE_ROLLOUT,
        PHASE_FORWARD_BACKWARD, ...; `trinity.runtime.spans.phase_name` says "rollout"), the service that ran it
        (`source`), its step and weight version, and when it began and ended (unix ms). Start-up phases have step 0.
        The gateway keeps a run's newest spans by step (about the last 800 steps; docs/console.md, "Timeline")."""
        request = gateway_pb2.GetRunSpansRequest(run_id=run_id, since_step=since_step)
        return list(self._call("GetRunSpans", request).spans)


class AsyncRunHandle:
    def __init__(self, client: AsyncTrinityClient, run_id: str) -> None:
        self.client = client
        self.id = run_id

    async def status(self) -> gateway_pb2.Run:
        return await self.client._call("GetRun", gateway_pb2.GetRunRequest(run_id=self.id))

    async def watch(self, after_seq: str = "") -> AsyncIterator[gateway_pb2.RunEvent]:
        try:
            request = gateway_pb2.WatchRunRequest(run_id=self.id, after_seq=after_seq)
            async for event in self.client.stub.WatchRun(request, metadata=self.client._metadata):
                yield event
        except grpc.RpcError as err:
            raise translate(err, self.client.target) from None

    async def wait(self, timeout: float | None = None, poll: float = 1.0) -> gateway_pb2.Run:
        import asyncio

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = await self.status()
            if run.state in TERMINAL:
                return run
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} still {gateway_pb2.RunState.Name(run.state)} after {timeout}s")
            await asyncio.sleep(poll)

    async def cancel(self, reason: str = "cancelled by user") -> gateway_pb2.Run:
        return await self.client._call("CancelRun", gateway_pb2.CancelRunRequest(run_id=self.id, reason=reason))

    async def scale(self, explorers: int) -> gateway_pb2.Run:
        """Have the live run use `explorers` explorers (TrinityClient.scale_run)."""
        request = gateway_pb2.ScaleRunRequest(run_id=self.id, explorers=explorers)
        return await self.client._call("ScaleRun", request)

    async def pause(self, reason: str = "paused by user") -> gateway_pb2.Run:
        """Stop the run's services after a checkpoint, freeing them (TrinityClient.pause_run)."""
        return await self.client._call("PauseRun", gateway_pb2.PauseRunRequest(run_id=self.id, reason=reason))

    async def resume(self) -> gateway_pb2.Run:
        """Queue the paused run again (TrinityClient.resume_run)."""
        return await self.client._call("ResumeRun", gateway_pb2.ResumeRunRequest(run_id=self.id))

    async def spans(self, since_step: int = 0) -> list[gateway_pb2.Span]:
        """The run's timeline from step `since_step` on (TrinityClient.spans)."""
        request = gateway_pb2.GetRunSpansRequest(run_id=self.id, since_step=since_step)
        return list((await self.client._call("GetRunSpans", request)).spans)


class AsyncTrinityClient:
    def __init__(
        self,
        gateway: str = DEFAULT_GATEWAY,
        *,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        tls_server_name: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        """The arguments of `TrinityClient`."""
        self.target = gateway
        self.timeout = timeout
        token = auth_token(token)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        tls = TlsSettings.from_env(ca=tls_ca, cert=tls_cert, key=tls_key, server_name=tls_server_name)
        self._channel = open_async_channel(gateway, tls=tls)
        self.stub = gateway_pb2_grpc.GatewayServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncTrinityClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self.stub, method)(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise translate(err, self.target) from None

    async def create_run(
        self, config: str | Path | dict[str, Any], run_id: str = "", priority: int = 0
    ) -> AsyncRunHandle:
        """As TrinityClient.create_run."""
        run = await self._call("CreateRun", _create_request(config, run_id, priority))
        return AsyncRunHandle(self, run.id)

    async def list_runs(self) -> list[gateway_pb2.Run]:
        return list((await self._call("ListRuns", gateway_pb2.ListRunsRequest())).runs)
