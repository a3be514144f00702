"""The Explorer service: run assignment from the Gateway, direct generation, status."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import grpc

from trinity.config import RunConfig
from trinity.explorer.engines.base import GenerationRequest, SamplingSettings
from trinity.explorer.runner import ExplorerRunner
from trinity.runtime.errors import FailedPrecondition, InvalidArgument, grpc_errors
from trinity.runtime.logging import get_logger
from trinity.runtime.run_host import RunHost
from trinity.runtime.server import GrpcServer, full_service_name, start_grpc_service
from trinity.runtime.settings import ServiceSettings
from trinity.v1 import explorer_pb2, explorer_pb2_grpc

SERVICE_NAME = full_service_name(explorer_pb2, "ExplorerService")
log = get_logger(__name__)


def _explorer_metrics(runner: ExplorerRunner) -> dict[str, float]:
    metrics = {"explore_step": float(runner.step)}
    if runner.openai_url:  # serve mode: the OpenAI endpoint's port (its URL is in the run's "log" event)
        metrics["openai_port"] = float(urlsplit(runner.openai_url).port or 0)
    return metrics


class ExplorerServicer(explorer_pb2_grpc.ExplorerServiceServicer):
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.host = RunHost("explorer", settings.instance_id, self._make_runner, _explorer_metrics)
        self.server: GrpcServer | None = None

    def _engine_failed(self, error: str) -> None:
        log.error("engine.failed", error=error)
        if self.server is not None:
            self.server.set_serving(False)

    @property
    def runner(self) -> ExplorerRunner | None:
        runner: ExplorerRunner | None = self.host.runner
        return runner

    def _make_runner(self, request: explorer_pb2.StartRunRequest, config: RunConfig) -> ExplorerRunner:
        if self.server is not None:
            self.server.set_serving(True)  # a new run gets a new engine
        return ExplorerRunner(
            on_engine_failure=self._engine_failed,
            run_id=request.run_id,
            stage=request.stage,
            config=config,
            instance_id=self.settings.instance_id,
            buffer_address=request.buffer_address,
            gateway_address=request.gateway_address,
        )

    @grpc_errors
    def StartRun(self, request: explorer_pb2.StartRunRequest, context: grpc.ServicerContext) -> Any:
        return self.host.start(request)

    @grpc_errors
    def StopRun(self, request: explorer_pb2.StopRunRequest, context: grpc.ServicerContext) -> Any:
        return self.host.stop(request)

    @grpc_errors
    def Generate(self, request: explorer_pb2.GenerateRequest, context: grpc.ServicerContext) -> Any:
        runner = self.runner
        if runner is None or runner.engine is None:
            raise FailedPrecondition("no model is loaded: the explorer serves the model of its current run")
        if bool(request.prompt) == bool(request.messages):
            raise InvalidArgument("prompt", "give exactly one of prompt or messages")
        sampling = SamplingSettings(
            temperature=request.temperature,
            top_p=request.top_p or 1.0,
            top_k=request.top_k or -1,
            max_tokens=request.max_tokens or 128,
            stop=tuple(request.stop),
        )
        generation = GenerationRequest(
            prompt=request.prompt or None,
            messages=[{"role": m.role, "content": m.content} for m in request.messages] or None,
            n=request.n or 1,
            sampling=sampling,
        )
        (result,) = runner.engine.generate([generation])
        return explorer_pb2.GenerateResponse(
            prompt_token_ids=result.prompt_token_ids,
            model_version=result.model_version,
            samples=[
                explorer_pb2.GeneratedSample(
                    text=s.text, token_ids=s.token_ids, logprobs=s.logprobs, finish_reason=s.finish_reason
                )
                for s in result.samples
            ],
        )

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.host.status()

    def shutdown(self) -> None:
        self.host.shutdown(timeout=30)


def start_explorer(settings: ServiceSettings) -> GrpcServer:
    servicer = ExplorerServicer(settings)
    servicer.server = start_grpc_service(
        settings,
        servicer,
        explorer_pb2_grpc.add_ExplorerServiceServicer_to_server,
        SERVICE_NAME,
        on_shutdown=servicer.shutdown,
    )
    return servicer.server
