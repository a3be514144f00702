"""`trinity stack up|down|status`: the docker-compose.yml stack through the Docker SDK for Python.

The plan (images, order, settings) comes from docker-compose.yml (and docker-compose.gpu.yml with
`--gpu`); `trinity stack up --dry-run` prints it without an engine. Where no engine answers, the
commands say so and exit 1, pointing at `trinity run`, which runs the same services as local processes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trinity.cli.stack.compose import ComposeError
from trinity.cli.stack.plan import StackPlan, compose_files, load_plan

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
NO_ENGINE_HINT = (
    "Start Docker (or set DOCKER_HOST), or run the services as local processes instead: trinity run --config FILE"
)

__all__ = ["StackPlan", "add_stack_commands", "load_plan"]


def _plan(args: argparse.Namespace) -> StackPlan:
    files = compose_files(Path(args.directory), gpu=args.gpu, extra=[Path(f) for f in args.file])
    return load_plan(files, profiles=set(args.profile), project=args.project_name)


def _run(args: argparse.Namespace, action: str) -> int:
    try:
        plan = _plan(args)
    except ComposeError as err:
        print(f"trinity stack: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if action == "up" and args.dry_run:
        print(plan.describe())
        return EXIT_OK
    from trinity.cli.stack.engine import EngineUnavailable, StackEngine, connect

    try:
        client = connect()
    except EngineUnavailable as err:
        print(f"trinity stack: {err}.\n{NO_ENGINE_HINT}", file=sys.stderr)
        return EXIT_FAILED
    engine = StackEngine(client, plan)
    try:
        if action == "up":
            engine.up(build=args.build, timeout=args.timeout)
        elif action == "down":
            engine.down(volumes=args.volumes)
        else:
            rows = engine.status()
            for row in rows:
                print(f"{row.name:<12} {row.container:<28} {row.state:<10} {row.health}")
            return (
                EXIT_OK if all(r.state == "running" and r.health in ("healthy", "none") for r in rows) else EXIT_FAILED
            )
    except (RuntimeError, TimeoutError) as err:
        print(f"trinity stack {action}: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def stack_up(args: argparse.Namespace) -> int:
    return _run(args, "up")


def stack_down(args: argparse.Namespace) -> int:
    return _run(args, "down")


def stack_status(args: argparse.Namespace) -> int:
    return _run(args, "status")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--directory", "-C", default=".", help="folder holding docker-compose.yml (default .)")
    parser.add_argument("--file", "-f", action="append", default=[], help="an extra override compose file")
    parser.add_argument("--gpu", action="store_true", help="add docker-compose.gpu.yml (CUDA images, GPUs)")
    parser.add_argument("--profile", action="append", default=[], help="enable a compose profile (quickstart)")
    parser.add_argument("--project-name", "-p", default=None, help="project name (default: the file's `name`)")


def add_stack_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add `stack up|down|status` to the `trinity` command line; each handler returns an exit code."""
    stack = subparsers.add_parser("stack", help="run the docker-compose stack through a Docker engine")
    actions = stack.add_subparsers(dest="stack_command", required=True)

    up = actions.add_parser("up", help="build or pull images, create network and volumes, start, wait for health")
    _common(up)
    up.add_argument("--build", action="store_true", help="rebuild images even when present")
    up.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each service's health")
    up.add_argument("--dry-run", action="store_true", help="print the plan; needs no engine")
    up.set_defaults(handler=stack_up)

    down = actions.add_parser("down", help="stop and remove the containers (and the network)")
    _common(down)
    down.add_argument("--volumes", action="store_true", help="also remove the named volumes (data is lost)")
    down.set_defaults(handler=stack_down)

    status = actions.add_parser("status", help="each service's container state and health; exit 1 unless all healthy")
    _common(status)
    status.set_defaults(handler=stack_status)
