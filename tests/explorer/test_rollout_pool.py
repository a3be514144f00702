"""The rollout pool: concurrent rollouts on a batching engine, one batched call otherwise; retries, time limits,
drops counted by reason; the engine's own failure raised. Scripted engines with a real tokenizer."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pytest
import torch
from explorer_helpers import make_task
from prometheus_client import REGISTRY

from trinity.explorer.engines.base import Engine, GenerationRequest, Sample
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.engines.vllm_loop import EngineLoopClosed
from trinity.explorer.rollout_pool import RolloutLimits, RolloutPool
from trinity.explorer.workflows import RolloutSettings, create_workflow
from trinity.explorer.workflows.single_turn import MathWorkflow
from trinity.v1 import common_pb2

SETTINGS = RolloutSettings(repeat_times=2)


def tasks(n: int) -> list[common_pb2.Task]:
    return [make_task(prompt=f"task-{i}: what is {i}+0?", answer=str(i), task_id=f"set/{i}") for i in range(n)]


def dropped_count(reason: str) -> float:
    return REGISTRY.get_sample_value("trinity_explorer_dropped_rollouts_total", {"reason": reason}) or 0.0


class ConcurrentScripted(ScriptedEngine):
    """A scripted engine that claims continuous batching: its calls run at once, from many threads."""

    concurrent = True


class OverlapEngine(Engine):
    """A batching engine whose calls wait at a barrier: they pass only if `parties` calls are in flight at once."""

    concurrent = True

    def __init__(self, tokenizer: Any, parties: int) -> None:
        super().__init__()
        self._tokenizer = tokenizer
        self.barrier = threading.Barrier(parties, timeout=30)
        self._lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _generate(self, prompts: list[list[int]], requests: list[GenerationRequest]) -> list[list[Sample]]:
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.barrier.wait()
        finally:
            with self._lock:
                self.in_flight -= 1
        ids = list(self._tokenizer.encode("5", add_special_tokens=False))
        return [[Sample(ids, [0.0] * len(ids), "5", "stop") for _ in range(r.n)] for r in requests]

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass


class BlockingWorkflow(MathWorkflow):
    """Math, except the rollouts of `blocked` task ids wait on `release` (a hung environment or reward)."""

    def __init__(self, blocked: set[str], release: threading.Event) -> None:
        super().__init__()
        self.blocked = blocked
        self.release = release

    def run(self, task: common_pb2.Task, engine: Engine, settings: RolloutSettings) -> list[common_pb2.Experience]:
        if task.id in self.blocked:
            self.release.wait()
        return super().run_batch([task], engine, settings)[0]

    def run_batch(
        self, tasks: Sequence[common_pb2.Task], engine: Engine, settings: RolloutSettings
    ) -> list[list[common_pb2.Experience]]:
        return [self.run(task, engine, settings) for task in tasks]


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test, so no blocked rollout outlives it."""
    event = threading.Event()
    yield event
    event.set()


def failing_for(prefix: str, calls: list[str]) -> Callable[[str], str]:
    """A reply function that records the tasks it is asked about and raises for those starting with `prefix`."""

    def reply(prompt: str) -> str:
        task = prompt[prompt.index("task-") :].split(":")[0]
        calls.append(task)
        if task == prefix:
            raise ZeroDivisionError("the scripted policy broke")
        return task.removeprefix("task-")

    return reply


@pytest.mark.parametrize("engine_type", [ScriptedEngine, ConcurrentScripted], ids=["batched", "concurrent"])
def test_a_raising_rollout_is_retried_then_dropped_while_the_rest_are_kept(tokenizer, engine_type):
    calls: list[str] = []
    engine = engine_type(tokenizer, failing_for("task-1", calls))
    before = dropped_count("error:ZeroDivisionError")
    pool = RolloutPool(create_workflow("math"), engine, RolloutLimits(retries=2))
    rollouts = pool.run(tasks(3), SETTINGS)
    assert [r.dropped for r in rollouts] == [False, True, False]
    bad = rollouts[1]
    assert (bad.drop_reason, bad.attempts, bad.experiences) == ("error:ZeroDivisionError", 3, [])
    assert calls.count("task-1") == 3  # the first attempt and two retries
    assert [len(r.experiences) for r in rollouts] == [2, 0, 2]
    assert all(e.reward == 1.0 for r in rollouts for e in r.experiences)
    assert dropped_count("error:ZeroDivisionError") == before + 1


def test_a_rollout_past_its_time_limit_is_dropped_as_timeout(tokenizer, release):
    engine = ConcurrentScripted(tokenizer, lambda prompt: "0")
    before = dropped_count("timeout")
    pool = RolloutPool(BlockingWorkflow({"set/0"}, release), engine, RolloutLimits(timeout_s=1.0, retries=0))
    rollouts = pool.run(tasks(3), SETTINGS)
    assert [(r.drop_reason, r.attempts) for r in rollouts] == [("timeout", 1), ("", 1), ("", 1)]
    assert dropped_count("timeout") == before + 1


def test_a_batch_that_times_out_is_retried_task_by_task(tokenizer, release):
    engine = ScriptedEngine(tokenizer, lambda prompt: "0")
    pool = RolloutPool(BlockingWorkflow({"set/1"}, release), engine, RolloutLimits(timeout_s=1.0, retries=1))
    rollouts = pool.run(tasks(3), SETTINGS)
    assert [(r.drop_reason, r.attempts) for r in rollouts] == [("", 2), ("timeout", 2), ("", 2)]
    assert [len(r.experiences) for r in rollouts] == [2, 0, 2]


def test_a_serial_engine_rolls_the_batch_out_in_one_generate_call(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda prompt: "0")
    seen: list[int] = []
    generate = engine.generate
    engine.generate = lambda requests: seen.append(len(requests)) or generate(requests)  # type: ignore[method-assign]
    RolloutPool(create_workflow("math"), engine, RolloutLimits()).run(tasks(4), SETTINGS)
    assert seen == [4]


def test_multi_turn_episodes_of_many_tasks_interleave_on_a_concurrent_engine(tokenizer):
    # Every generate call waits until 4 are in flight: each task's turns overlap the other tasks' turns.
    engine = OverlapEngine(tokenizer, parties=4)
    workflow = create_workflow("multi_turn", max_turns=2)
    guess = [make_task(prompt="Guess my number.", answer="7", task_id=f"set/{i}") for i in range(4)]
    rollouts = RolloutPool(workflow, engine, RolloutLimits(max_concurrent=4)).run(guess, RolloutSettings())
    assert [r.dropped for r in rollouts] == [False] * 4
    assert all(e.metrics["turns"] == 2 for r in rollouts for e in r.experiences)
    assert engine.most_in_flight == 4


def test_max_concurrent_rollouts_bounds_the_rollouts_in_flight(tokenizer):
    engine = OverlapEngine(tokenizer, parties=2)
    rollouts = RolloutPool(create_workflow("math"), engine, RolloutLimits(max_concurrent=2)).run(tasks(6), SETTINGS)
    assert [r.dropped for r in rollouts] == [False] * 6
    assert engine.most_in_flight == 2


def test_an_engine_failure_is_raised_not_dropped(tokenizer):
    def dead(prompt: str) -> str:
        raise EngineLoopClosed("the vLLM engine failed: worker died")

    pool = RolloutPool(create_workflow("math"), ConcurrentScripted(tokenizer, dead), RolloutLimits(retries=2))
    with pytest.raises(EngineLoopClosed, match="worker died"):
        pool.run(tasks(2), SETTINGS)
