"""Start the Gateway: Redis-backed run state, the registry monitor, the servicer."""

from __future__ import annotations

from trinity.gateway.metrics import export_runs
from trinity.gateway.orchestrator import Orchestrator
from trinity.gateway.registry import InstanceRegistry
from trinity.gateway.runs import RunStore
from trinity.gateway.service import TENANT_METHODS, GatewayServicer
from trinity.gateway.sync_groups import SyncGroups
from trinity.runtime.aio import connect_redis_async
from trinity.runtime.redis_server import connect_redis
from trinity.runtime.server import GrpcServer, ServiceRegistration, full_service_name
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.tenants import TenantBook
from trinity.v1 import gateway_pb2, gateway_pb2_grpc

SERVICE_NAME = full_service_name(gateway_pb2, "GatewayService")


def start_gateway(settings: ServiceSettings) -> GrpcServer:
    if not settings.redis_url:
        raise ValueError("the gateway keeps run state in Redis: set TRINITY_REDIS_URL or pass --redis-url")
    client = connect_redis(settings.redis_url)
    # The address services call back on is known once the server has bound its port.
    waits = connect_redis_async(settings.redis_url)
    runs = RunStore(client, waits)
    export_runs(runs)
    tenants = TenantBook(settings.tenants_file)
    orchestrator = Orchestrator(
        runs,
        InstanceRegistry(client, liveness_seconds=settings.liveness_seconds),
        SyncGroups(client, issue_secrets=settings.auth_token is not None),
        recovery_seconds=settings.recovery_seconds,
        tenants=tenants,
    )
    servicer = GatewayServicer(orchestrator, settings.instance_id, max_active_runs=settings.max_active_runs)

    def shutdown() -> None:
        orchestrator.stop()
        client.close()

    registration = ServiceRegistration(
        add_to_server=lambda server: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
        service_names=[SERVICE_NAME],
        on_shutdown=shutdown,
        on_shutdown_async=waits.aclose,
        tenants=tenants,
        tenant_methods=frozenset(f"/{SERVICE_NAME}/{method}" for method in TENANT_METHODS),
    )
    server = GrpcServer(settings, registration)
    orchestrator.stages.address = settings.advertised_address(server.port)
    server.start()
    orchestrator.start_monitor()
    return server
