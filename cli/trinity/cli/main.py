"""The `trinity` command line.

Exit codes: 0 success, 1 runtime failure, 2 bad input (a wrong flag, config key, type or value; the
message names the field).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from trinity.runtime.serve import add_serve_arguments
from trinity.runtime.serve import serve as serve_service

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trinity", description="Reinforcement fine-tuning as microservices.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run one service (what `trinity-serve`, the image entrypoint, runs)")
    add_serve_arguments(serve)
    serve.set_defaults(handler=serve_service)

    from trinity.cli.commands import add_commands

    add_commands(commands)
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
