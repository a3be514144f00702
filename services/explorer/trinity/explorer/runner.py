"""One explorer's part of a run: load the engine, then run the run's mode on a shared context.

The runner owns the lifecycle (a thread, start / stop / join, the `finished` or `error` event); what
a mode does lives in its own module (`rollout`, `bench`, `serve`), each a function of an
`ExplorerContext`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from trinity.clients import BufferClient, GatewayClient
from trinity.clients.gateway import RunReporter
from trinity.config import RunConfig
from trinity.config.explorer import TransformersEngineOptions, VllmEngineOptions
from trinity.config.modes import RunMode
from trinity.explorer import bench, rollout, serve
from trinity.explorer.context import EngineFailure, ExplorerContext, engine_guard
from trinity.explorer.engines import create_engine
from trinity.explorer.engines.base import Engine
from trinity.explorer.steering import Steering
from trinity.models import BUILTIN_MODELS, resolve_model_path
from trinity.runtime.errors import one_line
from trinity.runtime.logging import get_logger
from trinity.v1 import explorer_pb2, gateway_pb2

log = get_logger(__name__)

Mode = Callable[[ExplorerContext], str]  # runs the mode; returns the `finished` event's message
# Reasons to leave the run mid-way, which goes on elsewhere: the leased tasks go back, the run does not end here.
LEAVE = {
    explorer_pb2.STOP_REASON_SHUTDOWN: "explorer shutting down",
    explorer_pb2.STOP_REASON_SCALED_DOWN: "explorer leaving: the run wants fewer explorers",
    explorer_pb2.STOP_REASON_PAUSED: "explorer leaving: the run is paused",
}
ABANDON = (explorer_pb2.STOP_REASON_CANCELLED, explorer_pb2.STOP_REASON_FAILED, *LEAVE)
MODES: dict[RunMode, Mode] = {
    RunMode.BOTH: rollout.run,
    RunMode.EXPLORE: rollout.run,
    RunMode.BENCH: bench.run,
    RunMode.SERVE: serve.run,
}
ENGINE_LABELS = {"vllm": "vLLM"}  # engine names as the start-up phase says them ("starting vLLM")


def on_gpu(config: RunConfig) -> bool:
    """Whether the run's engine samples on a GPU: vLLM where torch sees CUDA (its GPU build), the transformers engine
    where its `device` says so."""
    options = config.explorer.engine_options
    if isinstance(options, TransformersEngineOptions):
        return options.device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


def engine_settings(config: RunConfig, model_path: str, *, gpu: bool) -> dict[str, Any]:
    """The run's engine settings: `explorer.engine_options`, the run's seed and token limits, and the device's
    defaults for what the options leave unset: bfloat16 and (vLLM) CUDA graphs on a GPU; `config.engine_dtype` (the
    dtype the trainer publishes in) and eager mode on a CPU."""
    options = config.explorer.engine_options
    settings: dict[str, Any] = {
        "model_path": model_path,
        "seed": config.seed,
        **options.model_dump(exclude_none=True),  # unset options keep these defaults
        "dtype": options.dtype or ("bfloat16" if gpu else config.engine_dtype),
    }
    if isinstance(options, VllmEngineOptions):
        model = config.model
        settings.setdefault("max_model_len", model.max_prompt_tokens + model.max_response_tokens)
        settings.setdefault("enforce_eager", not gpu)
    return settings


def build_engine(config: RunConfig, model_path: str) -> Engine:
    """The run's engine, built from `engine_settings` for the device it samples on (logged as `explorer.engine`)."""
    gpu = on_gpu(config)
    settings = engine_settings(config, model_path, gpu=gpu)
    log.info(
        "explorer.engine",
        engine=config.explorer.engine,
        device="gpu" if gpu else "cpu",
        dtype=settings["dtype"],
        enforce_eager=settings.get("enforce_eager"),
    )
    return create_engine(config.explorer.engine, **settings)


