"""The Explorer service: run assignment from the Gateway, direct generation, status."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

import grpc

from trinity.config import RunConfig
from trinity.explorer.engines.base import GenerationRequest, SamplingSettings
from trinity.explorer.runner import ExplorerRunner
from trinity.runtime.errors import FailedPrecondition, InvalidArgument, grpc_errors
from trinity.runtime.server import GrpcServer, full_service_name, start_grpc_service
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.status import service_status
from trinity.v1 import explorer_pb2, explorer_pb2_grpc

SERVICE_NAME = full_service_name(explorer_pb2, "ExplorerService")


class ExplorerServicer(explorer_pb2_grpc.ExplorerServiceServicer):
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.runner: ExplorerRunner | None = None
        self._lock = threading.Lock()

    def _status(self) -> Any:
        runner = self.runner
        if runner is None:
            return service_status("explorer", self.settings.instance_id)
        return service_status(
            "explorer",
            self.settings.instance_id,
            state=runner.state,
            run_id=runner.run_id,
            model_version=runner.model_version,
            metrics={
                "explore_step": float(runner.step),
                # serve mode: the OpenAI endpoint's port (its URL is in the run's "log" event)
                **({"openai_port": float(urlsplit(runner.openai_url).port or 0)} if runner.openai_url else {}),
            },
        )

    @grpc_errors
    def StartRun(self, request: explorer_pb2.StartRunRequest, context: grpc.ServicerContext) -> Any:
        if not request.run_id:
            raise InvalidArgument("run_id", "must be set")
        config = RunConfig.model_validate_json(request.config_json)
        with self._lock:
            current = self.runner
            if current is not None and current.state in ("starting", "running"):
                if current.run_id == request.run_id and current.stage == request.stage:
                    return self._status()  # a retried assignment
                raise FailedPrecondition(f"busy with run {current.run_id!r}; stop it first")
            self.runner = ExplorerRunner(
                run_id=request.run_id,
                stage=request.stage,
                config=config,
                instance_id=self.settings.instance_id,
                buffer_address=request.buffer_address,
                gateway_address=request.gateway_address,
            )
            self.runner.start()
        return self._status()

    @grpc_errors
    def StopRun(self, request: explorer_pb2.StopRunRequest, context: grpc.ServicerContext) -> Any:
        runner = self.runner
        if runner is not None and (not request.run_id or runner.run_id == request.run_id):
            runner.stop(request.reason)
        return self._status()

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
        return self._status()

    def shutdown(self) -> None:
        if self.runner is not None:
            self.runner.stop("service shutting down")
            self.runner.join(timeout=30)


def start_explorer(settings: ServiceSettings) -> GrpcServer:
    servicer = ExplorerServicer(settings)
    return start_grpc_service(
        settings,
        servicer,
        explorer_pb2_grpc.add_ExplorerServiceServicer_to_server,
        SERVICE_NAME,
        on_shutdown=servicer.shutdown,
    )
