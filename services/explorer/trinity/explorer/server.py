"""The Explorer service: run assignment from the Gateway, direct generation, status."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

import grpc

from trinity.config import RunConfig
from trinity.explorer.engines.base import Engine, GenerationRequest, SamplingSettings
from trinity.explorer.openai_api import is_request_error
from trinity.explorer.runner import ExplorerRunner
from trinity.runtime.errors import (
    FailedPrecondition,
    InvalidArgument,
    at_most,
    bounded,
    grpc_errors,
    in_range,
    require,
)
from trinity.runtime.limits import (
    MAX_GENERATE_SAMPLES,
    MAX_ITEMS,
    MAX_PROMPT_CHARS,
    MAX_STOP_STRINGS,
    MIN_TEMPERATURE,
)
from trinity.runtime.logging import get_logger
from trinity.runtime.run_host import ACTIVE, RunHost
from trinity.runtime.server import GrpcServer, full_service_name, start_grpc_service
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.steering import EXPLORER_KNOBS, check_steerable, check_steering
from trinity.v1 import common_pb2, explorer_pb2, explorer_pb2_grpc

SERVICE_NAME = full_service_name(explorer_pb2, "ExplorerService")
log = get_logger(__name__)


def _explorer_metrics(runner: ExplorerRunner) -> dict[str, float]:
    metrics = {"explore_step": float(runner.step), "exploration_paused": float(runner.steering.holding)}
    if runner.openai_url:  # serve mode: the OpenAI endpoint's port (its URL is in the run's "log" event)
        metrics["openai_port"] = float(urlsplit(runner.openai_url).port or 0)
    return metrics


def _check_generate(request: explorer_pb2.GenerateRequest) -> None:
    """Everything about a Generate request that can be checked without a model."""
    if bool(request.prompt) == bool(request.messages):
        raise InvalidArgument("prompt", "give exactly one of prompt or messages")
    bounded(request.prompt, "prompt", MAX_PROMPT_CHARS)
    at_most(request.messages, "messages", MAX_ITEMS)
    for i, m in enumerate(request.messages):
        bounded(m.role, f"messages[{i}].role")
        bounded(m.content, f"messages[{i}].content", MAX_PROMPT_CHARS)
    if not 0 <= request.n <= MAX_GENERATE_SAMPLES:
        raise InvalidArgument("n", f"must be between 1 and {MAX_GENERATE_SAMPLES} (0 = 1), got {request.n}")
    in_range(request.temperature, "temperature", 0, math.inf)
    if 0 < request.temperature < MIN_TEMPERATURE:
        raise InvalidArgument("temperature", f"must be 0 (greedy) or at least {MIN_TEMPERATURE:g}")
    if request.top_p and not 0 < request.top_p <= 1:  # NaN fails too
        raise InvalidArgument("top_p", f"must be in (0, 1] (0 = 1), got {request.top_p}")
    if request.top_k < -1:
        raise InvalidArgument("top_k", f"must be >= 1, or 0 / -1 for all tokens, got {request.top_k}")
    if request.max_tokens < 0:
        raise InvalidArgument("max_tokens", f"must be >= 1 (0 = model.max_response_tokens), got {request.max_tokens}")
    at_most(request.stop, "stop", MAX_STOP_STRINGS)
    for i, stop in enumerate(request.stop):
        bounded(stop, f"stop[{i}]")


def _sampling(request: explorer_pb2.GenerateRequest, config: RunConfig) -> SamplingSettings:
    """A checked request's sampling settings; zero fields take the defaults (max_tokens: the run's)."""
    return SamplingSettings(
        temperature=request.temperature,
        top_p=request.top_p or 1.0,
        top_k=request.top_k or -1,
        max_tokens=request.max_tokens or config.model.max_response_tokens,
        stop=tuple(request.stop),
    )


def _prompt_tokens(engine: Engine, request: explorer_pb2.GenerateRequest) -> list[int]:
    messages = [{"role": m.role, "content": m.content} for m in request.messages] or None
    try:
        return engine.encode_prompt(GenerationRequest(prompt=request.prompt or None, messages=messages))
    except Exception as err:  # noqa: BLE001 - a chat template that refuses the chat is the caller's error
        raise InvalidArgument("messages", f"the chat template failed: {err}") from None


def _context_tokens(config: RunConfig) -> int:
    """Prompt plus response tokens the run's engine holds (vLLM's max_model_len, or the run's budgets)."""
    model = config.model
    limit: int | None = getattr(config.explorer.engine_options, "max_model_len", None)
    return limit or model.max_prompt_tokens + model.max_response_tokens


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
        _check_generate(request)
        runner = self.runner
        engine = runner.engine if runner is not None and runner.state == "running" else None
        if runner is None or engine is None:
            raise FailedPrecondition("no model is loaded: the explorer serves the model of its current run")
        sampling = _sampling(request, runner.config)
        prompt = _prompt_tokens(engine, request)
        context_tokens = _context_tokens(runner.config)
        if len(prompt) + sampling.max_tokens > context_tokens:
            raise InvalidArgument(
                "prompt",
                f"{len(prompt)} prompt tokens + max_tokens {sampling.max_tokens} exceed the run's context of "
                f"{context_tokens} tokens; shorten the prompt or lower max_tokens",
            )
        generation = GenerationRequest(prompt_token_ids=prompt, n=request.n or 1, sampling=sampling)
        try:
            (result,) = engine.generate([generation])
        except Exception as err:
            if not is_request_error(err):
                raise
            raise InvalidArgument("", f"the engine refused the request: {err}") from None
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

    @grpc_errors
    def Steer(self, request: common_pb2.SteerRequest, context: grpc.ServicerContext) -> Any:
        steering = request.steering
        knobs = check_steering(steering, owned=EXPLORER_KNOBS)
        runner = self.runner
        if runner is None or runner.run_id != require(request.run_id, "run_id") or runner.state not in ACTIVE:
            raise FailedPrecondition(f"this explorer is not exploring run {request.run_id!r}")
        check_steerable(runner.config.mode, knobs)
        source = f"explorer/{self.settings.instance_id}"
        changes = runner.steering.apply(steering, runner.config.explorer.temperature)
        for knob, old, new in changes:
            log.info("explorer.steered", run_id=runner.run_id, knob=knob, old=old, new=new)
        return common_pb2.SteerResponse(
            changes=[common_pb2.SteerChange(knob=k, old_value=o, new_value=n, source=source) for k, o, n in changes]
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
        current_run=servicer.host.current_run,
    )
    return servicer.server
