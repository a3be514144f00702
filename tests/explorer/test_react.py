"""The `react` workflow: tool calls parsed in the Hermes and Llama 3 formats, run under a time limit, answered as
masked `tool` turns; the final answer scored; tools' schemas derived from typed functions; names checked at parse."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from explorer_helpers import make_task

from trinity.config import parse_run_config
from trinity.explorer.chat_tools import render_chat
from trinity.explorer.engines.base import GenerationRequest, Sample, SamplingSettings
from trinity.explorer.engines.scripted import ScriptedEngine
from trinity.explorer.tools import MalformedCall, Toolbox, ToolCall, describe_tool, parse_tool_calls
from trinity.explorer.tools.builtin import calculator
from trinity.explorer.workflows import RolloutSettings, create_workflow
from trinity.explorer.workflows.react import ReactWorkflow
from trinity.models.tiny import CHATML_TEMPLATE
from trinity.v1 import common_pb2

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "config.yaml"
CALL_HERMES_BODY = '{"name": "calculator", "arguments": {"expression": "17 * 23"}}'
CALL_HERMES = f"<tool_call>{CALL_HERMES_BODY}</tool_call>"
CALL_LLAMA3 = '{"name": "calculator", "parameters": {"expression": "17 * 23"}}'


class SampledEngine(ScriptedEngine):
    """Scripted replies whose tokens carry made-up sampling log-probs (all negative, none equal), as a sampler's
    would: the test can tell the model's tokens, which keep them, from the environment's, which get 0."""

    def _reply(self, prompt_text: str, request: GenerationRequest) -> Sample:
        sample = super()._reply(prompt_text, request)
        sample.logprobs = [-0.5 - 0.01 * i for i in range(len(sample.token_ids))]
        return sample


def tool_then_answer(call: str, answer: str) -> Callable[[str], str]:
    """Calls a tool first; once a tool turn is in the prompt, answers."""
    return lambda prompt: answer if "<|im_start|>tool" in prompt else call


def split(tokenizer: Any, exp: common_pb2.Experience) -> tuple[str, str]:
    """The model's tokens and the environment's of an experience, decoded."""
    pairs = list(zip(exp.response_token_ids, exp.action_mask, strict=True))
    return tokenizer.decode([t for t, m in pairs if m]), tokenizer.decode([t for t, m in pairs if not m])


# --- the workflow ---------------------------------------------------------------------------------


def test_a_model_that_calls_the_calculator_then_answers_gets_reward_1_and_only_its_tokens_train(tokenizer):
    task = make_task(prompt="What is 17 * 23?", answer="391", reward_fn="accuracy")
    engine = SampledEngine(tokenizer, tool_then_answer(CALL_HERMES, "17 * 23 = 391, so the answer is 391."))
    exps = create_workflow("react", tools=["calculator"]).run(task, engine, RolloutSettings(repeat_times=2))
    assert len(exps) == 2 and len({e.group_id for e in exps}) == 1
    e = exps[0]
    assert e.reward == 1.0 and not e.failed
    assert e.info["ended_by"] == "answer"
    assert (e.metrics["turns"], e.metrics["tool_calls"], e.metrics["tool_errors"]) == (2.0, 1.0, 0.0)
    assert [(m.role, m.content) for m in e.messages] == [
        ("user", "What is 17 * 23?"),
        ("assistant", CALL_HERMES),
        ("tool", "391"),
        ("assistant", "17 * 23 = 391, so the answer is 391."),
    ]
    # The first prompt lists the tool (SmolLM2's and the tiny model's ChatML template knows no tools).
    assert e.prompt_text.startswith("<|im_start|>system\nFunctions you may call:\n<tools>\n")
    assert json.dumps(describe_tool(calculator).schema, separators=(",", ":")) in e.prompt_text
    model_text, env_text = split(tokenizer, e)
    assert model_text == f"{CALL_HERMES}<|im_end|>17 * 23 = 391, so the answer is 391.<|im_end|>"
    assert env_text == "\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"
    # The model's tokens keep the log-probs they were sampled with, turn by turn; the tool's tokens get 0.
    call_len = len(tokenizer.encode(CALL_HERMES, add_special_tokens=False)) + 1  # + <|im_end|>
    sampled = [lp for lp, m in zip(e.logprobs, e.action_mask, strict=True) if m]
    assert sampled[:call_len] == pytest.approx([-0.5 - 0.01 * i for i in range(call_len)])
    assert sampled[call_len:] == pytest.approx([-0.5 - 0.01 * i for i in range(len(sampled) - call_len)])
    assert all(lp == 0.0 for lp, m in zip(e.logprobs, e.action_mask, strict=True) if not m)


def test_llama3_format_teaches_and_reads_a_bare_json_call(tokenizer):
    task = make_task(prompt="What is 17 * 23?", answer="391", reward_fn="accuracy")
    engine = ScriptedEngine(tokenizer, tool_then_answer("<|python_tag|>" + CALL_LLAMA3, "391"))
    workflow = create_workflow("react", tools=["calculator"], tool_call_format="llama3")
    e = workflow.run(task, engine, RolloutSettings())[0]
    assert 'reply with only a JSON object {"name": ..., "parameters": {...}}' in e.prompt_text
    assert "<tool_call>" not in e.prompt_text
    assert [m.content for m in e.messages][2:] == ["391", "391"]
    assert e.reward == 1.0 and e.metrics["tool_calls"] == 1.0


def test_a_template_that_knows_tools_gets_them_through_its_own_tools_argument(tokenizer):
    tok = copy.copy(tokenizer)
    tok.chat_template = "{% for t in tools %}TOOL={{ t.function.name }}\n{% endfor %}" + CHATML_TEMPLATE
    task = make_task(prompt="What is 17 * 23?", answer="391", reward_fn="accuracy")
    e = create_workflow("react").run(task, ScriptedEngine(tok, lambda _: "391"), RolloutSettings())[0]
    assert e.prompt_text == "TOOL=calculator\n<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n"
    assert e.reward == 1.0 and e.metrics["tool_calls"] == 0.0 and e.metrics["turns"] == 1.0


def test_earlier_calls_are_written_back_in_the_format_the_system_prompt_teaches(tokenizer):
    call = {"id": "c1", "function": {"name": "calculator", "arguments": '{"expression": "17 * 23"}'}}
    messages = [
        {"role": "user", "content": "What is 17 * 23?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "391"},
    ]
    schema = describe_tool(calculator).schema
    llama3 = render_chat(tokenizer, messages, [schema], "llama3")
    assert "<tool_call>" not in llama3
    assert f"<|im_start|>assistant\n{CALL_LLAMA3}<|im_end|>" in llama3
    hermes = render_chat(tokenizer, messages, [schema], "hermes")
    assert f"<|im_start|>assistant\n<tool_call>\n{CALL_HERMES_BODY}\n</tool_call><|im_end|>" in hermes


@pytest.mark.parametrize(
    ("call_format", "bad_reply", "error"),
    [
        ("hermes", "<tool_call>{'name': 'calculator'}</tool_call>", "Error: the tool call is not valid JSON ("),
        (
            "llama3",
            '{"name": "calculator", "parameters": {"expression": 1 + 2}}',
            "Error: the tool call is not valid JSON",
        ),
        (
            "hermes",
            '<tool_call>{"name": "calc", "arguments": {"expression": "1"}}</tool_call>',
            "Error: unknown tool 'calc'; the tools are: calculator",
        ),
        (
            "llama3",
            '{"name": "calculator", "parameters": {"expr": "2 + 3"}}',
            "Error: bad arguments: expression: missing; expr: unknown argument; "
            "call it as calculator(expression: string)",
        ),
        (
            "hermes",
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1 / 0"}}</tool_call>',
            "Error: calculator failed: ZeroDivisionError: division by zero",
        ),
    ],
)
def test_a_bad_call_is_answered_with_an_error_and_the_model_goes_on(tokenizer, call_format, bad_reply, error):
    task = make_task(prompt="What is 2 + 3?", answer="5", reward_fn="accuracy")
    prompts: list[str] = []

    def model(prompt: str) -> str:
        prompts.append(prompt)
        return "5" if "<|im_start|>tool" in prompt else bad_reply

    workflow = create_workflow("react", tools=["calculator"], tool_call_format=call_format)
    e = workflow.run(task, ScriptedEngine(tokenizer, model), RolloutSettings())[0]
    assert e.messages[2].role == "tool" and e.messages[2].content.startswith(error)
    assert error in prompts[-1]  # the model read it
    assert (e.metrics["tool_calls"], e.metrics["tool_errors"]) == (1.0, 1.0)
    assert e.reward == 1.0 and e.info["ended_by"] == "answer"


def nap(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: how long to sleep
    """
    time.sleep(seconds)
    return "rested"


