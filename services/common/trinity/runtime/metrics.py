"""Prometheus metrics: one HTTP endpoint per service process."""

from __future__ import annotations

from prometheus_client import start_http_server

from trinity.runtime.logging import get_logger

log = get_logger(__name__)


def start_metrics_server(port: int, host: str = "0.0.0.0") -> int | None:
    """Serve `/metrics` on `port` (0 = pick a free port, -1 = disabled); returns the bound port."""
    if port < 0:
        return None
    server, _thread = start_http_server(port, addr=host)
    bound = int(server.server_port)
    log.info("metrics.serving", port=bound)
    return bound
