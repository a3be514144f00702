"""Explorers as the work grows: a real run's explore throughput with 1, 2, 3 and 4 explorers, and how soon an explorer
that joins a live run (`run.scale`) explores.

One stack serves every run in turn, as a deployed gateway does: `LocalStack` (redis-server, gateway, buffer, trainer
and four explorer processes of one OpenMP thread each, started as `trinity run` starts them), runs submitted through
the SDK's `TrinityClient`. The model is the e2e tests' tiny random Llama on the `transformers` engine, which starts in
seconds (a vLLM build takes minutes on 2 cores), so the runs measure the system rather than an engine build. The runs
are quickstart-shaped: 8 tasks x 8 samples per explore step, one step off-policy (`sync_offset: 1`).

- join (first, so that the first joiner is a process that has never built an engine): a run started with one
  explorer is scaled to two after its second train step; the other explorers are registered and free. Every time is
  from the `scale` call: the gateway assigning an explorer (its monitor sweeps every 0.5 s), StartRun returning, the
  joiner's engine start, the sync generation that has it opened and formed, its first weights received and served,
  its first explore event; and the longest the explorer already in the run waited for weights meanwhile (the
  trainer's next publish waits for the joiner: a generation includes every explorer of the run).
- throughput: a run with `explorer.num_workers` = N gets the same explore steps per explorer for every N. Its
  window opens at the last explorer's first explore event (start-up and engine builds are outside it) and closes at
  the first explorer's last one (the run's tail, where explorers run out of batches to fill, is outside it too);
  experiences put per second = the `accepted` of the explore events inside the window / its length, tokens/s the
  same with each step's `response_tokens` (a mean) times its experiences. Two rounds of N = 1..4; each N keeps its
  best round (`throughput`; every round in `throughput_rounds`), and `over_one` is against N = 1's best. Each N also
  says where its explorers' time went (their spans inside the window: waiting for weights, rolling out), the
  trainer's median step, and the cores the explorers, the trainer, the rest of the stack and every other process of
  the machine used in the window (`CpuSampler`): together they say where the curve bends and why.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from benchmarks.common import write_result
from trinity.cli.launcher import LocalStack
from trinity.models.tiny import build_tiny_llama
from trinity.sdk import RunHandle, TrinityClient
from trinity.v1 import gateway_pb2

EXPLORERS = (1, 2, 3, 4)
STEPS_PER_EXPLORER = 12  # explore steps of each explorer in a throughput run; its first is outside the window
QUICK_STEPS_PER_EXPLORER = 5
THROUGHPUT_ROUNDS = 2
JOIN_RUNS = 3
SCALE_AFTER_TRAIN_STEP = 2
JOIN_TOTAL_STEPS = 16  # enough that the run is still training when the joiner arrives
RUN_TIMEOUT_S = 300.0
ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart"
# The test suite's tiny model (tests/conftest.py): vLLM's CPU attention needs head_dim >= 32, the byte tokenizer 259+.
TINY_SIZES = {"vocab_size": 320, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2, "num_kv_heads": 1}
SAMPLE_S = 0.2


class CpuSampler:
    """CPU seconds used so far by the stack's explorers, its trainer, the rest of it (gateway, buffer, redis-server and
    this process) and the whole machine, sampled on a thread: the machine is shared, so a window read from the run's
    events afterwards needs to know how many cores its explorers actually got, and how many others took."""

    def __init__(self, stack: LocalStack) -> None:
        self._stack = stack
        self._processes: dict[int, psutil.Process] = {}
        self._samples: list[tuple[int, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _pids(self) -> dict[str, list[int]]:
        roles: dict[str, list[int]] = {"explorers": [], "trainer": [], "stack": [os.getpid()]}
        if self._stack.redis is not None and self._stack.redis.process is not None:
            roles["stack"].append(self._stack.redis.process.pid)
        for name, service in self._stack.services.items():
            if service.process is not None:
                role = "explorers" if name.startswith("explorer") else "trainer" if name == "trainer" else "stack"
                roles[role].append(service.process.pid)
        return roles

    def _cpu_s(self, pid: int) -> float:
        process = self._processes.get(pid) or self._processes.setdefault(pid, psutil.Process(pid))
        times = process.cpu_times()
        return float(times.user + times.system)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            sample: dict[str, float] = {}
            for role, pids in self._pids().items():
                total = 0.0
                for pid in pids:
                    try:
                        total += self._cpu_s(pid)
                    except psutil.NoSuchProcess:  # restarted by the supervisor: its replacement counts from now
                        continue
                sample[role] = total
            machine = psutil.cpu_times()
            sample["machine"] = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
            self._samples.append((int(time.time() * 1000), sample))

    def cores(self, start_ms: int, end_ms: int) -> dict[str, float]:
        """Cores used on average between the samples nearest `start_ms` and `end_ms`, by role and by everyone else."""
        first = min(self._samples, key=lambda s: abs(s[0] - start_ms))
        last = min(self._samples, key=lambda s: abs(s[0] - end_ms))
        seconds = (last[0] - first[0]) / 1000
        used = {role: (last[1][role] - first[1][role]) / seconds for role in last[1]}
        used["others"] = used["machine"] - used["explorers"] - used["trainer"] - used["stack"]
        return {f"{role}_cores": round(value, 2) for role, value in used.items()}


def _config(model: Path, workdir: Path, explorers: int, total_steps: int) -> dict[str, Any]:
    """The e2e tests' tiny GRPO run (tests/e2e/conftest.py) at the quickstart's batch shape."""
    return {
        "name": "scaling",
        "mode": "both",
        "model": {"path": str(model), "max_prompt_tokens": 64, "max_response_tokens": 16},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 8, "kl_coef": 0.0},
        "buffer": {
            "batch_size": 8,
            "total_steps": total_steps,
            "taskset": {
                "path": str(QUICKSTART / "train.jsonl"),
                "prompt_key": "question",
                "answer_key": "answer",
                "reward_fn": "accuracy",
                # 80 tasks a pass: enough passes that every run ends at total_steps, not when the tasks run out (an
                # explorer that runs out first leaves the sync group while the others still train on).
                "epochs": 8,
            },
        },
        # No evaluation: it would pause exploring inside the window.
        "explorer": {"engine": "transformers", "workflow": "math", "num_workers": explorers},
        "trainer": {"optimizer": {"lr": 1.0e-3}},
        # A generation waits for a joining explorer's engine to load.
        "synchronizer": {"method": "gloo", "sync_offset": 1, "timeout_seconds": 180},
        "checkpoint_dir": str(workdir / "ckpt"),
    }


def _explores(events: Iterable[gateway_pb2.RunEvent]) -> list[gateway_pb2.RunEvent]:
    return [e for e in events if e.kind == gateway_pb2.EVENT_KIND_EXPLORE]


def _busy_s(spans: Sequence[gateway_pb2.Span], phase: gateway_pb2.Phase, start_ms: int, end_ms: int) -> float:
    """Seconds the explorers spent in `phase` between `start_ms` and `end_ms` (spans clipped to the window)."""
    total = 0
    for span in spans:
        if span.phase == phase and span.source.startswith("explorer/") and span.end_unix_ms:
            total += max(0, min(span.end_unix_ms, end_ms) - max(span.start_unix_ms, start_ms))
    return total / 1000


def _throughput(
    explorers: int,
    events: list[gateway_pb2.RunEvent],
    spans: list[gateway_pb2.Span],
    wall_s: float,
    cpu: CpuSampler,
) -> dict[str, Any]:
    explores = _explores(events)
    by_source: dict[str, list[gateway_pb2.RunEvent]] = {}
    for event in explores:
        by_source.setdefault(event.source, []).append(event)
    if len(by_source) != explorers:
        raise RuntimeError(f"{len(by_source)} explorers explored in a run of {explorers}: {sorted(by_source)}")
    opened = max(steps[0].unix_ms for steps in by_source.values())
    closed = min(steps[-1].unix_ms for steps in by_source.values())
    inside = [e for e in explores if opened < e.unix_ms <= closed]
    seconds = (closed - opened) / 1000
    if not inside or seconds <= 0:
        raise RuntimeError(f"no explore step inside the window of the run with {explorers} explorers")
    experiences = sum(int(e.metrics["accepted"]) for e in inside)
    tokens = sum(e.metrics["response_tokens"] * (e.metrics["accepted"] + e.metrics["dropped"]) for e in inside)
    explorer_s = explorers * seconds
    trained = [e.metrics["seconds"] for e in events if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
    cores = cpu.cores(opened, closed)
    return {
        "explorers": explorers,
        "window_s": round(seconds, 3),
        "explore_steps_in_window": len(inside),
        "experiences_in_window": experiences,
        "experiences_per_s": round(experiences / seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1),
        "explore_step_s_median": round(statistics.median(e.metrics["seconds"] for e in inside), 3),
        "train_step_s_median": round(statistics.median(trained), 3),
        # Shares of the explorers' time inside the window; the rest is leasing, putting and reporting.
        "weight_wait_share": round(_busy_s(spans, gateway_pb2.PHASE_WEIGHT_WAIT, opened, closed) / explorer_s, 3),
        "rollout_share": round(_busy_s(spans, gateway_pb2.PHASE_ROLLOUT, opened, closed) / explorer_s, 3),
        **cores,
        # Steady whatever the machine's other load: where it holds, the explorers are bound by the cores they get.
        "experiences_per_explorer_cpu_s": round(experiences / (cores["explorers_cores"] * seconds), 2),
        "run_wall_s": round(wall_s, 1),
    }


def _finished(run: RunHandle, started: float) -> tuple[list[gateway_pb2.RunEvent], float]:
    """The run's events once it has ended, and its wall seconds; raises unless it succeeded."""
    events = list(run.watch())
    final = run.wait(timeout=RUN_TIMEOUT_S)
    if final.state != gateway_pb2.RUN_STATE_SUCCEEDED:
        raise RuntimeError(f"run {run.id} ended {gateway_pb2.RunState.Name(final.state)}: {final.error}")
    return events, time.monotonic() - started


