"""One explore step's rollouts: many in flight, each time-limited and retried; one that keeps failing is dropped.

With an engine that batches concurrent calls (`engine.concurrent`, vLLM) every task runs `workflow.run` in a
worker of its own, up to `explorer.max_concurrent_rollouts` at once, so the turns and steps of many episodes
interleave on the engine. Other engines keep the workflow's `run_batch` (one generate call across tasks, the
fastest there); if that batch fails, its tasks are retried one by one, so one bad task cannot sink the rest.

Every attempt runs inside `deadline(explorer.rollout_timeout_seconds)` (engines that can abort a request stop
its work there) and is abandoned once the time has passed, whatever it is blocked on: a hung reward or
environment never holds the step. Workers are daemon threads because an abandoned one cannot be killed; it
ends when whatever it waits on returns, and its result is ignored.

The engine itself failing (`ENGINE_FAILURES`: e.g. the vLLM engine loop is dead) is not a rollout's failure: it is
raised at once, for the explore loop's engine guard.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from trinity.config.explorer import ExplorerConfig
from trinity.explorer.engines.base import Engine, EngineFailed, GenerationTimeout, deadline
from trinity.explorer.metrics import DROPPED_ROLLOUTS, ROLLOUT_RETRIES
from trinity.explorer.workflows.base import RolloutSettings, Workflow
from trinity.runtime.errors import one_line
from trinity.runtime.logging import get_logger
from trinity.v1 import common_pb2

log = get_logger(__name__)

ENGINE_FAILURES: tuple[type[BaseException], ...] = (EngineFailed,)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
Experiences = list[common_pb2.Experience]


@dataclass
class Rollout:
    """One task's outcome: its experiences, or, when every attempt failed, why it was dropped."""

    task: common_pb2.Task
    experiences: Experiences = field(default_factory=list)
    attempts: int = 0
    drop_reason: str = ""  # "" = rolled out; "timeout" | "error:<ExceptionType>" of the last attempt
    error: BaseException | None = None  # the last attempt's, when dropped

    @property
    def dropped(self) -> bool:
        return bool(self.drop_reason)


def drop_reason(error: BaseException) -> str:
    return "timeout" if isinstance(error, GenerationTimeout) else f"error:{type(error).__name__}"


@dataclass(frozen=True)
class RolloutLimits:
    max_concurrent: int = 32
    timeout_s: float | None = 600.0  # None = no limit
    retries: int = 2

    @classmethod
    def of(cls, explorer: ExplorerConfig) -> RolloutLimits:
        return cls(
            max_concurrent=explorer.max_concurrent_rollouts,
            timeout_s=explorer.rollout_timeout_seconds or None,  # 0 = no limit
            retries=explorer.rollout_retries,
        )


