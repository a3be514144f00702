"""The `trinity` command line.

Exit codes: 0 success, 1 runtime failure, 2 bad input (a wrong flag, config key, type or value; the
message names the field).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from trinity.runtime.serve import add_serve_arguments
from trinity.runtime.serve import serve as serve_service

EXIT_BAD_INPUT = 2

# The commands that dial a running gateway, and what their connection flags stand in for: the SDK, like every
# service, reads these variables (docs/security.md), so a flag overrides its variable for this one command.
GATEWAY_COMMANDS = ("submit", "runs")
CONNECTION_VARIABLES = {
    "tls_ca": "TRINITY_TLS_CA",
    "tls_cert": "TRINITY_TLS_CERT",
    "tls_key": "TRINITY_TLS_KEY",
    "tls_server_name": "TRINITY_TLS_SERVER_NAME",
    "token": "TRINITY_AUTH_TOKEN",
}


def _token_from_file(path: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {err.strerror}") from None
    if not token:
        raise argparse.ArgumentTypeError(f"{path} is empty; write the token the services were given into it")
    return token


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection to the gateway (each flag overrides its TRINITY_* variable)")
    group.add_argument("--tls-ca", metavar="PEM", help="CA of the gateway's certificate: dial TLS (TRINITY_TLS_CA)")
    group.add_argument(
        "--tls-cert", metavar="PEM", help="client certificate, for gateways that require mutual TLS (TRINITY_TLS_CERT)"
    )
    group.add_argument("--tls-key", metavar="PEM", help="the key of --tls-cert (TRINITY_TLS_KEY)")
    group.add_argument(
        "--tls-server-name", metavar="NAME", help="name to check in the gateway's certificate (TRINITY_TLS_SERVER_NAME)"
    )
    # A file, not the token itself: command lines show up in process lists and shell histories.
    group.add_argument(
        "--token-file",
        dest="token",
        metavar="FILE",
        type=_token_from_file,
        help="file holding the bearer token (TRINITY_AUTH_TOKEN)",
    )


def export_connection_arguments(args: argparse.Namespace) -> None:
    for dest, variable in CONNECTION_VARIABLES.items():
        value = getattr(args, dest, None)
        if value is not None:
            os.environ[variable] = str(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trinity", description="Reinforcement fine-tuning as microservices.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run one service (what `trinity-serve`, the image entrypoint, runs)")
    add_serve_arguments(serve)
    serve.set_defaults(handler=serve_service)

    from trinity.cli.commands import add_commands

    add_commands(commands)
    for name in GATEWAY_COMMANDS:
        add_connection_arguments(commands.choices[name])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from pydantic import ValidationError

    from trinity.config.errors import ConfigError, format_validation_error
    from trinity.sdk.errors import InvalidRunConfig, TrinityError

    parser = build_parser()
    args = parser.parse_args(argv)  # argparse exits with 2 on a bad flag, naming it
    export_connection_arguments(args)
    try:
        return int(args.handler(args))
    except ValidationError as err:
        print(f"trinity: invalid input\n{format_validation_error(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ConfigError, InvalidRunConfig) as err:  # refused here, or by the gateway (`submit`)
        print(f"trinity: invalid input\n{err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TrinityError as err:  # the gateway unreachable, a run unknown: one line, no traceback
        print(f"trinity: {err}", file=sys.stderr)
        return 1
    except FileNotFoundError as err:  # a missing program or file the user must provide
        print(f"trinity: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # the shell's codes: 128 + SIGINT, 128 + SIGTERM (`trinity run`)
        from trinity.cli.commands import Terminated

        return 143 if isinstance(err, Terminated) else 130