def _throughput_run(client: TrinityClient, config: dict[str, Any], explorers: int, cpu: CpuSampler) -> dict[str, Any]:
    started = time.monotonic()
    run = client.create_run(config)
    events, wall_s = _finished(run, started)
    return _throughput(explorers, events, run.spans(), wall_s, cpu)


def _first(events: Iterable[gateway_pb2.RunEvent], after_ms: int, **match: Any) -> gateway_pb2.RunEvent:
    found = next(
        (e for e in events if e.unix_ms >= after_ms and all(getattr(e, k) == v for k, v in match.items())), None
    )
    if found is None:
        raise RuntimeError(f"no event {match} after the scale call")
    return found


def _join(events: list[gateway_pb2.RunEvent], spans: list[gateway_pb2.Span], scaled_ms: int) -> dict[str, Any]:
    first_explorer = _explores(events)[0].source
    joined = next(e for e in events if e.unix_ms >= scaled_ms and " joins (" in e.message)
    joiner = f"explorer/{joined.message.split()[1]}"

    def after(unix_ms: int) -> float:
        return round((unix_ms - scaled_ms) / 1000, 3)

    started = _first(events, scaled_ms, message=f"explorer {joiner.partition('/')[2]} started")
    opened = next(
        e
        for e in events
        if e.unix_ms >= scaled_ms and e.message.startswith("sync group generation ") and " opened" in e.message
    )
    engine = next(s for s in spans if s.source == joiner and s.phase == gateway_pb2.PHASE_ENGINE_START)
    # A receive span starts once the receiver's collective init has returned, which it does on every member at
    # once: the joiner's first one is the moment the new generation formed.
    received = next(s for s in spans if s.source == joiner and s.phase == gateway_pb2.PHASE_WEIGHT_RECEIVE)
    weights = _first(events, scaled_ms, source=joiner, kind=gateway_pb2.EVENT_KIND_WEIGHTS)
    explored = _first(events, scaled_ms, source=joiner, kind=gateway_pb2.EVENT_KIND_EXPLORE)
    stalls = [
        s.end_unix_ms - max(s.start_unix_ms, scaled_ms)
        for s in spans
        if s.source == first_explorer and s.phase == gateway_pb2.PHASE_WEIGHT_WAIT and s.end_unix_ms > scaled_ms
    ]
    return {
        "joiner": joiner,
        "assigned_s": after(joined.unix_ms),
        "started_s": after(started.unix_ms),
        "engine_start_s": [after(engine.start_unix_ms), after(engine.end_unix_ms)],
        "sync_generation_opened_s": after(opened.unix_ms),
        "sync_generation_formed_s": after(received.start_unix_ms),
        "first_weights_received_s": after(received.end_unix_ms),
        "first_weights_served_s": after(weights.unix_ms),
        "first_explore_s": after(explored.unix_ms),
        "first_explore_step": explored.step,
        "staying_explorer_longest_weight_wait_s": round(max(stalls, default=0) / 1000, 3),
    }


