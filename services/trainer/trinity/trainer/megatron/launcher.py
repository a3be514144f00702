"""Start the TP x PP x DP worker processes and talk to rank 0; fail fast and loudly, never hang.

Workers are `spawn`ed daemon processes (they also die with this process: see `worker.py`). Every wait
on rank 0 polls the pipe with a deadline and checks that all workers are alive; a dead worker, an
error report or a timeout stops the whole group and raises `WorkerGroupError` with the worker's
traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from trinity.config import MegatronTrainerConfig, RunConfig
from trinity.runtime.redis_server import free_port
from trinity.trainer.megatron.worker import run_worker


class WorkerGroupError(RuntimeError):
    """A Megatron worker failed, died or did not answer in time; the group has been stopped."""


class WorkerGroup:
    """The running workers of one Megatron backend; `call` runs a command on all ranks."""

    def __init__(self, config: RunConfig, algorithm_factory: Callable[[], Any] | None = None) -> None:
        assert isinstance(config.trainer, MegatronTrainerConfig)
        self.trainer: MegatronTrainerConfig = config.trainer
        ctx = mp.get_context("spawn")
        self._errors = ctx.Queue()
        self._conn, child = ctx.Pipe(duplex=True)
        port = self.trainer.master_port or free_port(self.trainer.master_addr)
        self._procs = []
        for rank in range(self.trainer.world_size):
            p = ctx.Process(
                target=run_worker,
                args=(
                    rank,
                    port,
                    config,
                    algorithm_factory,
                    child if rank == 0 else None,
                    self._errors,
                    os.getpid(),
                ),
                name=f"megatron-rank{rank}",
                daemon=True,
            )
            p.start()
            self._procs.append(p)
        child.close()
        self._closed = False
        self._open_stream: Generator[Any, None, None] | None = None
        self._receive("ready", self.trainer.start_timeout_s, "start-up")

    # ----------------------------------------------------------------------------- protocol
    def call(self, command: str, *args: Any, timeout: float | None = None) -> Any:
        self._send(command, args)
        return self._receive("ok", timeout or self.trainer.command_timeout_s, command)

    def stream(self, command: str, *args: Any) -> Iterator[Any]:
        """Items the workers send for `command` until they report it done.

        A stream the caller abandons is drained before the next command (or when it is closed), so the
        pipe never holds a stale reply.
        """
        self._drain_open_stream()
        it = self._stream(command, args)
        self._open_stream = it
        return it

    def _stream(self, command: str, args: tuple) -> Generator[Any, None, None]:
        self._send(command, args, drain=False)
        done = False
        try:
            while True:
                kind, value = self._next(self.trainer.command_timeout_s, command)
                if kind == "ok":
                    done = True
                    return
                yield value
        finally:
            if not done and not self._closed:
                while self._next(self.trainer.command_timeout_s, command)[0] != "ok":
                    pass
            self._open_stream = None

    def close(self, timeout: float = 30.0) -> None:
        """Ask the workers to exit; terminate those that do not within `timeout`."""
        if self._closed:
            return
        try:
            if all(p.is_alive() for p in self._procs):
                self._send("shutdown", ())
                self._receive("ok", timeout, "shutdown")
        except WorkerGroupError:
            pass
        finally:
            self._stop(timeout)

    @property
    def alive(self) -> bool:
        return not self._closed and all(p.is_alive() for p in self._procs)

    # ----------------------------------------------------------------------------- internals
    def _send(self, command: str, args: tuple, *, drain: bool = True) -> None:
        if self._closed:
            raise WorkerGroupError("the Megatron workers were stopped; build a new backend")
        if drain:
            self._drain_open_stream()
        self._conn.send((command, args))

    def _drain_open_stream(self) -> None:
        if self._open_stream is not None:
            stale, self._open_stream = self._open_stream, None
            stale.close()  # runs the generator's draining `finally`

    def _receive(self, expected: str, timeout: float, what: str) -> Any:
        kind, value = self._next(timeout, what)
        if kind != expected:
            self._fail(f"unexpected reply {kind!r} to {what}")
        return value

    def _next(self, timeout: float, what: str) -> tuple[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            if self._conn.poll(0.2):
                try:
                    kind, value = self._conn.recv()
                except EOFError:
                    self._fail(f"rank 0 closed its pipe during {what}")
                if kind == "error":
                    self._fail(f"{what} failed on {value}")
                return kind, value
            dead = [(p.name, p.exitcode) for p in self._procs if not p.is_alive()]
            if dead:
                self._fail(f"worker(s) exited during {what}: {dead}")
            if time.monotonic() > deadline:
                self._fail(f"no answer to {what} within {timeout:.0f}s")

    def _fail(self, message: str) -> None:
        reports = []
        try:
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                reports.append(self._errors.get(timeout=0.2))
        except queue.Empty:
            pass
        # Exit codes before we stop the rest: a peer killed by a signal (-9) is usually the cause of
        # the "connection reset" errors the surviving ranks report.
        states = [(p.name, p.exitcode) for p in self._procs]
        self._stop(5.0)
        detail = "\n".join(f"--- rank {r}:\n{tb}" for r, tb in sorted(reports))
        raise WorkerGroupError(
            f"Megatron backend: {message}\nworker exit codes (None = was running): {states}"
            + (f"\n{detail}" if detail else "")
        )

    def _stop(self, timeout: float) -> None:
        self._closed = True
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(5.0)
        self._conn.close()
