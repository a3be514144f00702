"""ScienceWorld on its real Java engine: valid actions, the gold path, invalid replies, state keys, the workflow."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from explorer_helpers import make_task

from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.workflows import RolloutSettings, create_workflow
from trinity.explorer.workflows.scienceworld import ScienceWorldEnvironment

TASK = {"task_name": "find-non-living-thing", "variation": 0, "simplifications": "easy"}


@pytest.fixture(scope="module")
def gold_path() -> list[str]:
    """ScienceWorld's own solution of TASK."""
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv("")
    try:
        env.load(TASK["task_name"], TASK["variation"], TASK["simplifications"], generateGoldPath=True)
        return list(env.get_gold_action_sequence())
    finally:
        env.close()


@pytest.fixture(scope="module")
def env() -> Iterator[ScienceWorldEnvironment]:
    """One JVM for the module's tests (each resets it): starting one takes seconds."""
    environment = ScienceWorldEnvironment(make_task(**TASK), max_listed_actions=20)
    yield environment
    environment.close()


def answer(action: str) -> str:
    return f"<think>next</think><answer>{action}</answer>"


def test_reset_shows_the_task_and_a_bounded_list_of_valid_actions(env):
    observation = env.reset(make_task(**TASK), seed=0)
    assert f"Task: {env.info['taskDesc']}" in observation
    listed = observation.split("Valid actions:\n")[1].splitlines()
    more = len(env.info["valid"]) - 20
    assert len(listed) == 21 and listed[-1] == f"(and {more} more valid actions not listed)"
    assert [line.removeprefix("- ") for line in listed[:20]] == list(env.info["valid"])[:20]


def test_the_gold_path_completes_the_task_with_reward_one(env, gold_path):
    env.reset(make_task(**TASK), seed=0)
    outcomes = [env.step(answer(action)) for action in gold_path]
    assert sum(o.reward for o in outcomes) == pytest.approx(1.0)
    assert outcomes[-1].done and outcomes[-1].info["success"]
    assert not any(o.done for o in outcomes[:-1])


def test_an_unknown_action_is_invalid_and_changes_nothing(env):
    env.reset(make_task(**TASK), seed=0)
    key, moves = env.state_key(), env.info["moves"]
    outcome = env.step(answer("juggle the planets"))
    assert outcome.info == {"invalid_action": True} and outcome.reward == 0.0 and not outcome.done
    assert env.state_key() == key and env.info["moves"] == moves


def test_a_failed_task_ends_the_episode_with_return_zero():
    task = make_task(task_name="find-living-thing", variation=0, simplifications="easy")
    env = ScienceWorldEnvironment(task)
    try:
        env.reset(task, seed=0)
        outcomes = [env.step(answer("open door to kitchen")), env.step(answer("focus on picture"))]  # not alive
    finally:
        env.close()
    assert outcomes[-1].done and not outcomes[-1].info["success"]
    assert sum(o.reward for o in outcomes) == pytest.approx(0.0)


def test_state_keys_repeat_for_a_repeated_state(env):
    env.reset(make_task(**TASK), seed=0)
    start = env.state_key()
    env.step(answer("look around"))
    env.step(answer("open door to kitchen"))  # the easy simplification opened every door already
    assert env.state_key() == start
    env.step(answer("go to kitchen"))
    assert env.state_key() != start
    env.reset(make_task(**TASK), seed=0)
    assert env.state_key() == start


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, r"payload.task_name: required"),
        ({"task_name": "no-such-task"}, r"payload.task_name: unknown ScienceWorld task 'no-such-task'; known: "),
        ({"task_name": "find-living-thing", "variation": 100000}, r"payload.variation: 'find-living-thing' has "),
    ],
)
def test_a_bad_payload_is_refused_naming_the_field(payload, message):
    with pytest.raises(ValueError, match=message):
        ScienceWorldEnvironment(make_task(**payload))


def test_the_workflow_plays_the_gold_path_into_rewarded_steps(tokenizer, gold_path):
    replies = iter([answer(a) for a in gold_path])
    engine = ScriptedEngine(tokenizer, lambda prompt: next(replies))
    exps = create_workflow("scienceworld", max_steps=len(gold_path) + 2).run(
        make_task(task_id="sw/0", **TASK), engine, RolloutSettings()
    )
    assert len(exps) == len(gold_path)
    assert sum(e.reward_components["step_reward"] for e in exps) == pytest.approx(1.0)
    assert all(e.reward == pytest.approx(1.0) and e.metrics["success"] == 1.0 for e in exps)
    assert all(e.state_key for e in exps) and exps[-1].info["ended_by"] == "environment"
    assert "Valid actions:" in exps[0].prompt_text
