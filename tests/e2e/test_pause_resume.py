"""A run paused and resumed mid-way (PauseRun, ResumeRun) succeeds with the accounting of a healed run: its trainer
checkpoints the step in progress, every service is freed, the resumed trainer continues from that checkpoint, nothing
is lost or trained twice, weight versions keep increasing and every version an explorer served was published."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import tiny_config
from tests.e2e.faults import WAIT_S, Watcher, assert_balanced
from trinity.cli.launcher import LocalStack
from trinity.sdk import RunHandle, RunMetrics, TrinityClient
from trinity.v1 import gateway_pb2

TOTAL_STEPS = 8
PAUSED = gateway_pb2.RUN_STATE_PAUSED


def _paused(run: RunHandle, timeout: float = WAIT_S) -> gateway_pb2.Run:
    """The run once every service has stopped for its pause."""
    deadline = time.monotonic() + timeout
    while True:
        status = run.status()
        assert status.state == PAUSED, gateway_pb2.RunState.Name(status.state)
        if not status.assignments:
            return status
        assert time.monotonic() < deadline, f"still pausing after {timeout:.0f}s: {dict(status.assignments)}"
        time.sleep(0.5)


@pytest.mark.system  # a whole run, stopped and started again: about a minute on 2 cores
def test_a_run_paused_and_resumed_succeeds_from_its_checkpoint_with_nothing_lost(tiny_model, tmp_path):
    config = tiny_config(
        tiny_model,
        **{
            "buffer.total_steps": TOTAL_STEPS,
            "explorer.engine": "transformers",  # the pause is the gateway's and the trainer's business
            "explorer.eval_interval": 100,
            "checkpoint_dir": str(tmp_path / "ckpt"),
        },
    )
    stack = LocalStack.up(tmp_path / "logs")
    try:
        with TrinityClient(stack.gateway) as client:
            run = client.create_run(config)
            watcher = Watcher(run)
            while len(watcher.trained()) < 3:
                watcher.next_train_step()
            assert run.pause("test").state == PAUSED
            paused = _paused(run)
            # The step in progress when the pause came is the last one: reported, then checkpointed.
            at = max(e.step for e in watcher.trained())
            assert paused.train_step == at < TOTAL_STEPS
            time.sleep(2)  # nothing trains while paused
            assert max(e.step for e in watcher.trained()) == at

            assert run.resume().state == gateway_pb2.RUN_STATE_PENDING
            final = run.wait(timeout=WAIT_S)
            events = watcher.join()
        assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error
        assert final.train_step == TOTAL_STEPS

        messages = [e.message for e in events]
        leaving = {e.source.partition("/")[0]: e.message for e in events if e.kind == gateway_pb2.EVENT_KIND_LEAVING}
        assert leaving == {
            "trainer": f"trainer leaving; checkpoint at step {at}",
            "explorer": "explorer leaving: the run is paused",
        }, messages
        assert any(m.startswith("resumed from ") and m.endswith(f"at step {at}, version {at}") for m in messages)
        assert "resumed: queued" in messages

        trained = [e for e in events if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
        assert [e.step for e in trained] == list(range(1, TOTAL_STEPS + 1))  # each step once, none redone
        versions = [e.model_version for e in trained]
        assert versions == sorted(set(versions)), [(e.step, e.model_version) for e in trained]
        metrics = RunMetrics.from_events(events)
        published = {row["model_version"]: row["weights_digest"] for row in metrics.train}
        served = [(row["model_version"], row["weights_digest"]) for row in metrics.weights if "weights_digest" in row]
        assert any(v > at for v, _ in served), served  # the resumed explorer received the resumed trainer's weights
        assert all(published.get(v) == digest for v, digest in served), (served, published)

        counts = assert_balanced(stack.services["buffer"].address, run.id, tmp_path / "ckpt", TOTAL_STEPS)
        print(f"paused after train step {at}; stream counts: {counts}")
    finally:
        stack.down()
