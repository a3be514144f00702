"""The `trinity` command line.

Exit codes: 0 success, 1 runtime failure, 2 bad input (a wrong flag, config key, type or value; the
message names the field).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from trinity.runtime.logging import configure_logging, get_logger

EXIT_BAD_INPUT = 2

# service name -> (module, start function); imported lazily so `serve buffer` never imports torch.
SERVICES: dict[str, tuple[str, str]] = {
    "buffer": ("trinity.buffer.server", "start_buffer"),
    "explorer": ("trinity.explorer.server", "start_explorer"),
    "trainer": ("trinity.trainer.server", "start_trainer"),
    "gateway": ("trinity.gateway.server", "start_gateway"),
}


def _serve(args: argparse.Namespace) -> int:
    from trinity.launcher import follow_parent
    from trinity.runtime.metrics import start_metrics_server
    from trinity.runtime.redis_server import RedisServer, ensure_redis
    from trinity.runtime.settings import ServiceSettings

    follow_parent()
    configure_logging(args.service)
    log = get_logger("trinity.cli")
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
    module_name, start_name = SERVICES[args.service]
    start: Callable = getattr(importlib.import_module(module_name), start_name)
    start_metrics_server(settings.metrics_port)
    server = start(settings)
    server.install_signal_handlers()
    agent = _register_with_gateway(args.service, settings, server.port)
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


def _register_with_gateway(service: str, settings, port: int):
    """Explorer, trainer and buffer announce themselves to the gateway when one is configured."""
    if service == "gateway" or not settings.gateway:
        return None
    from trinity.runtime.agent import GatewayAgent, has_gpu
    from trinity.v1 import gateway_pb2

    instance = gateway_pb2.Instance(
        instance_id=settings.instance_id,
        service=service,
        address=settings.advertised_address(port),
        has_gpu=has_gpu() if service in ("explorer", "trainer") else False,
    )
    return GatewayAgent(settings.gateway, instance).start()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trinity", description="Reinforcement fine-tuning as microservices.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run one service (the entrypoint containers use)")
    serve.add_argument("service", choices=sorted(SERVICES))
    serve.add_argument("--port", type=int, default=None, help="gRPC port (default TRINITY_PORT or a free one)")
    serve.add_argument("--host", default=None, help="bind address (default TRINITY_HOST or 0.0.0.0)")
    serve.add_argument("--metrics-port", type=int, default=None, help="Prometheus port (-1 off, 0 free port)")
    serve.add_argument("--redis-url", default=None, help="Redis URL (default TRINITY_REDIS_URL, else embedded)")
    serve.add_argument("--instance-id", default=None, help="stable instance name (default random)")
    serve.set_defaults(handler=_serve)

    from trinity.commands import add_commands
    from trinity.stack import add_stack_commands  # the docker-compose stack (deploy/README.md)

    add_commands(commands)
    add_stack_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from pydantic import ValidationError

    from trinity.config.errors import ConfigError, format_validation_error

    parser = build_parser()
    args = parser.parse_args(argv)  # argparse exits with 2 on a bad flag, naming it
    try:
        return int(args.handler(args))
    except ValidationError as err:
        print(f"trinity: invalid input\n{format_validation_error(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ConfigError as err:
        print(f"trinity: invalid input\n{err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except FileNotFoundError as err:  # a missing program or file the user must provide
        print(f"trinity: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