def test_a_tool_that_sleeps_past_the_limit_answers_a_timeout_and_the_rollout_goes_on(tokenizer):
    task = make_task(prompt="Rest, then say 42.", answer="42", reward_fn="accuracy")
    call = '<tool_call>{"name": "nap", "arguments": {"seconds": 3}}</tool_call>'
    workflow = ReactWorkflow(tools=[nap, "calculator"], tool_timeout_s=0.2)
    start = time.monotonic()
    e = workflow.run(task, ScriptedEngine(tokenizer, tool_then_answer(call, "42")), RolloutSettings())[0]
    assert time.monotonic() - start < 2.0
    assert e.messages[2].content == "Error: tool nap timed out after 0.2 s"
    assert e.metrics["tool_errors"] == 1.0 and e.reward == 1.0


def test_several_calls_in_one_turn_get_one_tool_message_each(tokenizer):
    task = make_task(prompt="2+3 and 4*5?", answer="20", reward_fn="accuracy")
    calls = "".join(
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{x}"}}}}</tool_call>' for x in ("2+3", "4*5")
    )
    engine = ScriptedEngine(tokenizer, tool_then_answer(calls, "5 and 20"))
    long_replies = RolloutSettings(sampling=SamplingSettings(max_tokens=256))  # a token per character
    e = create_workflow("react").run(task, engine, long_replies)[0]
    assert [(m.role, m.content) for m in e.messages][2:4] == [("tool", "5"), ("tool", "20")]
    assert (
        split(tokenizer, e)[1]
        == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>tool\n20<|im_end|>\n<|im_start|>assistant\n"
    )
    assert e.metrics["tool_calls"] == 2.0


