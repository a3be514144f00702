"""Explorers join and leave a live run: a tiny run scaled from one explorer to three and back to one (ScaleRun)
succeeds, with the accounting of a healed run: nothing lost or trained twice, versions increasing, and every version
an explorer served the one the trainer published."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import tiny_config
from tests.e2e.faults import WAIT_S, Watcher, assert_balanced
from trinity.cli.launcher import LocalStack
from trinity.sdk import RunMetrics, TrinityClient
from trinity.v1 import gateway_pb2

TOTAL_STEPS = 30  # the run trains on while the newcomers' engines load: enough steps left for them to join
LEAVING = "explorer leaving: the run wants fewer explorers"


def _sources(watcher: Watcher, kind: gateway_pb2.EventKind) -> set[str]:
    """The explorers that reported `kind` so far."""
    return {e.source for e in watcher.events if e.kind == kind and e.source.startswith("explorer/")}


@pytest.mark.system  # a whole run and three explorers: minutes on 2 cores
def test_a_run_scaled_from_one_explorer_to_three_and_back_succeeds_with_nothing_lost(tiny_model, tmp_path):
    config = tiny_config(
        tiny_model,
        **{
            "buffer.total_steps": TOTAL_STEPS,
            "buffer.taskset.epochs": 3,  # the run ends at its last step, not when the task set runs out
            # Scaling is the gateway's and the trainer's business, whatever the engine: the transformers engine
            # starts in seconds where three vLLM engine builds on two cores take minutes.
            "explorer.engine": "transformers",
            "explorer.eval_interval": 100,
            "checkpoint_dir": str(tmp_path / "ckpt"),
        },
    )
    stack = LocalStack.up(tmp_path / "logs", explorers=3)
    try:
        with TrinityClient(stack.gateway) as client:
            run = client.create_run(config)
            watcher = Watcher(run)
            while len(watcher.trained()) < 2:
                watcher.next_train_step()
            assert len(_sources(watcher, gateway_pb2.EVENT_KIND_EXPLORE)) == 1  # the config's one explorer

            assert run.scale(3).explorers == 3
            # The trainer's next publish waits for a generation with both newcomers in it; each loads what it sent.
            while len(_sources(watcher, gateway_pb2.EVENT_KIND_WEIGHTS)) < 3:
                watcher.next_train_step()
            scaled_up_at = len(watcher.trained())
            assert scaled_up_at < TOTAL_STEPS - 2, "the run nearly ended before the explorers joined"

            assert run.scale(1).explorers == 1
            final = run.wait(timeout=WAIT_S)
            events = watcher.join()
        assert final.state == gateway_pb2.RUN_STATE_SUCCEEDED, final.error
        assert final.train_step == TOTAL_STEPS

        messages = [e.message for e in events]
        # Nobody waited for the newcomers' engines: the run trained on between their start and their joining.
        started = next(i for i, m in enumerate(messages) if m.endswith("joins (3 of 3)"))
        ready = next(i for i, m in enumerate(messages) if m.endswith("is ready)"))
        assert any(e.kind == gateway_pb2.EVENT_KIND_TRAIN for e in events[started:ready]), messages
        assert "explorers scaled from 1 to 3" in messages and "explorers scaled from 3 to 1" in messages
        assert sum(m.startswith("explorer ") and " joins (" in m for m in messages) == 2
        leaving = [e for e in events if e.kind == gateway_pb2.EVENT_KIND_LEAVING]
        assert len(leaving) == 2 and {e.message for e in leaving} == {LEAVING}, messages
        assert sum(m.endswith("left (run scaled down)") for m in messages) == 2
        assert not final.leaving and not final.lost_unix_ms
        after = events[max(events.index(e) for e in leaving) :]  # only the staying explorer explores then
        assert not {e.source for e in after if e.kind == gateway_pb2.EVENT_KIND_EXPLORE} & {e.source for e in leaving}

        trained = [e for e in events if e.kind == gateway_pb2.EVENT_KIND_TRAIN]
        versions = [e.model_version for e in trained]
        assert versions == sorted(set(versions)), [(e.step, e.model_version) for e in trained]
        metrics = RunMetrics.from_events(events)
        published = {row["model_version"]: row["weights_digest"] for row in metrics.train}
        served = [(row["model_version"], row["weights_digest"]) for row in metrics.weights if "weights_digest" in row]
        assert served and all(published.get(v) == digest for v, digest in served), (served, published)
        # Each explorer served at least one version the trainer sent it, the newcomers included.
        servers = {e.source for e in events if e.kind == gateway_pb2.EVENT_KIND_WEIGHTS and e.source != "gateway"}
        assert len(servers) == 3, servers

        counts = assert_balanced(stack.services["buffer"].address, run.id, tmp_path / "ckpt", TOTAL_STEPS)
        print(f"scaled 1 -> 3 after train step 2, 3 -> 1 after {scaled_up_at}; stream counts: {counts}")
    finally:
        stack.down()
