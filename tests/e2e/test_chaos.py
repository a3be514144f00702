"""Chaos: one run on a tiny model while explorer, trainer, buffer, gateway and redis-server are SIGKILLed
in turn. The local supervisor brings each back; the run succeeds and its accounting balances."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import tiny_config
from trinity.cli.launcher import LocalStack
from trinity.clients import BufferClient
from trinity.config import naming
from trinity.sdk import TrinityClient
from trinity.v1 import gateway_pb2

# At which train step each process is killed: one at a time, each after the previous one is back.
KILLS = {2: "explorer-0", 4: "trainer", 6: "buffer", 8: "gateway", 10: "redis"}
TOTAL_STEPS = 13


@pytest.mark.system  # a whole run: minutes on 2 cores
def test_a_run_survives_each_service_killed_in_turn(tiny_model, tmp_path):
    config = tiny_config(
        tiny_model,
        **{
            "buffer.total_steps": TOTAL_STEPS,
            "trainer.save_interval": 3,  # the trainer killed at step 4 resumes from step 3 and redoes one
            "synchronizer.timeout_seconds": 30,
            "buffer.taskset.lease_seconds": 30,
            "explorer.eval_interval": 100,
            "checkpoint_dir": str(tmp_path / "ckpt"),
        },
    )
    stack = LocalStack.up(tmp_path / "logs", explorers=1)
    try:
        with TrinityClient(stack.gateway) as client:
            run = client.create_run(config)
            events: list[gateway_pb2.RunEvent] = []
            killed: list[str] = []
            for event in run.watch():
                events.append(event)
                victim = KILLS.get(int(event.step)) if event.kind == gateway_pb2.EVENT_KIND_TRAIN else None
                if victim is not None and victim not in killed:
                    killed.append(victim)
                    stack.kill(victim)  # SIGKILL; returns once the supervisor has started its replacement
            final = run.wait(timeout=300)
        assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error
        assert killed == list(KILLS.values())
        assert all(stack.restarts[name] >= 1 for name in killed), stack.restarts

        # Versions strictly increase across both trainer incarnations, although steps after the
        # checkpoint were trained twice (once by the lost trainer).
        trained = [e for e in events if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
        versions = [e.model_version for e in trained]
        assert versions == sorted(set(versions)), [(e.seq, e.step, e.model_version) for e in trained]
        assert final.train_step == TOTAL_STEPS and final.model_version >= TOTAL_STEPS

        # Accounting: what was put was trained, dropped with a reason, or is still queued; nothing is
        # pending or dead, and no experience is in the final weights twice.
        stream = naming.experience_stream(run.id, 0, "experiences")
        with BufferClient(stack.services["buffer"].address) as buffer:
            stats = buffer.stream(stream).stats
        assert stats.pending == 0 and stats.dead_letters == 0, stats
        # `put` counts what the stream accepted: a batch that a killed explorer's replacement puts again is
        # refused as duplicates at the put, outside `put`; what is dropped after the put (stale) is inside it.
        after_put = sum(n for reason, n in stats.dropped.items() if reason != "duplicate")
        assert stats.put == stats.acked + after_put + stats.lag, stats
        checkpoints = tmp_path / "ckpt" / run.id / "stage0" / "checkpoints"
        state = json.loads((checkpoints / (checkpoints / "latest").read_text().strip() / "state.json").read_text())
        consumed = state["consumed_ids"]
        assert len(consumed) == len(set(consumed)) == stats.acked
        assert state["step"] == TOTAL_STEPS
    finally:
        stack.down()