def test_an_episode_cut_off_while_calling_tools_is_not_scored(tokenizer):
    # The call's own text holds the answer, 5: scored as an answer, it would earn 1.
    task = make_task(prompt="What is 5?", answer="5", reward_fn="accuracy")
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "5"}}</tool_call>'
    e = create_workflow("react", max_turns=2).run(task, ScriptedEngine(tokenizer, lambda _: call), RolloutSettings())[0]
    assert e.reward == 0.0 and e.info["ended_by"] == "max_turns"
    assert (e.metrics["turns"], e.metrics["tool_calls"]) == (2.0, 2.0)


def test_a_task_that_names_no_reward_is_refused(tokenizer):
    with pytest.raises(ValueError, match="names no reward_fn"):
        create_workflow("react").run(
            make_task(prompt="q", answer="1"), ScriptedEngine(tokenizer, lambda _: "1"), RolloutSettings()
        )


# --- parsing hand-written replies ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call_format", "reply", "calls"),
    [
        ("hermes", "The answer is 391.", []),
        ("hermes", f"Let me compute.\n{CALL_HERMES}", [ToolCall("calculator", {"expression": "17 * 23"})]),
        (
            "hermes",  # OpenAI-style arguments as a JSON string, and "parameters" for "arguments"
            '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
            '<tool_call>{"name": "b", "parameters": {}}',
            [ToolCall("a", {"x": 1}), ToolCall("b", {})],
        ),
        ("llama3", "The answer is 391.", []),
        ("llama3", CALL_LLAMA3, [ToolCall("calculator", {"expression": "17 * 23"})]),
        ("llama3", f"<|python_tag|>{CALL_LLAMA3}", [ToolCall("calculator", {"expression": "17 * 23"})]),
        ("llama3", CALL_HERMES, []),  # not this family's format: text, hence an answer
    ],
)
def test_tool_calls_are_read_in_each_format(call_format, reply, calls):
    assert parse_tool_calls(reply, call_format) == calls


