"""Start the Gateway service."""

from __future__ import annotations

from typing import Any

import grpc

from trinity.runtime.server import GrpcServer, full_service_name, start_grpc_service
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.status import service_status
from trinity.v1 import gateway_pb2, gateway_pb2_grpc

SERVICE_NAME = full_service_name(gateway_pb2, "GatewayService")


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        return service_status("gateway", self.settings.instance_id)


def start_gateway(settings: ServiceSettings) -> GrpcServer:
    servicer = GatewayServicer(settings)
    return start_grpc_service(settings, servicer, gateway_pb2_grpc.add_GatewayServiceServicer_to_server, SERVICE_NAME)
