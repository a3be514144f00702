"""`trinity-console`: the console's HTTP server (uvicorn) on TRINITY_CONSOLE_HOST and `--port`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import uvicorn

from trinity.console.app import create_app
from trinity.console.settings import ConsoleSettings
from trinity.runtime.logging import configure_logging, get_logger

log = get_logger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trinity-console", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=None, help="HTTP port (default TRINITY_CONSOLE_PORT or 8300)")
    parser.add_argument("--host", default=None, help="bind address (default TRINITY_CONSOLE_HOST or 127.0.0.1)")
    parser.add_argument("--gateway", default=None, help="gateway host:port (default TRINITY_GATEWAY)")
    args = parser.parse_args(argv)
    if args.port is not None and not 0 <= args.port <= 65535:
        parser.error(f"--port: must be between 0 and 65535, got {args.port}")  # exit 2, naming the flag
    configure_logging("console")
    settings = ConsoleSettings.from_env(port=args.port, host=args.host, gateway=args.gateway)
    log.info("console.starting", url=f"http://{settings.host}:{settings.port}/", gateway=settings.gateway)
    # SIGTERM: uvicorn stops accepting, finishes the requests in flight (event streams are cut), then exits.
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
