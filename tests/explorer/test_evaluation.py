"""Scoring: pass rates for the curriculum, pass@k, and the evaluation summary, on hand-built experiences."""

from __future__ import annotations

import pytest

from trinity.explorer.evaluation import k_values, pass_at_k, summarize, task_results
from trinity.v1 import common_pb2


def sample(reward: float, *, failed: bool = False, tokens: int = 2) -> common_pb2.Experience:
    return common_pb2.Experience(reward=reward, failed=failed, response_token_ids=[1] * tokens)


def test_pass_at_k_matches_the_closed_form() -> None:
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 3, 2) == 1.0 and pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert k_values(4) == [1, 2, 4] and k_values(6) == [1, 2, 4, 6] and k_values(1) == [1]


def test_a_task_pass_rate_is_the_share_of_its_scored_samples_that_passed() -> None:
    tasks = [common_pb2.Task(id="s/0", lease_id="0"), common_pb2.Task(id="s/1", lease_id="1")]
    groups = [
        [sample(1.0), sample(0.0), sample(1.0, failed=True)],  # the failed sample is not scored
        [sample(1.0, failed=True)],
    ]
    first, second = task_results(tasks, groups)
    assert (first.task_id, first.lease_id, first.pass_rate, first.samples) == ("s/0", "0", 0.5, 2)
    assert (second.pass_rate, second.samples) == (-1.0, 0)  # nothing scored: no rate to record


def test_an_evaluation_counts_failed_samples_as_wrong() -> None:
    groups = [[sample(1.0), sample(1.0, failed=True)], [sample(0.0), sample(0.0)]]
    summary = summarize(groups)
    assert summary == pytest.approx(
        {
            "tasks": 2.0,
            "samples": 4.0,
            "failed": 1.0,
            "accuracy": 0.25,
            "mean_reward": 0.25,
            "response_tokens": 2.0,
            "pass@1": 0.25,  # task 0: 1 of 2 passed -> 0.5; task 1: 0
            "pass@2": 0.5,
        }
    )


def step(episode: str, index: int, episode_return: float, success: bool) -> common_pb2.Experience:
    """One step of a multi-step episode: every step carries its episode's return and whether it was won."""
    exp = common_pb2.Experience(episode_id=episode, step_index=index, reward=episode_return, response_token_ids=[1])
    exp.metrics["success"] = float(success)
    return exp


def test_a_multi_step_episode_counts_once_and_passes_when_won_whatever_its_shaped_return() -> None:
    """A lost episode of five steps and a won one of two (its return 0.9: an invalid move's penalty) are one sample
    each: accuracy 0.5, not the 2 of 7 steps counted per step, nor 0 from returns under the threshold."""
    lost = [step("lost", i, -0.5, False) for i in range(5)]
    won = [step("won", i, 0.9, True) for i in range(2)]
    summary = summarize([lost + won])
    assert (summary["samples"], summary["accuracy"], summary["mean_reward"]) == (2.0, 0.5, pytest.approx(0.2))
    (result,) = task_results([common_pb2.Task(id="g/0", lease_id="0")], [lost + won])
    assert (result.pass_rate, result.samples) == (0.5, 2)
