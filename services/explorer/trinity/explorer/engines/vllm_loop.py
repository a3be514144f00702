"""Continuous batching for the in-process vLLM engine: one thread owns the `LLMEngine` and steps it.

Callers on any thread add requests; the loop adds them to the running batch between steps, so a
request that arrives while others decode joins them at once instead of waiting for the batch to end
(what `LLM.generate` cannot do: it runs one batch to its end). Every touch of the engine (adding,
aborting, stepping, weight reloads) happens on this thread, because the engine is not thread-safe.

Why not vLLM's `AsyncLLM` or its OpenAI server: both put the engine core in another process, so a
weight update would cross a process boundary as pickled tensors; in-process, the trainer's tensors
reach the model runner by reference (FACTS.md: the in-process engine is also the fastest on 2 cores).

The loop's thread also builds the engine: OpenMP's thread count is per thread, and vLLM's CPU attention
checks at every call that it runs with the count of the thread that set the engine up.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from trinity.explorer.engines.base import EngineFailed, GenerationTimeout, SampleDelta
from trinity.runtime.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")
IDLE_WAIT_S = 0.05  # how often an idle loop looks at the clock (deadlines) and the closed flag

_END = object()  # a request's last queue item: its work in the engine is over


class EngineLoopClosed(EngineFailed):
    """The loop stopped (closed, or the engine failed): no more requests are taken."""


@dataclass
class _Pending:
    """One request in the engine: its deltas go to `deltas`; `on_end` runs once when it leaves the engine."""

    deltas: queue.SimpleQueue[Any]
    deadline: float | None
    on_end: Callable[[], None]
    ended: bool = False

    def end(self, error: BaseException | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        if error is not None:
            self.deltas.put(error)
        self.deltas.put(_END)
        self.on_end()


class EngineLoop:
    """Builds vLLM's `LLM` with `build` on a thread of its own, then steps its engine there until `close()`."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._active: dict[str, _Pending] = {}
        self._closed = threading.Event()
        self._failure: BaseException | None = None
        self._stopped: EngineLoopClosed | None = None  # set when the loop ends: late commands fail with it
        built: Future[Any] = Future()
        self._thread = threading.Thread(target=self._run, args=(build, built), name="vllm-engine-loop", daemon=True)
        self._thread.start()
        self.llm: Any = built.result()  # the build's error, if any, is raised here
        self.llm_engine: Any = self.llm.llm_engine

    # ---- what callers use (any thread) ----------------------------------------------------------------

    def submit(
        self, prompt: Any, params: Any, *, deadline: float | None = None, on_end: Callable[[], None] = lambda: None
    ) -> tuple[str, Iterator[SampleDelta]]:
        """Add one request; returns its id and its deltas (an error the engine raised for it is re-raised)."""
        self._check_open()
        request_id = uuid.uuid4().hex
        pending = _Pending(queue.SimpleQueue(), deadline, on_end)

        def add() -> None:
            if self._stopped is not None:
                pending.end(self._stopped)
                return
            try:
                self.llm_engine.add_request(request_id, prompt, params)
            except Exception as err:  # noqa: BLE001 - the request's own fault (too long, bad params): its caller's
                pending.end(err)
                return
            self._active[request_id] = pending

        self._enqueue(add)
        return request_id, _read(pending.deltas)

    def abort(self, request_id: str) -> None:
        """Stop working on a request (its reader went away); its deltas end."""

        def cancel() -> None:
            pending = self._active.pop(request_id, None)
            if pending is not None:
                self.llm_engine.abort_request([request_id])
                pending.end()

        if not self._closed.is_set():
            self._enqueue(cancel)

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the loop's thread between steps (weight reloads, cache resets) and return its result."""
        self._check_open()
        done: Future[T] = Future()

        def run() -> None:
            if self._stopped is not None:
                done.set_exception(self._stopped)
                return
            try:
                done.set_result(fn())
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                done.set_exception(err)

        self._enqueue(run)
        return done.result()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the loop and let go of the engine, so the caller's last reference frees it (see VllmEngine.close)."""
        self._closed.set()
        self._thread.join(timeout)
        self.llm = self.llm_engine = None

    # ---- the loop's thread ------------------------------------------------------------------------------

    def _enqueue(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        if self._stopped is not None:  # the loop ended after our check: it will not run this; nobody waits forever
            self._drain_closed()

    def _check_open(self) -> None:
        if self._failure is not None:
            raise EngineLoopClosed(f"the vLLM engine failed: {self._failure}") from self._failure
        if self._closed.is_set():
            raise EngineLoopClosed("the vLLM engine is closed")

    def _run(self, build: Callable[[], Any], built: Future[Any]) -> None:
        try:
            llm = build()
        except BaseException as err:  # noqa: BLE001 - handed to the constructor's caller
            self._closed.set()
            built.set_exception(err)
            return
        self.llm_engine = llm.llm_engine
        built.set_result(llm)
        try:
            while not self._closed.is_set():
                self._take_commands(block=not self._active)
                self._expire()
                if self._active:
                    self._dispatch(self.llm_engine.step())
        except BaseException as err:  # the engine is gone: every waiter hears why
            log.exception("vllm.loop_failed")
            self._failure = err
        finally:
            self._stopped = EngineLoopClosed(f"the vLLM engine stopped: {self._failure or 'closed'}")
            self._closed.set()
            for pending in self._active.values():
                pending.end(self._stopped)
            self._active.clear()
            self._drain_closed()

    def _take_commands(self, *, block: bool) -> None:
        try:
            command = self._commands.get(timeout=IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        command()
        while True:  # everything that queued up meanwhile joins this step
            try:
                self._commands.get_nowait()()
            except queue.Empty:
                return

    def _drain_closed(self) -> None:
        """Commands queued as the loop stopped fail with `_stopped` (they check it first)."""
        while True:
            try:
                self._commands.get_nowait()()
            except queue.Empty:
                return

    def _expire(self) -> None:
        now = time.monotonic()
        late = [rid for rid, p in self._active.items() if p.deadline is not None and now >= p.deadline]
        if not late:
            return
        self.llm_engine.abort_request(late)
        for rid in late:
            self._active.pop(rid).end(GenerationTimeout("the rollout's time limit passed during generation"))

    def _dispatch(self, outputs: list[Any]) -> None:
        for out in outputs:
            pending = self._active.get(out.request_id)
            if pending is None:  # aborted meanwhile
                continue
            for c in out.outputs:
                ids = list(c.token_ids)
                logprobs = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [], strict=True)]
                finish = (c.finish_reason or "stop") if c.finished() else None
                pending.deltas.put(SampleDelta(c.index, ids, logprobs, c.text, finish))
            if out.finished:
                del self._active[out.request_id]
                pending.end()


def _read(deltas: queue.SimpleQueue[Any]) -> Iterator[SampleDelta]:
    while True:
        item = deltas.get()
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
