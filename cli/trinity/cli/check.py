"""`trinity check --config FILE`: everything `trinity run` (or, with `--remote`, `trinity submit`) checks before it
starts, and the run it would start, every default filled in; nothing is started. Exit 0, or 2 naming the field."""

from __future__ import annotations

import argparse

import yaml

from trinity.cli import preflight
from trinity.config import load_run_config
from trinity.config.resolved import resolved_run


def cmd_check(args: argparse.Namespace) -> int:
    config = load_run_config(args.config)
    config = preflight.submitted_run(config) if args.remote else preflight.local_run(config)
    stages = resolved_run(config)
    print(yaml.safe_dump(stages[0] if len(stages) == 1 else {"stages": stages}, sort_keys=False), end="")
    print(f"# {args.config}: valid ({len(stages)} stage{'s' if len(stages) > 1 else ''})")
    return 0


def add_check_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser("check", help="validate a run config and print the run it resolves to; start nothing")
    check.add_argument("--config", required=True, help="run config (YAML)")
    check.add_argument(
        "--remote",
        action="store_true",
        help="check as `trinity submit` does: the data files are the gateway's machines' to find, not this one's",
    )
    check.set_defaults(handler=cmd_check)
