"""The sink: every run the gateway holds, written to the trackers its config names, from its event log.

`TrackerSink` looks for runs (ListRuns) every few seconds and gives each run it has not written yet a
`RunFollower`: a thread that opens the run's trackers where each left off, watches the run's events from the
earliest of those places (WatchRun), writes them in batches (what has arrived, up to MAX_BATCH) and, once the
run is over, its summary. A tracker that fails is reported once, as a log event in the run (gateway's event log,
so the console and `trinity submit --follow` show it) and a log line, and the run goes on without it: the sink
never reports an error event, the only kind that fails a run.

Stopping (SIGTERM) drains: runs that are over are written to the end, the others are flushed and let go; the
next sink picks each up where its trackers left off.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from trinity.clients.gateway import GatewayClient
from trinity.config.run import MonitorConfig
from trinity.runtime.errors import one_line
from trinity.runtime.logging import get_logger
from trinity.trackers.metrics import TRACKER_FAILURES, TRACKER_POINTS
from trinity.trackers.points import Points, points, run_summary, seq_order
from trinity.trackers.trackers import TRACKERS, RunRecord, Tracker
from trinity.v1 import gateway_pb2

log = get_logger(__name__)

TERMINAL = {gateway_pb2.RUN_STATE_SUCCEEDED, gateway_pb2.RUN_STATE_FAILED, gateway_pb2.RUN_STATE_CANCELLED}
MAX_BATCH = 500  # events written (and committed) at once while catching up; live, a batch is what has arrived
RECONNECT_SECONDS = 2.0  # between watches of a run while the gateway does not answer
_OVER, _STOPPED = "over", "stopped"  # what ends a follower's queue: the run's events ended, or the sink stops


def enabled_trackers(monitor: MonitorConfig) -> list[str]:
    """The trackers a run's `monitor` section turns on, in TRACKERS' order."""
    return [name for name in TRACKERS if getattr(monitor, name)]


class RunFollower:
    """One run, written from its trackers' places to the end of its event log (or until `stop`)."""

    def __init__(self, gateway: GatewayClient, run: gateway_pb2.Run, root: Path, source: str) -> None:
        self.gateway = gateway
        self.run_id = run.id
        self.root = root
        self.source = source  # "trackers/<instance id>", the source of the events it reports
        config = json.loads(run.config_json)
        monitor = MonitorConfig.model_validate(config.get("monitor", {}))
        self.record = RunRecord(run.id, run.name, monitor.project, config)
        self.names = enabled_trackers(monitor)
        self.trackers: dict[str, Tracker] = {}
        self.places: dict[str, str] = {}  # tracker -> the last event seq it has
        self.finished = False  # every tracker has the whole run: nothing left to do for it, ever
        self._queue: queue.Queue[gateway_pb2.RunEvent | str] = queue.Queue()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        self.thread = threading.Thread(target=self._follow, name=f"trackers-{run.id}", daemon=True)

    def start(self) -> RunFollower:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Let go of the run: the watch ends, what arrived is written and committed, the trackers are closed."""
        with self._lock:
            self._stopping.set()
            if self._call is not None:
                self._call.cancel()

    # ---- the follower's thread ---------------------------------------------------------------------------

    def _follow(self) -> None:
        for name in self.names:
            tracker = TRACKERS[name](self.root)
            try:
                resume = tracker.open(self.record)
            except Exception as err:  # noqa: BLE001 - any failure of a tracker library is that tracker's alone
                self._failed(name, tracker, err, opened=False)
                continue
            if not resume.done:
                self.trackers[name], self.places[name] = tracker, resume.seq
        if not self.trackers:
            self.finished = True
            return
        reader = threading.Thread(
            target=self._read, args=(min(self.places.values(), key=seq_order),), name=f"watch-{self.run_id}"
        )
        reader.daemon = True
        reader.start()
        end = ""
        while not end:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH and not isinstance(batch[-1], str):
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            last = batch[-1]
            if isinstance(last, str):
                end = last
            self._write([event for event in batch if not isinstance(event, str)])
        if end == _OVER:
            self._finish()
        else:
            self._each(lambda tracker: tracker.close())

    def _read(self, after: str) -> None:
        """Queue the run's events after `after` until its log ends (_OVER) or the sink stops (_STOPPED); a gateway
        that does not answer is watched again from the last event queued, however long it takes."""
        seen = after
        while not self._stopping.is_set():
            with self._lock:
                call = self._call = self.gateway.stub.WatchRun(
                    gateway_pb2.WatchRunRequest(run_id=self.run_id, after_seq=seen)
                )
                if self._stopping.is_set():
                    call.cancel()
            try:
                for event in call:
                    self._queue.put(event)
                    seen = event.seq
                self._queue.put(_OVER)
                return
            except grpc.RpcError as err:
                if self._stopping.is_set():
                    break
                if err.code() == grpc.StatusCode.NOT_FOUND:  # the run is gone from the gateway: nothing more comes
                    log.warning("trackers.run_gone", run_id=self.run_id, error=one_line(err))
                    break
                log.warning("trackers.watch_lost", run_id=self.run_id, error=one_line(err))
                self._stopping.wait(RECONNECT_SECONDS)
        self._queue.put(_STOPPED)

    def _write(self, events: list[gateway_pb2.RunEvent]) -> None:
        if not events:
            return
        last = events[-1].seq
        for name, tracker in list(self.trackers.items()):
            place = seq_order(self.places[name])
            new: list[Points] = [p for e in events if seq_order(e.seq) > place and (p := points(e)) is not None]
            try:
                tracker.write(new)
                tracker.commit(last)
            except Exception as err:  # noqa: BLE001 - see _follow
                self._failed(name, tracker, err)
                continue
            self.places[name] = last
            TRACKER_POINTS.labels(name).inc(sum(len(p.values) for p in new))

    def _finish(self) -> None:
        try:
            summary = run_summary(self.gateway.get_run(self.run_id))
        except grpc.RpcError as err:  # written up to the end but for the summary: the next look finishes it
            log.warning("trackers.summary_unavailable", run_id=self.run_id, error=one_line(err))
            self._each(lambda tracker: tracker.close())
            return
        self._each(lambda tracker: tracker.finish(summary))
        self.finished = True
        log.info("trackers.run_written", run_id=self.run_id, trackers=sorted(self.trackers), state=summary["state"])

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for name, tracker in list(self.trackers.items()):
            try:
                call(tracker)
            except Exception as err:  # noqa: BLE001 - see _follow
                self._failed(name, tracker, err)

    def _failed(self, name: str, tracker: Tracker, err: Exception, *, opened: bool = True) -> None:
        """Drop the tracker for this run and say so, once: a log line, and a log event in the run (one `event_id`
        per run and tracker, so the gateway records it once, however often a restarted sink fails again)."""
        self.trackers.pop(name, None)
        TRACKER_FAILURES.labels(name).inc()
        reason = one_line(err)
        log.warning("tracker.failed", run_id=self.run_id, tracker=name, error=reason)
        message = f"tracker {name} failed, the run goes on without it: {reason}"
        event = gateway_pb2.RunEvent(
            run_id=self.run_id,
            kind=gateway_pb2.EVENT_KIND_LOG,
            source=self.source,
            message=message,
            event_id=f"trackers-{name}-failed",
        )
        try:  # once, briefly: the line in the sink's log stands whatever happens to the event
            self.gateway.stub.ReportEvent(gateway_pb2.ReportEventRequest(event=event), timeout=10)
        except grpc.RpcError as report_err:
            log.warning("tracker.failure_unreported", run_id=self.run_id, tracker=name, error=one_line(report_err))
        if opened:
            with contextlib.suppress(Exception):  # it failed already; what it holds goes with it
                tracker.close()


class TrackerSink:
    """Follows every run of one gateway into the trackers under `root`."""

    def __init__(
        self,
        gateway: GatewayClient,
        root: Path,
        *,
        instance_id: str = "trackers",
        poll_seconds: float = 2.0,
        max_followers: int = 32,
    ) -> None:
        self.gateway = gateway
        self.root = root
        self.source = f"trackers/{instance_id}"
        self.poll_seconds = poll_seconds
        self.max_followers = max_followers  # runs written at once; the others wait for a later look
        self.followers: dict[str, RunFollower] = {}
        self.written: set[str] = set()  # runs every tracker has whole: never looked at again by this sink
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trackers-sink", daemon=True)

    def start(self) -> TrackerSink:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.look()
            except grpc.RpcError as err:
                log.warning("trackers.gateway_unavailable", gateway=self.gateway.target, error=one_line(err))
            self._stopping.wait(self.poll_seconds)

    def look(self, runs: list[gateway_pb2.Run] | None = None, *, ended_only: bool = False) -> None:
        """Start a follower for each run (default: the gateway's) not written yet; with `ended_only`, only for runs
        that are over."""
        self._reap()
        for run in self.gateway.list_runs() if runs is None else runs:
            if run.id in self.written or run.id in self.followers or (ended_only and run.state not in TERMINAL):
                continue
            if len(self.followers) >= self.max_followers:
                break
            try:
                follower = RunFollower(self.gateway, run, self.root, self.source)
            except ValueError as err:  # a config this version cannot read: its runs are not tracked
                log.warning("trackers.config_unreadable", run_id=run.id, error=one_line(err))
                self.written.add(run.id)
                continue
            self.followers[run.id] = follower.start()

    def _reap(self) -> None:
        for run_id, follower in list(self.followers.items()):
            if not follower.thread.is_alive():
                del self.followers[run_id]
                if follower.finished:
                    self.written.add(run_id)

    def stop(self, grace: float = 10.0) -> None:
        """Drain within `grace` seconds: runs that are over (those found now too) are written to their end; the
        followers of live runs flush and let go."""
        self._stopping.set()
        self._thread.join(timeout=self.poll_seconds + 30)
        deadline = time.monotonic() + grace
        try:  # asked once: a gateway that is gone cannot hold the drain up
            runs = list(self.gateway.stub.ListRuns(gateway_pb2.ListRunsRequest(), timeout=max(1.0, grace / 2)).runs)
            self.look(runs, ended_only=True)
            states = {run.id: run.state for run in runs}
        except grpc.RpcError as err:
            log.warning("trackers.gateway_unavailable", gateway=self.gateway.target, error=one_line(err))
            states = {}
        for run_id, follower in self.followers.items():
            if states.get(run_id) not in TERMINAL:
                follower.stop()
        for follower in self.followers.values():
            follower.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for follower in self.followers.values():  # past the grace: let go of the rest too
            if follower.thread.is_alive():
                follower.stop()
                follower.thread.join(timeout=5.0)
        self._reap()