class ExplorerRunner:
    def __init__(
        self,
        *,
        run_id: str,
        stage: int,
        config: RunConfig,
        instance_id: str,
        buffer_address: str,
        gateway_address: str,
        engine_factory: Callable[[RunConfig, str], Engine] = build_engine,
        on_engine_failure: EngineFailure | None = None,
    ) -> None:
        self.run_id = run_id
        self.stage = stage
        self.config = config
        self.instance_id = instance_id
        self.engine_factory = engine_factory
        self.on_engine_failure = on_engine_failure
        self.buffer = BufferClient(buffer_address, timeout=120)
        self.gateway = GatewayClient(gateway_address, timeout=30)
        self.reporter = RunReporter(self.gateway, run_id, f"explorer/{instance_id}", stage)
        self.context: ExplorerContext | None = None  # once the engine is loaded
        self.steering = Steering()  # before the context: a run may be steered while its engine loads
        self.state = "starting"
        self.finish_message = ""
        self._stop = threading.Event()
        self._leaving = ""  # why it leaves a run that goes on elsewhere (LEAVE): shutting down, or scaled down
        self._abandon = threading.Event()  # stopping with no wrap-up (see ExplorerContext.abandoned)
        self._training_finished = threading.Event()  # serving on past the last step (see ExplorerContext)
        self._thread = threading.Thread(target=self._main, name=f"explorer-{run_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, reason: explorer_pb2.StopReason, detail: str = "") -> None:
        log.info("explorer.stopping", run_id=self.run_id, reason=explorer_pb2.StopReason.Name(reason), detail=detail)
        if reason == explorer_pb2.STOP_REASON_TRAINING_FINISHED and self.config.explorer.keep_serving_after_last_step:
            self._training_finished.set()  # the endpoint serves on until the run is stopped
            return
        self._leaving = self._leaving or LEAVE.get(reason, "")  # a later stop does not take a departure back
        if reason in ABANDON:
            self._abandon.set()
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # What the service reports (status, Generate) reads the context once there is one.

    @property
    def engine(self) -> Engine | None:
        return self.context.engine if self.context is not None else None

    @property
    def model_version(self) -> int:
        return self.context.model_version if self.context is not None else 0

    @property
    def step(self) -> int:
        return self.context.step if self.context is not None else 0

    @property
    def openai_url(self) -> str:
        return self.context.openai_url if self.context is not None else ""

    def _main(self) -> None:
        try:
            self.finish_message = self._run()
            if self._leaving:  # its leased tasks go back to the queue; a replacement takes its place
                self.state = "stopped"
                self._report_end(gateway_pb2.EVENT_KIND_LEAVING, self._leaving)
            else:
                self.state = "finished"
                self._report_end(gateway_pb2.EVENT_KIND_FINISHED, self.finish_message)
        except Exception as err:
            log.exception("explorer.failed", run_id=self.run_id)
            self.state = "failed"
            self._report_end(gateway_pb2.EVENT_KIND_ERROR, one_line(err))
        finally:
            if self.context is not None:
                self.context.close()
            self.buffer.close()

    def _run(self) -> str:
        mode = MODES.get(self.config.mode)
        if mode is None:
            raise ValueError(f"mode {self.config.mode!r} has no explorer part (explorer modes: {', '.join(MODES)})")
        model_path = self._model_dir()
        name = self.config.explorer.engine
        start = self.reporter.phase(
            gateway_pb2.PHASE_ENGINE_START, step=0, model_version=0, detail=ENGINE_LABELS.get(name, name)
        )
        with engine_guard(self.on_engine_failure), start:
            engine = self.engine_factory(self.config, model_path)
        self.context = ExplorerContext(
            run_id=self.run_id,
            stage=self.stage,
            config=self.config,
            instance_id=self.instance_id,
            engine=engine,
            buffer=self.buffer,
            gateway=self.gateway,
            reporter=self.reporter,
            stop=self._stop,
            abandon=self._abandon,
            training_finished=self._training_finished,
            on_engine_failure=self.on_engine_failure,
            steering=self.steering,
        )
        self.state = "running"
        return mode(self.context)

    def _model_dir(self) -> str:
        """The model directory; a built-in model is converted on its first use here (a start-up phase)."""
        path = self.config.model.path
        if path not in BUILTIN_MODELS:
            return resolve_model_path(path)
        with self.reporter.phase(gateway_pb2.PHASE_MODEL_CONVERT, step=0, model_version=0, detail=path):
            return resolve_model_path(path)

    def _report_end(self, kind: gateway_pb2.EventKind, message: str) -> None:
        self.reporter.report(kind, step=self.step, model_version=self.model_version, message=message)
