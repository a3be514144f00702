"""`trinity-serve <service>`: the one entrypoint every service runs, in a container or under `trinity run`.

A service is found by the `trinity.services` entry point its distribution declares, so an image that
installs only `trinity-buffer` serves only the buffer, and `serve buffer` never imports torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from trinity.config.errors import format_validation_error
from trinity.runtime.logging import configure_logging, get_logger
from trinity.runtime.settings import ServiceSettings

if TYPE_CHECKING:
    from trinity.runtime.server import GrpcServer

SERVICE_GROUP = "trinity.services"
PARENT_ENV = "TRINITY_DIE_WITH_PARENT"
EXIT_BAD_SETTINGS = 2


def installed_services() -> dict[str, str]:
    """Service name -> `module:function` of every installed service distribution."""
    return {ep.name: ep.value for ep in entry_points(group=SERVICE_GROUP)}


def follow_parent() -> None:
    """In a service started by a launcher (TRINITY_DIE_WITH_PARENT=<launcher pid>): get SIGTERM when the
    launcher dies, however it dies (Linux), so a killed `trinity run` leaves no orphaned services.

    Done by the child itself at start-up, not in a fork hook: code between fork and exec in a
    multi-threaded launcher (gRPC threads) can deadlock.
    """
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(parent):  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("service", choices=sorted(installed_services()))
    parser.add_argument("--port", type=int, default=None, help="gRPC port (default TRINITY_PORT or a free one)")
    parser.add_argument("--host", default=None, help="bind address (default TRINITY_HOST or 0.0.0.0)")
    parser.add_argument("--metrics-port", type=int, default=None, help="Prometheus port (-1 off, 0 free port)")
    parser.add_argument("--redis-url", default=None, help="Redis URL (default TRINITY_REDIS_URL, else embedded)")
    parser.add_argument("--instance-id", default=None, help="stable instance name (default random)")


def serve(args: argparse.Namespace) -> int:
    """Start the named service, register it with the gateway when one is configured, wait for shutdown."""
    from trinity.runtime.metrics import start_metrics_server
    from trinity.runtime.redis_server import RedisServer, ensure_redis

    follow_parent()
    configure_logging(args.service)
    log = get_logger("trinity.serve")
    settings = ServiceSettings.from_env(
        args.service,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        redis_url=args.redis_url,
        instance_id=args.instance_id,
    )
    embedded: RedisServer | None = None
    if args.service in ("buffer", "gateway") and not settings.redis_url:
        embedded = ensure_redis()  # the embedded default: a private redis-server
        settings = settings.model_copy(update={"redis_url": embedded.url})
    (entry,) = entry_points(group=SERVICE_GROUP, name=args.service)
    start: Callable[[ServiceSettings], Any] = entry.load()
    start_metrics_server(settings.metrics_port, settings.host)  # the same interface as gRPC
    server = start(settings)
    server.install_signal_handlers()
    agent = _register_with_gateway(args.service, settings, server)
    print(f"trinity {args.service} serving on port {server.port}", flush=True)
    try:
        server.wait()
    finally:
        if agent is not None:
            agent.stop()
        if embedded is not None:
            embedded.stop()
    log.info("service.exit")
    return 0


def _register_with_gateway(service: str, settings: ServiceSettings, server: GrpcServer) -> Any:
    """Explorer, trainer and buffer announce themselves to the gateway when one is configured (the gateway assigns
    them to runs; the trackers only watch runs)."""
    if service not in ("buffer", "explorer", "trainer") or not settings.gateway:
        return None
    from trinity.runtime.agent import GatewayAgent, has_gpu
    from trinity.v1 import gateway_pb2

    instance = gateway_pb2.Instance(
        instance_id=settings.instance_id,
        service=service,
        address=settings.advertised_address(server.port),
        has_gpu=has_gpu() if service in ("explorer", "trainer") else False,
        started_unix_ms=time.time_ns() // 1_000_000,  # this process's incarnation of the instance id
    )
    return GatewayAgent(settings.gateway, instance, server.current_run).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trinity-serve", description="Run one Trinity service.")
    add_serve_arguments(parser)
    try:
        return serve(parser.parse_args(argv))
    except ValidationError as err:  # a bad TRINITY_* setting: one line naming it, and exit 2 as `trinity serve` does
        print(f"trinity-serve: invalid settings\n{format_validation_error(err)}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
