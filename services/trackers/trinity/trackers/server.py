"""Start the trackers service (`trinity serve trackers`): the sink, a client of the gateway, in a process with the
bootstrap every service has (gRPC health and reflection, Prometheus metrics, SIGTERM drain). It serves no RPC of
its own: nothing calls it, and it registers with no one (the gateway assigns it no work)."""

from __future__ import annotations

import os
from pathlib import Path

from trinity.clients.gateway import GatewayClient
from trinity.runtime.server import GrpcServer, ServiceRegistration
from trinity.runtime.settings import ServiceSettings
from trinity.trackers.sink import TrackerSink


def drop_empty_tracker_variables() -> None:
    """Compose passes a tracker setting it was not given as an empty variable (`WANDB_MODE: ${WANDB_MODE:-}`); the
    libraries read those as values (wandb refuses an empty mode): empty means unset."""
    for name in [n for n, v in os.environ.items() if n.startswith(("MLFLOW_", "WANDB_")) and not v]:
        del os.environ[name]


def start_trackers(settings: ServiceSettings) -> GrpcServer:
    if not settings.gateway:
        raise ValueError("the trackers follow the gateway's runs: set TRINITY_GATEWAY (host:port)")
    drop_empty_tracker_variables()
    root = Path(settings.trackers_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    gateway = GatewayClient(settings.gateway, timeout=10)
    sink = TrackerSink(gateway, root, instance_id=settings.instance_id)

    def shutdown() -> None:
        sink.stop(settings.drain_seconds)
        gateway.close()

    registration = ServiceRegistration(add_to_server=lambda _server: None, service_names=[], on_shutdown=shutdown)
    server = GrpcServer(settings, registration).start()
    sink.start()
    return server
