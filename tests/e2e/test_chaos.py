"""Chaos: one run on a tiny model while its processes are SIGKILLed one after another, several at the worst moment
(held there by a failpoint, `trinity.runtime.failpoints`): the explorer while it loads weights, the trainer halfway
through a weight publish, the gateway while it brings back the explorer lost just before; then the buffer, Redis
and the trainer twice more. The local supervisor restarts each; the run succeeds, every version an explorer served
is one the trainer published whole, and the accounting balances."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import tiny_config
from tests.e2e.faults import WAIT_S, Watcher, assert_balanced, kill_at
from tests.e2e.test_modes import example_config
from trinity.cli.launcher import LocalStack
from trinity.clients import BufferClient
from trinity.config import naming
from trinity.runtime import failpoints
from trinity.sdk import RunMetrics, TrinityClient
from trinity.v1 import gateway_pb2

TOTAL_STEPS = 12


@pytest.mark.system  # a whole run: minutes on 2 cores
def test_a_run_survives_kills_at_the_worst_moments(tiny_model, tmp_path):
    config = tiny_config(
        tiny_model,
        **{
            "buffer.total_steps": TOTAL_STEPS,
            "trainer.save_interval": 2,  # a killed trainer resumes from the last even step and redoes at most one
            "synchronizer.timeout_seconds": 30,  # bounds how long receivers hold a version whose sender died
            "buffer.taskset.lease_seconds": 30,
            "explorer.eval_interval": 100,
            "checkpoint_dir": str(tmp_path / "ckpt"),
        },
    )
    held = tmp_path / "failpoints"
    stack = LocalStack.up(tmp_path / "logs", explorers=1, extra_env={failpoints.ENV: str(held)})
    recovery: dict[str, float] = {}
    try:
        with TrinityClient(stack.gateway) as client:
            run = client.create_run(config)
            watcher = Watcher(run)
            kill_at(stack, held, "weights.load", "explorer-0")
            recovery["explorer while loading weights"] = watcher.next_train_step()
            kill_at(stack, held, "weights.publish", "trainer")
            recovery["trainer mid-publish"] = watcher.next_train_step()
            stack.kill("buffer")
            recovery["buffer"] = watcher.next_train_step()
            # The gateway dies after it has written the explorer's replacement into the run, before starting it.
            failpoints.arm(held, "gateway.replace")
            stack.kill("explorer-0")
            kill_at(stack, held, "gateway.replace", "gateway")
            recovery["gateway while recovering the explorer"] = watcher.next_train_step()
            stack.kill("redis")
            recovery["redis"] = watcher.next_train_step()
            for kill in ("trainer (2nd)", "trainer (3rd)"):
                stack.kill("trainer")
                recovery[kill] = watcher.next_train_step()
            final = run.wait(timeout=WAIT_S)
            events = watcher.join()
        print("seconds from kill to the next train step:", json.dumps({k: round(v, 1) for k, v in recovery.items()}))
        assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error
        expected = {"explorer-0": 2, "trainer": 3, "buffer": 1, "gateway": 1, "redis": 1}
        assert all(stack.restarts[name] >= n for name, n in expected.items()), stack.restarts
        # The restarted gateway found the explorer its predecessor had assigned but not started, and started it.
        messages = [e.message for e in events]
        assert any(m.endswith("lost (assigned to stage 0 but working on no run)") for m in messages), messages

        # Versions strictly increase across the four trainer incarnations, although steps after each checkpoint
        # were trained twice; the explorers served only versions the trainer published whole, never the one a
        # killed trainer left half-sent.
        trained = watcher.trained()
        versions = [e.model_version for e in trained]
        assert versions == sorted(set(versions)), [(e.seq, e.step, e.model_version) for e in trained]
        assert final.train_step == TOTAL_STEPS and final.model_version >= TOTAL_STEPS
        metrics = RunMetrics.from_events(events)
        published = {row["model_version"]: row["weights_digest"] for row in metrics.train}
        served = {row["model_version"]: row["weights_digest"] for row in metrics.weights if "weights_digest" in row}
        assert served and all(published.get(v) == digest for v, digest in served.items()), (served, published)

        assert_balanced(stack.services["buffer"].address, run.id, tmp_path / "ckpt", TOTAL_STEPS)
    finally:
        stack.down()


@pytest.mark.system
def test_a_gateway_killed_at_a_stage_transition_starts_the_next_stage_on_its_return(tiny_model, tmp_path):
    config = example_config("multistage", tiny_model, checkpoint_dir=str(tmp_path / "ckpt"))
    held = tmp_path / "failpoints"
    failpoints.arm(held, "gateway.stage")  # the ledger says stage 1, none of its services has been started
    stack = LocalStack.up(tmp_path / "logs", explorers=1, extra_env={failpoints.ENV: str(held)})
    try:
        with TrinityClient(stack.gateway) as client:
            run = client.create_run(config)
            assert failpoints.reached_by(held, "gateway.stage", WAIT_S) == stack.services["gateway"].process.pid
            stack.kill("gateway")
            final = run.wait(timeout=WAIT_S)
            events = list(run.watch())
        metrics = RunMetrics.from_events(events)
        assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error
        assert "stage 1 was not started: starting it" in [e.message for e in events]  # the returned gateway did
        assert [(row["stage"], row["step"]) for row in metrics.train] == [(0, 1), (0, 2), (1, 1), (1, 2)]
        assert final.final_model_path.endswith("stage1/final")
        with BufferClient(stack.services["buffer"].address) as buffer:
            stats = buffer.stream(naming.experience_stream(run.id, 1, "experiences")).stats
        assert stats.pending == 0 and stats.dead_letters == 0 and stats.acked > 0, stats
    finally:
        stack.down()
