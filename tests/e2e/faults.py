"""What the fault tests share: a run's events read by a thread while the test kills processes, a kill held at a
failpoint, and the accounting every healed run must balance."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from trinity.cli.launcher import LocalStack
from trinity.clients import BufferClient
from trinity.config import naming
from trinity.runtime import failpoints
from trinity.sdk import RunHandle
from trinity.v1 import gateway_pb2

WAIT_S = 240.0


class Watcher:
    """The run's events, read by a thread of their own while the test kills processes."""

    def __init__(self, run: RunHandle) -> None:
        self.events: list[gateway_pb2.RunEvent] = []
        self.ended = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(run,), daemon=True)
        self._thread.start()

    def _read(self, run: RunHandle) -> None:
        for event in run.watch(reconnect_seconds=WAIT_S):
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def trained(self) -> list[gateway_pb2.RunEvent]:
        return [e for e in self.events if e.kind == gateway_pb2.EVENT_KIND_TRAIN]

    def next_train_step(self, timeout: float = WAIT_S) -> float:
        """Seconds until the next train step is reported (a healed run trains again)."""
        started, seen = time.monotonic(), len(self.trained())
        with self._changed:
            self._changed.wait_for(lambda: self.ended or len(self.trained()) > seen, timeout)
            if len(self.trained()) <= seen:
                lines = "\n".join(f"{e.source}: {e.message}" for e in self.events if e.message)
                raise AssertionError(f"no train step within {timeout:.0f}s (run ended: {self.ended}); events:\n{lines}")
        return time.monotonic() - started

    def wait_ended(self, timeout: float) -> bool:
        """Whether the run ended within `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self.ended, timeout)

    def join(self, timeout: float = WAIT_S) -> list[gateway_pb2.RunEvent]:
        """Every event of the run, once it has ended."""
        self._thread.join(timeout)
        return self.events


def kill_at(stack: LocalStack, directory: Path, failpoint: str, name: str) -> None:
    """Arm `failpoint`, wait until the process `name` is held there, SIGKILL it (its replacement passes through)."""
    failpoints.arm(directory, failpoint)
    held = failpoints.reached_by(directory, failpoint, WAIT_S)
    process = stack.services[name].process
    assert process is not None and process.pid == held, f"{failpoint} was reached by pid {held}, not by {name}"
    stack.kill(name)


def assert_balanced(buffer_address: str, run_id: str, checkpoint_dir: Path, steps: int) -> dict[str, int]:
    """What was put was trained, dropped with a reason, or is still queued; nothing is pending or dead; no experience
    is in the final weights twice. Returns the stream's counts."""
    stream = naming.experience_stream(run_id, 0, "experiences")
    with BufferClient(buffer_address) as buffer:
        stats = buffer.stream(stream).stats
    assert stats.pending == 0 and stats.dead_letters == 0, stats
    # `put` counts what the stream accepted: a batch that a killed explorer's replacement puts again is refused as
    # duplicates at the put, outside `put`; what is dropped after the put (stale) is inside it.
    after_put = sum(n for reason, n in stats.dropped.items() if reason != "duplicate")
    assert stats.put == stats.acked + after_put + stats.lag, stats
    checkpoints = checkpoint_dir / run_id / "stage0" / "checkpoints"
    state = json.loads((checkpoints / (checkpoints / "latest").read_text().strip() / "state.json").read_text())
    consumed = state["consumed_ids"]
    assert len(consumed) == len(set(consumed)) == stats.acked
    assert state["step"] == steps
    return {
        "put": stats.put,
        "acked": stats.acked,
        "dropped_after_put": after_put,
        "duplicates_refused": stats.dropped.get("duplicate", 0),
        "lag": stats.lag,
    }
