"""The Trainer service: run assignment from the Gateway, checkpoints on request, status."""

from __future__ import annotations

from typing import Any

import grpc

from trinity.config import RunConfig
from trinity.runtime.errors import FailedPrecondition, grpc_errors, require
from trinity.runtime.run_host import ACTIVE, RunHost
from trinity.runtime.server import GrpcServer, full_service_name, start_grpc_service
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.steering import TRAINER_KNOBS, check_steering
from trinity.trainer.backend import SteeringUnsupported
from trinity.trainer.runner import TrainerRunner
from trinity.v1 import common_pb2, explorer_pb2, trainer_pb2, trainer_pb2_grpc

SERVICE_NAME = full_service_name(trainer_pb2, "TrainerService")


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, settings: ServiceSettings, port: int = 0) -> None:
        self.settings = settings
        self.port = port
        self.host = RunHost("trainer", settings.instance_id, self._make_runner, lambda r: {"train_step": float(r.step)})

    @property
    def runner(self) -> TrainerRunner | None:
        runner: TrainerRunner | None = self.host.runner  # RunHost holds whatever `_make_runner` built
        return runner

    def _make_runner(self, request: explorer_pb2.StartRunRequest, config: RunConfig) -> TrainerRunner:
        return TrainerRunner(
            run_id=request.run_id,
            stage=request.stage,
            config=config,
            instance_id=self.settings.instance_id,
            buffer_address=request.buffer_address,
            gateway_address=request.gateway_address,
            advertise_host=self.settings.advertised_address(self.port).rpartition(":")[0],
            resume_model_version=request.resume_model_version,
        )

    @grpc_errors
    def StartRun(self, request: explorer_pb2.StartRunRequest, context: grpc.ServicerContext) -> Any:
        return self.host.start(request)

    @grpc_errors
    def StopRun(self, request: explorer_pb2.StopRunRequest, context: grpc.ServicerContext) -> Any:
        return self.host.stop(request)

    @grpc_errors
    def SaveCheckpoint(self, request: trainer_pb2.SaveCheckpointRequest, context: grpc.ServicerContext) -> Any:
        runner = self.runner
        if runner is None or runner.backend is None:
            raise FailedPrecondition("no run is training")
        path = runner.backend.save_checkpoint()
        return trainer_pb2.SaveCheckpointResponse(path=str(path), step=runner.step)

    @grpc_errors
    def Steer(self, request: common_pb2.SteerRequest, context: grpc.ServicerContext) -> Any:
        steering = request.steering
        check_steering(steering, owned=TRAINER_KNOBS)
        runner = self.runner
        backend = runner.backend if runner is not None else None
        if runner is None or runner.run_id != require(request.run_id, "run_id") or runner.state not in ACTIVE:
            raise FailedPrecondition(f"this trainer is not training run {request.run_id!r}")
        if backend is None or runner.state != "running":
            raise FailedPrecondition(f"the trainer is still loading run {request.run_id!r}; steer it once it trains")
        try:
            old = runner.steer_learning_rate(backend, steering.learning_rate)
        except SteeringUnsupported as err:
            raise FailedPrecondition(str(err)) from None
        change = common_pb2.SteerChange(
            knob="learning_rate",
            old_value=old,
            new_value=steering.learning_rate,
            source=f"trainer/{self.settings.instance_id}",
        )
        return common_pb2.SteerResponse(changes=[change] if old != steering.learning_rate else [])

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.host.status()

    def shutdown(self) -> None:
        self.host.shutdown(timeout=60)


def start_trainer(settings: ServiceSettings) -> GrpcServer:
    servicer = TrainerServicer(settings)
    server = start_grpc_service(
        settings,
        servicer,
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        SERVICE_NAME,
        on_shutdown=servicer.shutdown,
        current_run=servicer.host.current_run,
    )
    servicer.port = server.port
    return server
