"""The soak (`make soak`, not in CI): one run on a tiny model for about an hour (TRINITY_SOAK_SECONDS) while every
2 to 5 minutes a random process of the stack is SIGKILLed or, now and then, a service's port is cut off for 30 s by a
packet filter (iptables on the loopback interface: nothing reaches it, established connections stall). It ends with
the run SUCCEEDED, the accounting balanced, and a summary of every fault and how long the run took to recover from it,
written as JSON (TRINITY_SOAK_OUT, default benchmarks/results/soak.json)."""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.conftest import tiny_config
from tests.e2e.faults import Watcher, assert_balanced
from trinity.cli.launcher import LocalStack
from trinity.sdk import TrinityClient
from trinity.v1 import gateway_pb2

pytestmark = pytest.mark.soak

SECONDS = float(os.environ.get("TRINITY_SOAK_SECONDS", "3600"))
OUT = Path(os.environ.get("TRINITY_SOAK_OUT", Path(__file__).resolve().parents[2] / "benchmarks/results/soak.json"))
SEED = int(os.environ.get("TRINITY_SOAK_SEED", "0"))
GAP_S = tuple(float(s) for s in os.environ.get("TRINITY_SOAK_GAP_SECONDS", "120,300").split(","))  # between faults
PARTITION_S = 30.0
PARTITION_SHARE = 0.25  # of the faults; the rest are kills
KILLED = ("explorer-0", "trainer", "buffer", "gateway", "redis")
CUT_OFF = ("buffer", "gateway", "redis")
CALIBRATION_STEPS = 20
RECOVERY_WAIT_S = 600.0


@contextmanager
def cut_off(port: int) -> Iterator[None]:
    """Drop every TCP packet to `port` on the loopback interface while the block runs; the rule always goes."""
    rule = ["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"]
    subprocess.run(["iptables", "-w", "-I", *rule], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-w", "-D", *rule], check=True, capture_output=True, timeout=30)


def _port(stack: LocalStack, name: str) -> int:
    if name == "redis":
        assert stack.redis is not None
        return int(stack.redis.url.rsplit(":", 1)[1].split("/")[0])
    return stack.services[name].port


def _config(model: Path, steps: int, checkpoint_dir: Path) -> dict:
    return tiny_config(
        model,
        **{
            "buffer.total_steps": steps,
            "buffer.batch_size": 8,  # about a second a step here: a realistic pace of weight syncs and checkpoints
            "model.max_response_tokens": 32,
            "buffer.taskset.epochs": 1_000_000,  # the quickstart's 80 tasks are 40 steps: the run ends at `steps`
            "trainer.save_interval": 25,
            "synchronizer.timeout_seconds": 60,
            "buffer.taskset.lease_seconds": 60,
            "explorer.eval_interval": 10_000,
            "buffer.eval_tasksets": [],
            "checkpoint_dir": str(checkpoint_dir),
        },
    )


def _calibrate(client: TrinityClient, model: Path, checkpoint_dir: Path) -> float:
    """Seconds per train step of this machine with no fault, measured on a short run of the same shape."""
    run = client.create_run(_config(model, CALIBRATION_STEPS, checkpoint_dir))
    watcher = Watcher(run)
    watcher.next_train_step(RECOVERY_WAIT_S)  # start-up is not a step
    started = time.monotonic()
    assert run.wait(timeout=RECOVERY_WAIT_S).state == gateway_pb2.RUN_STATE_SUCCEEDED
    return (time.monotonic() - started) / (CALIBRATION_STEPS - 1)


@pytest.mark.skipif(shutil.which("iptables") is None or os.geteuid() != 0, reason="the soak cuts ports with iptables")
@pytest.mark.timeout(SECONDS * 2 + 1800)  # bounded like every test, far past a run that is merely slow
def test_a_run_of_an_hour_under_random_faults_succeeds_and_balances(tiny_model, tmp_path):
    rng = random.Random(SEED)
    checkpoint_dir = tmp_path / "ckpt"
    stack = LocalStack.up(tmp_path / "logs", explorers=1)
    began = time.monotonic()
    faults: list[dict[str, object]] = []
    try:
        with TrinityClient(stack.gateway) as client:
            step_s = _calibrate(client, tiny_model, checkpoint_dir)
            # Sized at the calibrated pace; the faults' pauses and the calibration's start-up steps roughly cancel.
            steps = max(20, int((SECONDS - (time.monotonic() - began)) / step_s))
            run = client.create_run(_config(tiny_model, steps, checkpoint_dir))
            watcher = Watcher(run)
            run_started = time.monotonic()
            while not watcher.ended:
                if watcher.wait_ended(rng.uniform(*GAP_S)):
                    break
                at = round(time.monotonic() - run_started, 1)
                fault = {"at_s": at, **_inject(stack, rng)}
                try:
                    fault["trains_again_s"] = round(watcher.next_train_step(RECOVERY_WAIT_S), 1)
                except AssertionError:
                    if not watcher.ended:
                        raise
                    fault["trains_again_s"] = None  # the run finished meanwhile
                faults.append(fault)
            final = run.wait(timeout=RECOVERY_WAIT_S)
            events = watcher.join()
        run_seconds = time.monotonic() - run_started
        assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error
        versions = [e.model_version for e in events if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
        assert versions == sorted(set(versions))
        accounting = assert_balanced(stack.services["buffer"].address, run.id, checkpoint_dir, steps)
        summary = {
            "seconds": round(time.monotonic() - began, 1),
            "run_seconds": round(run_seconds, 1),
            "steps": steps,
            "calibrated_seconds_per_step": round(step_s, 2),
            "restarts": dict(stack.restarts),
            "accounting": accounting,
            "faults": faults,
            "recovery_by_fault": _by_kind(faults),
        }
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps({k: v for k, v in summary.items() if k != "faults"}, indent=2))
    finally:
        stack.down()


def _inject(stack: LocalStack, rng: random.Random) -> dict[str, object]:
    """One fault, over when this returns: a kill (with the seconds until the process serves again) or a cut."""
    if rng.random() < PARTITION_SHARE:
        name = rng.choice(CUT_OFF)
        with cut_off(_port(stack, name)):
            time.sleep(PARTITION_S)
        return {"fault": f"cut off {name} {PARTITION_S:.0f}s"}
    name, killed = rng.choice(KILLED), time.monotonic()
    stack.kill(name)
    if name != "redis":
        stack.wait_serving(name)
    return {"fault": f"kill {name}", "back_s": round(time.monotonic() - killed, 1)}


def _by_kind(faults: list[dict[str, object]]) -> dict[str, dict[str, float]]:
    """Per fault kind: how many, and the median and worst seconds until the run trained again."""
    kinds: dict[str, list[float]] = {}
    for fault in faults:
        seconds = fault["trains_again_s"]
        if isinstance(seconds, float):
            kinds.setdefault(str(fault["fault"]), []).append(seconds)
    return {
        kind: {"count": len(s), "median_s": round(statistics.median(s), 1), "max_s": max(s)}
        for kind, s in sorted(kinds.items())
    }
