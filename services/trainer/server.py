"""Start the Trainer service."""

from __future__ import annotations

from typing import Any

import grpc
from trinity.runtime.server import GrpcServer, full_service_name, start_grpc_service
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.status import service_status
from trinity.v1 import trainer_pb2, trainer_pb2_grpc

SERVICE_NAME = full_service_name(trainer_pb2, "TrainerService")


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        return service_status("trainer", self.settings.instance_id)


def start_trainer(settings: ServiceSettings) -> GrpcServer:
    servicer = TrainerServicer(settings)
    return start_grpc_service(settings, servicer, trainer_pb2_grpc.add_TrainerServiceServicer_to_server, SERVICE_NAME)