class RolloutPool:
    """Rolls out batches of tasks with `workflow` on `engine` under `limits` (see the module docstring)."""

    def __init__(self, workflow: Workflow, engine: Engine, limits: RolloutLimits) -> None:
        self.workflow = workflow
        self.engine = engine
        self.limits = limits

    def run(self, tasks: Sequence[common_pb2.Task], settings: RolloutSettings) -> list[Rollout]:
        """Every task's rollout, in task order; raises only what `ENGINE_FAILURES` names."""
        rollouts = [Rollout(task) for task in tasks]
        if not tasks:
            return rollouts
        todo = list(range(len(tasks)))
        if not self.engine.concurrent:
            todo = self._run_batched(rollouts, settings)
        width = self.limits.max_concurrent if self.engine.concurrent else 1  # one at a time: the timer is its own

        def attempt(i: int) -> Experiences:
            return self.workflow.run(tasks[i], self.engine, settings)

        def failed(i: int, error: BaseException) -> bool:
            rollouts[i].attempts += 1
            return self._failed(rollouts[i], error)

        for i, result in _run_limited(todo, attempt, width, self.limits.timeout_s, failed).items():
            if not isinstance(result, BaseException):
                rollouts[i].attempts += 1
                rollouts[i].experiences = result
            else:
                self._drop(rollouts[i], result)
        return rollouts

    def _run_batched(self, rollouts: list[Rollout], settings: RolloutSettings) -> list[int]:
        """The whole batch in one `run_batch` (its first attempt); the indices still to run alone if it failed."""

        def attempt(_: str) -> list[Experiences]:
            return self.workflow.run_batch([r.task for r in rollouts], self.engine, settings)

        result = _run_limited(["batch"], attempt, 1, self.limits.timeout_s, lambda _, error: False)["batch"]
        for r in rollouts:
            r.attempts = 1
        if not isinstance(result, BaseException):
            for rollout, experiences in zip(rollouts, result, strict=True):
                rollout.experiences = experiences
            return []
        if isinstance(result, ENGINE_FAILURES):
            raise result
        log.warning("rollout.batch_failed", tasks=len(rollouts), reason=drop_reason(result), error=one_line(result))
        if self.limits.retries < 1:
            for rollout in rollouts:
                self._drop(rollout, result)
            return []
        ROLLOUT_RETRIES.inc(len(rollouts))
        return list(range(len(rollouts)))

    def _failed(self, rollout: Rollout, error: BaseException) -> bool:
        """Whether the rollout, whose attempt `rollout.attempts` failed, gets another; raises an engine failure."""
        if isinstance(error, ENGINE_FAILURES):
            raise error
        again = rollout.attempts <= self.limits.retries
        if again:
            ROLLOUT_RETRIES.inc()
            log.warning(
                "rollout.retry",
                task_id=rollout.task.id,
                attempt=rollout.attempts,
                reason=drop_reason(error),
                error=one_line(error),
            )
        return again

    def _drop(self, rollout: Rollout, error: BaseException) -> None:
        rollout.drop_reason, rollout.error, rollout.experiences = drop_reason(error), error, []
        DROPPED_ROLLOUTS.labels(rollout.drop_reason).inc()
        log.warning(
            "rollout.dropped",
            task_id=rollout.task.id,
            attempts=rollout.attempts,
            reason=rollout.drop_reason,
            error=one_line(error),
        )


def _run_limited(
    keys: Sequence[K],
    call: Callable[[K], T],
    width: int,
    timeout_s: float | None,
    retry: Callable[[K, BaseException], bool],
) -> dict[K, T | BaseException]:
    """`call(key)` for every key, `width` at a time on daemon threads, each attempt within `timeout_s` of its
    start; a failed attempt runs again while `retry(key, error)` says so. Returns each key's result or last error.
    """
    done: queue.SimpleQueue[tuple[K, int, T | BaseException]] = queue.SimpleQueue()
    waiting: deque[K] = deque(keys)
    running: dict[K, tuple[int, float]] = {}  # key -> (attempt token, started)
    tokens = 0
    results: dict[K, T | BaseException] = {}

    def work(key: K, token: int) -> None:
        try:
            with deadline(timeout_s):
                outcome: T | BaseException = call(key)
        except BaseException as err:  # noqa: BLE001 - every failure is the rollout's, reported to the pool
            outcome = err
        done.put((key, token, outcome))

    def settle(key: K, outcome: T | BaseException) -> None:
        del running[key]
        if isinstance(outcome, BaseException) and retry(key, outcome):
            waiting.append(key)
        else:
            results[key] = outcome

    while waiting or running:
        while waiting and len(running) < width:
            key = waiting.popleft()
            tokens += 1
            running[key] = (tokens, time.monotonic())
            threading.Thread(target=work, args=(key, tokens), name=f"rollout-{key}", daemon=True).start()
        try:
            key, token, outcome = done.get(timeout=_next_expiry(running, timeout_s))
            if key in running and running[key][0] == token:  # else an abandoned attempt's late result
                settle(key, outcome)
        except queue.Empty:
            pass
        if timeout_s is not None:
            now = time.monotonic()
            for key in [k for k, (_, started) in running.items() if now - started >= timeout_s]:
                settle(key, GenerationTimeout(f"the rollout ran past explorer.rollout_timeout_seconds ({timeout_s:g})"))
    return results


def _next_expiry(running: dict[K, tuple[int, float]], timeout_s: float | None) -> float | None:
    """Seconds until the first running attempt's time is up (None: wait for a result as long as it takes)."""
    if timeout_s is None or not running:
        return None
    first = min(started for _, started in running.values())
    return max(0.0, first + timeout_s - time.monotonic())
