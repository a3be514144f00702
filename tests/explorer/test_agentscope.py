"""The `agentscope` workflow: AgentScope's own ReAct agent, run in process against the explorer's engine, each of
its model calls one experience with the exact tokens and sampling log-probs; the agent's answer or number is the
episode's reward; failing and overrunning episodes are kept as failed; names are checked when the config is parsed."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from explorer_helpers import hf_logprobs, make_task

from trinity.config import parse_run_config
from trinity.explorer.engines.base import GenerationRequest, Sample, SamplingSettings
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.workflows import RolloutSettings, create_workflow
from trinity.explorer.workflows.agentscope import AgentScopeWorkflow
from trinity.v1 import common_pb2

pytest.importorskip("agentscope")

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "config.yaml"
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'
SAMPLING = SamplingSettings(temperature=0.7, top_p=0.9, top_k=20, max_tokens=200)


class RecordingEngine(ScriptedEngine):
    """Scripted replies with made-up sampling log-probs (all different), keeping every request it was sent."""

    def __init__(self, tokenizer: Any, reply_fn: Any) -> None:
        super().__init__(tokenizer, reply_fn)
        self.requests: list[GenerationRequest] = []

    def _reply(self, prompt_text: str, request: GenerationRequest) -> Sample:
        self.requests.append(request)
        sample = super()._reply(prompt_text, request)
        sample.logprobs = [-0.5 - 0.01 * i for i in range(len(sample.token_ids))]
        return sample


def calls_then_answers(answer: str) -> Any:
    """The calculator first; once its result is in the prompt, `answer`."""
    return lambda prompt: answer if "<|im_start|>tool" in prompt else CALL


def settings(repeat_times: int = 2) -> RolloutSettings:
    return RolloutSettings(repeat_times=repeat_times, sampling=SAMPLING, run_id="run-a")


def test_agentscope_react_agent_calls_the_calculator_and_each_model_call_is_an_experience(tokenizer):
    engine = RecordingEngine(tokenizer, calls_then_answers("17 * 23 = 391"))
    task = make_task(prompt="What is 17 * 23?", answer="391", reward_fn="accuracy")
    experiences = create_workflow("agentscope").run(task, engine, settings(repeat_times=2))

    assert len(experiences) == 4  # two episodes, each a tool call and an answer
    assert len({e.group_id for e in experiences}) == 1
    episodes: dict[str, list[common_pb2.Experience]] = {}
    for exp in experiences:
        episodes.setdefault(exp.episode_id, []).append(exp)
    assert len(episodes) == 2
    for calls in episodes.values():
        call, answer = sorted(calls, key=lambda e: e.step_index)
        assert (call.step_index, answer.step_index) == (0, 1)
        assert tokenizer.decode(call.response_token_ids).startswith(CALL)
        # AgentScope ran the real tool: its result is in the prompt of the agent's second call.
        assert "<|im_start|>tool" in answer.prompt_text and "391" in answer.prompt_text
        assert tokenizer.decode(list(answer.prompt_token_ids)) == answer.prompt_text
        for exp in (call, answer):
            assert exp.reward == 1.0 and not exp.failed
            assert (exp.task_id, exp.taskset, exp.run_id) == ("set/0", "set", "run-a")
            assert list(exp.logprobs) == pytest.approx([-0.5 - 0.01 * i for i in range(len(exp.response_token_ids))])
            assert all(exp.action_mask)
    # Every call sampled with the run's settings, whatever AgentScope would default to.
    sent = {
        (r.sampling.temperature, r.sampling.top_p, r.sampling.top_k, r.sampling.max_tokens) for r in engine.requests
    }
    assert sent == {(0.7, 0.9, 20, 200)}


def test_a_wrong_answer_scores_0(tokenizer):
    engine = RecordingEngine(tokenizer, calls_then_answers("It is 400."))
    task = make_task(prompt="What is 17 * 23?", answer="391", reward_fn="accuracy")
    experiences = create_workflow("agentscope").run(task, engine, settings(repeat_times=1))
    assert [e.reward for e in experiences] == [0.0, 0.0]


def _workflow(agent: Any, **options: Any) -> AgentScopeWorkflow:
    return AgentScopeWorkflow(agent=agent, **options)


async def _ask(model: Any, text: str) -> str:
    from agentscope.message import UserMsg

    response = await model([UserMsg(name="user", content=text)])
    return "".join(block.text for block in response.content if getattr(block, "type", "") == "text")


def test_an_agent_that_returns_a_number_sets_the_reward_of_all_its_calls(tokenizer):
    async def two_calls_scored_by_length(task: common_pb2.Task, model: Any) -> float:
        first = await _ask(model, task.prompt)
        second = await _ask(model, first)
        return len(second) / 16

    engine = RecordingEngine(tokenizer, lambda prompt: "abcd")
    experiences = _workflow(two_calls_scored_by_length).run(make_task(prompt="go"), engine, settings(repeat_times=1))
    assert [e.step_index for e in experiences] == [0, 1]
    assert [e.reward for e in experiences] == [0.25, 0.25]
    assert experiences[0].reward_components["agent"] == 0.25


def test_an_episode_that_raises_or_overruns_keeps_its_calls_marked_failed_and_the_others_train(tokenizer):
    episodes = iter(["raise", "sleep", "answer"])

    async def flaky(task: common_pb2.Task, model: Any) -> float:
        how = next(episodes)
        await _ask(model, task.prompt)
        if how == "raise":
            raise ConnectionError("the environment went away")
        if how == "sleep":
            await asyncio.sleep(30)
        return 1.0

    engine = RecordingEngine(tokenizer, lambda prompt: "ok")
    experiences = _workflow(flaky, episode_timeout_s=1.0).run(make_task(prompt="go"), engine, settings(repeat_times=3))
    errors = sorted(e.error for e in experiences if e.failed)
    assert errors == [
        "agent: ConnectionError: the environment went away",
        "agent: TimeoutError: the episode ran past episode_timeout_s=1",
    ]
    assert [e.reward for e in experiences if not e.failed] == [1.0]


def test_a_task_whose_episodes_all_fail_before_calling_the_model_raises_naming_it(tokenizer):
    async def broken(task: common_pb2.Task, model: Any) -> float:
        raise KeyError("tools")

    engine = RecordingEngine(tokenizer, lambda prompt: "ok")
    with pytest.raises(RuntimeError, match=r"every episode of task 'set/0' failed: KeyError: 'tools'"):
        _workflow(broken).run(make_task(prompt="go"), engine, settings())


def test_an_agent_returning_something_else_is_a_type_error(tokenizer):
    async def returns_a_dict(task: common_pb2.Task, model: Any) -> Any:
        await _ask(model, "go")
        return {"reward": 1}

    engine = RecordingEngine(tokenizer, lambda prompt: "ok")
    with pytest.raises(TypeError, match=r"returns its reward .* or its answer .*, not dict"):
        _workflow(returns_a_dict).run(make_task(prompt="go"), engine, settings(repeat_times=1))


def test_a_real_models_calls_are_trained_on_its_exact_tokens_and_log_probs(hf_engine, hf_model):
    async def one_call(task: common_pb2.Task, model: Any) -> float:
        await _ask(model, task.prompt)
        return 0.5

    run = RolloutSettings(repeat_times=2, sampling=SamplingSettings(temperature=1.0, max_tokens=8))
    experiences = _workflow(one_call).run(make_task(prompt="hello"), hf_engine, run)
    assert len(experiences) == 2
    for exp in experiences:
        assert 0 < len(exp.response_token_ids) <= 8
        expected = hf_logprobs(hf_model, list(exp.prompt_token_ids), list(exp.response_token_ids))
        assert list(exp.logprobs) == pytest.approx(expected, abs=1e-4)


# --- config -----------------------------------------------------------------------------------------


def _config(**options: Any) -> str:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["explorer"] |= {"workflow": "agentscope", "workflow_options": options}
    return yaml.safe_dump(data)


def test_agentscope_options_parse_into_their_shape():
    options = parse_run_config(_config(agent="react", episode_timeout_s=60)).explorer.workflow_options
    assert type(options).__name__ == "AgentScopeWorkflowOptions"
    assert isinstance(create_workflow("agentscope", **options.model_dump()), AgentScopeWorkflow)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"agent": "reactt"}, "explorer.workflow_options: agent: unknown 'reactt'; known: react"),
        ({"episode_timeout_s": 0}, "explorer.workflow_options: episode_timeout_s: Input should be greater than 0"),
        (
            {"tools": ["calculator"]},
            "explorer.workflow_options: tools: unknown field (for workflow 'agentscope'; its fields: agent, reward_fn, "
            "episode_timeout_s)",
        ),
    ],
)
def test_a_wrong_agentscope_option_is_refused_when_the_config_is_parsed(options, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        parse_run_config(_config(**options))
