"""The Trainer service: run assignment from the Gateway, checkpoints on request, status."""

from __future__ import annotations

import threading
from typing import Any

import grpc

from trinity.config import RunConfig
from trinity.runtime.errors import FailedPrecondition, InvalidArgument, grpc_errors
from trinity.runtime.server import GrpcServer, full_service_name, start_grpc_service
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.status import service_status
from trinity.trainer.runner import TrainerRunner
from trinity.v1 import explorer_pb2, trainer_pb2, trainer_pb2_grpc

SERVICE_NAME = full_service_name(trainer_pb2, "TrainerService")


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, settings: ServiceSettings, port: int = 0) -> None:
        self.settings = settings
        self.port = port
        self.runner: TrainerRunner | None = None
        self._lock = threading.Lock()

    def _status(self) -> Any:
        runner = self.runner
        if runner is None:
            return service_status("trainer", self.settings.instance_id)
        return service_status(
            "trainer",
            self.settings.instance_id,
            state=runner.state,
            run_id=runner.run_id,
            model_version=runner.model_version,
            metrics={"train_step": float(runner.step)},
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
                    return self._status()
                raise FailedPrecondition(f"busy with run {current.run_id!r}; stop it first")
            host = self.settings.advertised_address(self.port).rpartition(":")[0]
            self.runner = TrainerRunner(
                run_id=request.run_id,
                stage=request.stage,
                config=config,
                instance_id=self.settings.instance_id,
                buffer_address=request.buffer_address,
                gateway_address=request.gateway_address,
                advertise_host=host,
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
    def SaveCheckpoint(self, request: trainer_pb2.SaveCheckpointRequest, context: grpc.ServicerContext) -> Any:
        runner = self.runner
        if runner is None or runner.backend is None:
            raise FailedPrecondition("no run is training")
        path = runner.backend.save_checkpoint()
        return trainer_pb2.SaveCheckpointResponse(path=str(path), step=runner.step)

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._status()

    def shutdown(self) -> None:
        runner = self.runner
        if runner is not None:
            runner.stop("service shutting down")
            runner.join(timeout=60)


def start_trainer(settings: ServiceSettings) -> GrpcServer:
    servicer = TrainerServicer(settings)
    server = start_grpc_service(
        settings,
        servicer,
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        SERVICE_NAME,
        on_shutdown=servicer.shutdown,
    )
    servicer.port = server.port
    return server
