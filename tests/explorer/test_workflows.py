"""Workflows: groups, experience fields, rewards, multi-turn masks, FrozenLake scoring."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from explorer_helpers import make_task

from trinity.explorer.engines import SamplingSettings
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.workflows import RolloutSettings, create_workflow
from trinity.explorer.workflows.multi_turn import env_turn_ids
from trinity.explorer.workflows.single_turn import MathWorkflow
from trinity.v1 import common_pb2

SHORT = SamplingSettings(temperature=1.0, max_tokens=8)


def scripted(tokenizer, reply: Callable[[str], str] | str) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, reply if callable(reply) else (lambda prompt: reply))


def check_common_fields(exps: list[common_pb2.Experience], task: common_pb2.Task) -> None:
    assert len({e.id for e in exps}) == len(exps)
    assert len({e.group_id for e in exps}) == 1
    for e in exps:
        assert e.kind == common_pb2.EXPERIENCE_KIND_ROLLOUT
        assert (e.task_id, e.taskset) == (task.id, task.taskset)
        assert len(e.logprobs) == len(e.action_mask) == len(e.response_token_ids) > 0
        assert e.created_unix_ms > 0


def test_math_workflow_scores_each_repeat_in_one_group(tokenizer):
    task = make_task(prompt="What is 3+4?", answer="7")
    engine = scripted(tokenizer, r"The answer is \boxed{7}")
    exps = create_workflow("math").run(task, engine, RolloutSettings(repeat_times=3, run_id="r1"))
    assert len(exps) == 3
    check_common_fields(exps, task)
    for e in exps:
        assert e.reward == 1.0 and not e.failed
        assert e.run_id == "r1"
        assert e.response_text == r"The answer is \boxed{7}"
        assert e.prompt_text == "<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n"
        assert e.response_token_ids[-1] == tokenizer.eos_token_id
        assert e.finish_reason == "stop"


def test_two_runs_of_a_task_get_different_group_ids(tokenizer):
    task = make_task(prompt="1+1?", answer="2")
    engine, workflow = scripted(tokenizer, "2"), create_workflow("math")
    first = workflow.run(task, engine, RolloutSettings(repeat_times=2))
    second = workflow.run(task, engine, RolloutSettings(repeat_times=2))
    assert first[0].group_id != second[0].group_id


def test_math_workflow_with_vllm_records_sampling_logprobs_and_version(vllm_engine):
    task = make_task(prompt="What is 3+4?", answer="7")
    exps = create_workflow("math").run(task, vllm_engine, RolloutSettings(repeat_times=4, sampling=SHORT))
    assert len(exps) == 4
    check_common_fields(exps, task)
    for e in exps:
        assert e.model_version == vllm_engine.model_version
        assert all(lp <= 0.0 for lp in e.logprobs) and any(lp < 0.0 for lp in e.logprobs)
        assert all(e.action_mask)
        assert e.reward in (0.0, 1.0) and not e.failed


def test_task_reward_fn_overrides_the_workflow_default(tokenizer):
    task = make_task(prompt="Say it", answer="7", reward_fn="format")
    exps = create_workflow("math").run(task, scripted(tokenizer, r"\boxed{7}"), RolloutSettings())
    assert exps[0].reward == 0.0  # right answer, but `format` wants think/answer tags


class RaisingRewardWorkflow(MathWorkflow):
    """`math` with a reward that always raises (a subclass: no throwaway name in the global registry)."""

    def reward_fn(self, task):
        def always_raises(text, task):
            raise ZeroDivisionError("boom")

        return always_raises


def test_a_failing_reward_marks_experiences_failed_and_keeps_going(tokenizer):
    task = make_task(prompt="q", answer="1")
    exps = RaisingRewardWorkflow().run(task, scripted(tokenizer, "1"), RolloutSettings(repeat_times=2))
    assert len(exps) == 2
    assert all(e.failed and e.error == "ZeroDivisionError: boom" and e.reward == 0.0 for e in exps)


def test_countdown_workflow_builds_the_prompt_from_the_payload(tokenizer):
    task = make_task(numbers=[6, 2, 3], target=12)
    engine = scripted(tokenizer, "<think>4 times 3</think><answer>(6 - 2) * 3</answer>")
    exps = create_workflow("countdown").run(task, engine, RolloutSettings(repeat_times=2))
    assert [e.reward for e in exps] == [1.0, 1.0]
    assert "Using the numbers [6, 2, 3], create an equation that equals 12." in exps[0].prompt_text


# --- multi-turn -----------------------------------------------------------------------------------


def guesser(guesses: list[str]) -> Callable[[str], str]:
    """Replies with the i-th guess where i is the number of assistant turns already in the prompt."""
    return lambda prompt: guesses[prompt.count("<|im_start|>assistant") - 1]


def test_multi_turn_concatenates_model_and_env_tokens_with_masks(tokenizer):
    task = make_task(prompt="Guess my number (1-10).", answer="7")
    engine = scripted(tokenizer, guesser(["5", "8", "7"]))
    exps = create_workflow("multi_turn", max_turns=5).run(task, engine, RolloutSettings(repeat_times=2))
    assert len(exps) == 2
    check_common_fields(exps, task)
    e = exps[0]
    assert e.reward == 1.0 and e.metrics["turns"] == 3.0 and e.info["ended_by"] == "environment"
    assert [m.content for m in e.messages] == [
        "Guess my number (1-10).",
        "5",
        "Higher.",
        "8",
        "Lower.",
        "7",
        "Correct!",
    ]
    # The token stream is the chat template's rendering of the conversation (up to the final end-of-turn).
    full = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in e.messages[:-1]], tokenize=False
    )
    assert tokenizer.decode(list(e.prompt_token_ids) + list(e.response_token_ids)) == full.removesuffix("\n")
    # Model tokens are "5<|im_end|>", "8<|im_end|>", "7<|im_end|>"; everything else is the environment's.
    model_tokens = [t for t, m in zip(e.response_token_ids, e.action_mask, strict=True) if m]
    assert tokenizer.decode(model_tokens) == "5<|im_end|>8<|im_end|>7<|im_end|>"
    env_tokens = [t for t, m in zip(e.response_token_ids, e.action_mask, strict=True) if not m]
    assert tokenizer.decode(env_tokens) == (
        "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"
        "\n<|im_start|>user\nLower.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_multi_turn_stops_at_max_turns_without_reward(tokenizer):
    task = make_task(prompt="Guess.", answer="7")
    exps = create_workflow("multi_turn", max_turns=2).run(task, scripted(tokenizer, "1"), RolloutSettings())
    assert exps[0].reward == 0.0
    assert exps[0].metrics["turns"] == 2.0
    assert exps[0].info["ended_by"] == "max_turns"


def test_multi_turn_with_vllm_keeps_sampled_logprobs_on_model_tokens_only(vllm_engine, tokenizer):
    task = make_task(prompt="Guess my number.", answer="7")
    sampling = SamplingSettings(temperature=1.0, max_tokens=6)
    exps = create_workflow("multi_turn", max_turns=3).run(
        task, vllm_engine, RolloutSettings(repeat_times=2, sampling=sampling)
    )
    for e in exps:
        mask, logprobs = list(e.action_mask), list(e.logprobs)
        assert sum(mask) >= 6  # at least the first model turn
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
        assert all(lp < 0.0 for lp, m in zip(logprobs, mask, strict=True) if m)
        if e.metrics["turns"] > 1:
            assert not all(mask)  # env tokens sit between the turns


def test_env_turn_ids_render_a_tool_message(tokenizer):
    ids = env_turn_ids(tokenizer, "tool", "42")
    assert tokenizer.decode(ids) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


# --- FrozenLake -------------------------------------------------------------------------------------

# gymnasium's default 4x4 map:  SFFF / FHFH / FFFH / HFFG
SAFE_ROUTE = {0: "Down", 4: "Down", 8: "Right", 9: "Right", 10: "Down", 14: "Right"}


def lake_policy(route: dict[int, str]) -> Callable[[str], str]:
    """A scripted agent that reads its position off the rendered map and follows `route`."""

    def reply(prompt: str) -> str:
        grid = re.search(r"Current map:\n((?:[SFHGP]{4}\n?){4})", prompt)
        assert grid is not None, prompt
        position = grid.group(1).replace("\n", "").index("P")
        return f"<think>at {position}</think><answer>{route.get(position, 'nonsense')}</answer>"

    return reply


def test_frozen_lake_safe_route_reaches_the_goal(tokenizer):
    task = make_task(task_id="lake/0")
    engine = scripted(tokenizer, lake_policy(SAFE_ROUTE))
    exps = create_workflow("frozen_lake").run(task, engine, RolloutSettings(repeat_times=2))
    assert len(exps) == 12  # two episodes of six steps
    check_common_fields(exps, task)
    assert len({e.episode_id for e in exps}) == 2
    first = [e for e in exps if e.episode_id == exps[0].episode_id]
    assert [e.step_index for e in first] == list(range(6))
    assert [e.state_key for e in first] == ["pos=0", "pos=4", "pos=8", "pos=9", "pos=10", "pos=14"]
    assert [e.reward_components["step_reward"] for e in first] == [0, 0, 0, 0, 0, 1.0]
    assert all(e.reward == 1.0 and e.reward_components["return_to_go"] == 1.0 for e in first)
    assert all(e.metrics["success"] == 1.0 and e.info["ended_by"] == "environment" for e in first)


def test_frozen_lake_hole_ends_the_episode_with_zero_return(tokenizer):
    engine = scripted(tokenizer, lake_policy({0: "Right", 1: "Down"}))  # (0,1) then the hole at (1,1)
    exps = create_workflow("frozen_lake").run(make_task(), engine, RolloutSettings())
    assert [e.state_key for e in exps] == ["pos=0", "pos=1"]
    assert all(e.reward == 0.0 and e.metrics["success"] == 0.0 for e in exps)
    assert exps[-1].info["ended_by"] == "environment"


def test_frozen_lake_discounts_return_to_go(tokenizer):
    engine = scripted(tokenizer, lake_policy(SAFE_ROUTE))
    exps = create_workflow("frozen_lake", gamma=0.5).run(make_task(), engine, RolloutSettings())
    assert [e.reward_components["return_to_go"] for e in exps] == [0.5**5, 0.5**4, 0.5**3, 0.25, 0.5, 1.0]


def test_frozen_lake_invalid_moves_do_not_move_and_hit_max_steps(tokenizer):
    engine = scripted(tokenizer, "I will stand still")
    exps = create_workflow("frozen_lake", max_steps=3).run(make_task(), engine, RolloutSettings())
    assert [e.state_key for e in exps] == ["pos=0"] * 3
    assert all(e.metrics["invalid_action"] == 1.0 and e.reward == 0.0 for e in exps)
    assert exps[-1].info["ended_by"] == "max_steps"


def test_frozen_lake_invalid_moves_cost_the_configured_reward_and_a_won_episode_still_counts_as_won(tokenizer):
    replies = iter(["I will stand still", "Right"])
    engine = scripted(tokenizer, lambda prompt: next(replies))
    task = make_task(map=["SG", "HF"])
    exps = create_workflow("frozen_lake", invalid_action_reward=-0.1).run(task, engine, RolloutSettings())
    assert [e.reward_components["step_reward"] for e in exps] == pytest.approx([-0.1, 1.0])
    assert all(e.reward == pytest.approx(0.9) and e.metrics["success"] == 1.0 for e in exps)


def test_frozen_lake_reads_a_custom_map_from_the_payload(tokenizer):
    task = make_task(map=["SG", "HF"])
    exps = create_workflow("frozen_lake").run(task, scripted(tokenizer, "Right"), RolloutSettings())
    assert len(exps) == 1 and exps[0].reward == 1.0


def test_frozen_lake_with_vllm_episodes_end_within_max_steps(vllm_engine):
    sampling = SamplingSettings(temperature=1.0, max_tokens=4)
    exps = create_workflow("frozen_lake", max_steps=3).run(
        make_task(), vllm_engine, RolloutSettings(repeat_times=2, sampling=sampling)
    )
    episodes = {e.episode_id for e in exps}
    assert len(episodes) == 2
    for episode in episodes:
        steps = [e for e in exps if e.episode_id == episode]
        assert 1 <= len(steps) <= 3
        assert [e.step_index for e in steps] == list(range(len(steps)))
        assert all(e.model_version == vllm_engine.model_version for e in steps)


def test_an_environment_that_raises_fails_that_step_only(tokenizer):
    from trinity.explorer.workflows import MultiStepWorkflow
    from trinity.explorer.workflows.frozen_lake import FrozenLakeEnvironment

    class Flaky(FrozenLakeEnvironment):
        def step(self, action_text):
            if self.position == 4:
                raise RuntimeError("simulator crashed")
            return super().step(action_text)

    engine = scripted(tokenizer, lake_policy(SAFE_ROUTE))
    exps = MultiStepWorkflow(environment=Flaky).run(make_task(), engine, RolloutSettings())
    assert [e.failed for e in exps] == [False, True]
    assert exps[1].error == "environment step failed: RuntimeError: simulator crashed"
    assert exps[1].info["ended_by"] == "error"


@pytest.mark.parametrize(("text", "action"), [("<answer>up</answer>", 3), ("go Left then right", 2), ("hmm", None)])
def test_frozen_lake_action_parser(text, action):
    from trinity.explorer.workflows.frozen_lake import parse_action

    assert parse_action(text) == action
