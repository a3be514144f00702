"""`trinity check --config FILE`: everything `trinity run` (or, with `--remote`, `trinity submit`) checks before it
starts, and the run it would start, every default filled in; nothing is started. Exit 0, or 2 naming the field.
With `--gpus N --gpu-memory-gib M`, also the GPU memory of each process and a layout on that host (`layout`), as
comment lines; exit 1 when the run cannot fit."""

from __future__ import annotations

import argparse

import yaml

from trinity.cli import layout, preflight
from trinity.cli.argtypes import positive
from trinity.config import load_run_config
from trinity.config.errors import ConfigError
from trinity.config.resolved import resolved_run


def cmd_check(args: argparse.Namespace) -> int:
    config = load_run_config(args.config)
    config = preflight.submitted_run(config) if args.remote else preflight.local_run(config)
    stages = resolved_run(config)
    print(yaml.safe_dump(stages[0] if len(stages) == 1 else {"stages": stages}, sort_keys=False), end="")
    print(f"# {args.config}: valid ({len(stages)} stage{'s' if len(stages) > 1 else ''})")
    if (args.gpus is None) != (args.gpu_memory_gib is None):
        raise ConfigError("--gpus" if args.gpus is None else "--gpu-memory-gib", "the layout needs both flags")
    if args.gpus is None:
        return 0
    lines, fits = layout.report(config, args.gpus, args.gpu_memory_gib)
    print("\n".join(f"# {line}" for line in lines))
    return 0 if fits else 1


def add_check_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser("check", help="validate a run config and print the run it resolves to; start nothing")
    check.add_argument("--config", required=True, help="run config (YAML)")
    check.add_argument(
        "--remote",
        action="store_true",
        help="check as `trinity submit` does: the data files are the gateway's machines' to find, not this one's",
    )
    machine = check.add_argument_group(
        "layout (deploy/README.md): the GPU memory each process needs on these GPUs, and a placement that fits; "
        "exit 1 when none does"
    )
    machine.add_argument("--gpus", type=positive(int), metavar="N", help="GPUs of the host the run gets")
    machine.add_argument("--gpu-memory-gib", type=positive(float), metavar="GIB", help="memory of each GPU, GiB")
    check.set_defaults(handler=cmd_check)
