"""Start the Explorer service."""

from __future__ import annotations

from typing import Any

import grpc

from trinity.runtime.server import GrpcServer, full_service_name, start_grpc_service
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.status import service_status
from trinity.v1 import explorer_pb2, explorer_pb2_grpc

SERVICE_NAME = full_service_name(explorer_pb2, "ExplorerService")


class ExplorerServicer(explorer_pb2_grpc.ExplorerServiceServicer):
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        return service_status("explorer", self.settings.instance_id)


def start_explorer(settings: ServiceSettings) -> GrpcServer:
    servicer = ExplorerServicer(settings)
    return start_grpc_service(settings, servicer, explorer_pb2_grpc.add_ExplorerServiceServicer_to_server, SERVICE_NAME)