@pytest.mark.parametrize(
    ("call_format", "reply", "problem"),
    [
        ("hermes", "<tool_call>{name: calculator}</tool_call>", "the tool call is not valid JSON (Expecting property"),
        ("hermes", '<tool_call>["calculator"]</tool_call>', 'a tool call is a JSON object {"name": ..., "arguments"'),
        ("hermes", '<tool_call>{"name": "calculator", "arguments": 3}</tool_call>', "the arguments of a call to 'calc"),
        ("llama3", '{"name": "calculator", "parameters": {', "the tool call is not valid JSON"),
        ("llama3", '{"parameters": {}}', 'a tool call is a JSON object {"name": ..., "parameters"'),
        ("llama3", "<|python_tag|>calculator(2)", "after <|python_tag|> write a JSON object"),
    ],
)
def test_an_unreadable_call_is_a_malformed_call_naming_the_problem(call_format, reply, problem):
    [call] = parse_tool_calls(reply, call_format)
    assert isinstance(call, MalformedCall) and call.problem.startswith(problem)


# --- tools ------------------------------------------------------------------------------------------


def convert(amount: float, unit: str, precise: bool = False, note: str | None = None) -> str:
    """Convert an amount to another unit.

    Uses the SI tables.

    Args:
        amount: how much
        unit (str): the unit to convert to, e.g. "km"; a long
            description that wraps: onto a second line
        precise: keep every digit

    Returns:
        the converted amount
    """
    return f"{amount} {unit}"


def test_a_tool_schema_is_derived_from_the_signature_and_docstring():
    assert describe_tool(convert).schema == {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert an amount to another unit. Uses the SI tables.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "description": "how much"},
                    "unit": {
                        "type": "string",
                        "description": 'the unit to convert to, e.g. "km"; a long description that wraps: '
                        "onto a second line",
                    },
                    "precise": {"type": "boolean", "default": False, "description": "keep every digit"},
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                },
                "required": ["amount", "unit"],
            },
        },
    }


def test_a_tool_parameter_without_a_type_hint_is_refused():
    def untyped(x):
        return x

    with pytest.raises(TypeError, match="parameter 'x' needs a type hint"):
        describe_tool(untyped)


def test_tool_arguments_are_checked_against_the_types():
    toolbox = Toolbox(["calculator"], timeout_s=5.0)
    answer = toolbox.answer(ToolCall("calculator", {"expression": ["1"]}))
    assert answer.error and answer.text.startswith("Error: bad arguments: expression: Input should be a valid string")


@pytest.mark.parametrize(
    ("expression", "value"),
    [("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("-2 ** 2", -4), ("7 / 2", 3.5), ("7 // 2", 3), ("2 ** 10 % 1000", 24)],
)
def test_the_calculator_does_arithmetic(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("__import__('os').system('true')", "is not allowed"),
        ("abs(-1)", "'abs(-1)' is not allowed"),
        ("x + 1", "'x' is not allowed"),
        ("'a' * 3", "is not allowed"),
        ("True + 1", "'True' is not allowed"),
        ("9 ** 9 ** 9", "is too large"),
        ("(-8) ** 0.5", "is not a real number"),
        ("2 +", "not an arithmetic expression"),
        ("1" * 501, "longer than 500 characters"),
    ],
)
def test_the_calculator_refuses_anything_but_bounded_arithmetic(expression, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        calculator(expression)


# --- config -----------------------------------------------------------------------------------------


def _react_config(**options: Any) -> str:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["explorer"] |= {"workflow": "react", "workflow_options": options}
    return yaml.safe_dump(data)


def test_react_options_parse_into_their_shape():
    options = parse_run_config(_react_config(tools=["calculator"], tool_call_format="llama3")).explorer.workflow_options
    assert type(options).__name__ == "ReactWorkflowOptions"
    assert isinstance(create_workflow("react", **options.model_dump()), ReactWorkflow)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tools": ["calc"]}, "explorer.workflow_options: tools.0: unknown 'calc'; known: calculator"),
        ({"tools": []}, "explorer.workflow_options: tools: Tuple should have at least 1 item"),
        (
            {"tool_call_format": "mistral"},
            "explorer.workflow_options: tool_call_format: Input should be 'hermes' or 'llama3'",
        ),
    ],
)
def test_a_wrong_tool_or_format_is_refused_when_the_config_is_parsed(options, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        parse_run_config(_react_config(**options))
