"""Container health probe: `python -m trinity.runtime.healthcheck` exits 0 when the local service is SERVING.

Docker's HEALTHCHECK runs this inside the container; it asks the standard gRPC health service (which
needs no auth token) once, with a short deadline, so a hung server reads as unhealthy instead of hanging
the probe.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trinity.runtime.client import open_channel
from trinity.runtime.tls import TlsSettings

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1


def default_address() -> str:
    """127.0.0.1 and the port the service was told to bind (`TRINITY_PORT`)."""
    port = os.environ.get("TRINITY_PORT", "")
    if not port or port == "0":
        raise ValueError("TRINITY_PORT is not set (or 0): pass --address HOST:PORT to the health check")
    return f"127.0.0.1:{port}"


def check(address: str, *, service: str = "", timeout: float = 3.0, tls: TlsSettings | None = None) -> bool:
    """One health Check against `address`; True only for SERVING. TLS as the service's own `TRINITY_TLS_*`
    variables say: the probe dials it with the service's CA, server name and (for mutual TLS) certificate."""
    with open_channel(address, tls=tls) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout, wait_for_ready=False
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trinity-healthcheck", description=__doc__)
    parser.add_argument("--address", default=None, help="host:port (default 127.0.0.1:$TRINITY_PORT)")
    parser.add_argument("--service", default="", help="health service name ('' = the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the reply")
    args = parser.parse_args(argv)
    try:
        address = args.address or default_address()
    except ValueError as err:
        print(f"unhealthy: {err}", file=sys.stderr)
        return EXIT_UNHEALTHY
    if check(address, service=args.service, timeout=args.timeout):
        return EXIT_HEALTHY
    print(f"unhealthy: {address} is not SERVING", file=sys.stderr)
    return EXIT_UNHEALTHY


if __name__ == "__main__":
    sys.exit(main())