def _join_run(client: TrinityClient, config: dict[str, Any], explored_before: set[str]) -> dict[str, Any]:
    """One join run; `explored_before` (the explorers of earlier runs on this stack) grows by this run's."""
    started = time.monotonic()
    run = client.create_run(config)
    events: list[gateway_pb2.RunEvent] = []
    scaled_ms = 0
    for event in run.watch():
        events.append(event)
        if not scaled_ms and event.kind == gateway_pb2.EVENT_KIND_TRAIN and event.step >= SCALE_AFTER_TRAIN_STEP:
            scaled_ms = int(time.time() * 1000)  # the gateway stamps events with the same host clock
            run.scale(2)
    final = run.wait(timeout=RUN_TIMEOUT_S)
    if final.state != gateway_pb2.RUN_STATE_SUCCEEDED:
        raise RuntimeError(f"run {run.id} ended {gateway_pb2.RunState.Name(final.state)}: {final.error}")
    joined = _join(events, run.spans(), scaled_ms)
    # A process that has run a model before starts its next engine with its imports and caches warm.
    joined["joiner_explored_before"] = joined["joiner"] in explored_before
    explored_before.update(e.source for e in _explores(events))
    return {**joined, "run_wall_s": round(time.monotonic() - started, 1)}


def run(quick: bool) -> dict[str, Any]:
    counts = EXPLORERS[:2] if quick else EXPLORERS
    per_explorer = QUICK_STEPS_PER_EXPLORER if quick else STEPS_PER_EXPLORER
    joins, rounds = (1, 1) if quick else (JOIN_RUNS, THROUGHPUT_ROUNDS)
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="explorer-scaling-") as tmp:
        workdir = Path(tmp)
        model = build_tiny_llama(workdir / "tiny", **TINY_SIZES)
        roots = os.pathsep.join([tmp, str(ROOT)])
        stack = LocalStack.up(workdir / "logs", explorers=max(EXPLORERS), extra_env={"TRINITY_DATA_ROOTS": roots})
        try:
            with TrinityClient(stack.gateway) as client, CpuSampler(stack) as cpu:
                # The joins first, so that the first joiner is a process that has not built an engine yet.
                explored: set[str] = set()
                join_config = _config(model, workdir, 1, JOIN_TOTAL_STEPS)
                join_runs = [_join_run(client, join_config, explored) for _ in range(joins)]
                # An explore step (8 x 8) fills one train batch: N x per_explorer train steps give each explorer
                # per_explorer explore steps.
                rows = [
                    _throughput_run(client, _config(model, workdir, n, n * per_explorer), n, cpu)
                    for _ in range(rounds)
                    for n in counts
                ]
        finally:
            stack.down()
    # The rounds alternate N, so a busy spell of the shared machine hits one round of each; the best round is kept.
    curve = [max((r for r in rows if r["explorers"] == n), key=lambda r: r["experiences_per_s"]) for n in counts]
    baseline = curve[0]
    for row in rows:
        row["experiences_per_s_over_one"] = round(row["experiences_per_s"] / baseline["experiences_per_s"], 3)
        row["tokens_per_s_over_one"] = round(row["tokens_per_s"] / baseline["tokens_per_s"], 3)
    result = {
        "quick": quick,
        "model": "tiny random Llama (the e2e tests': hidden 128, 2 layers, byte tokenizer), transformers engine",
        "shape": {
            "tasks_per_explore_step": 8,
            "samples_per_task": 8,
            "max_response_tokens": 16,
            "sync_offset": 1,
            "explore_steps_per_explorer": per_explorer,
            "explorer_threads": 1,
            "trainer_threads": os.cpu_count(),
        },
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        # Across every throughput run: whether the explorers ever waited on the trainer, what a core of theirs did, and
        # how much of the machine they got (the rest went to the trainer, the stack and the machine's other load).
        "summary": {
            "weight_wait_share_max": max(r["weight_wait_share"] for r in rows),
            "experiences_per_explorer_cpu_s": [
                min(r["experiences_per_explorer_cpu_s"] for r in rows),
                max(r["experiences_per_explorer_cpu_s"] for r in rows),
            ],
            "explorers_cores_max": max(r["explorers_cores"] for r in rows),
            "others_cores": [min(r["others_cores"] for r in rows), max(r["others_cores"] for r in rows)],
        },
        "throughput": curve,
        "throughput_rounds": rows,
        "join": join_runs,
        "wall_s": round(time.monotonic() - started, 1),
    }
    write_result("explorer_scaling", result)
    return result


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
