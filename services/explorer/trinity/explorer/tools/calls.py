"""Tool calls in a model's reply, in the two formats model families are trained on.

- `hermes` (Qwen2.5/3, Hermes, ChatML models taught by the system prompt): any number of
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (the OpenAI endpoint's pattern).
- `llama3` (Llama 3.1+ JSON tool calling): the reply is one JSON object `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>` (engines drop special tokens from the text, so usually without it);
  text after the object is ignored.

A reply without a call is a final answer (`[]`). A call that cannot be read (not JSON, no name, arguments
that are not an object) is a `MalformedCall` whose `problem` the model is told, rather than a reply that
silently counts as an answer.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from trinity.config.explorer import ToolCallFormat
from trinity.explorer.chat_tools import TOOL_CALL

PYTHON_TAG = "<|python_tag|>"
_SHOWN = 200  # characters of a bad call quoted back to the model


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedCall:
    problem: str  # what the model is told, e.g. "the tool call is not valid JSON (...)"


def parse_tool_calls(text: str, call_format: ToolCallFormat) -> list[ToolCall | MalformedCall]:
    """The calls of one reply, in order; `[]` when the reply is an answer."""
    if call_format == "hermes":
        return [_decode(match.group(1), "arguments") for match in TOOL_CALL.finditer(text)]
    body = text.strip()
    tagged = body.startswith(PYTHON_TAG)
    body = body.removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        if tagged:
            return [MalformedCall(f'after {PYTHON_TAG} write a JSON object {{"name": ..., "parameters": {{...}}}}')]
        return []
    try:
        _, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as err:
        return [MalformedCall(f"the tool call is not valid JSON ({err.msg} at character {err.pos}): {body[:_SHOWN]}")]
    return [_decode(body[:end], "parameters")]


def _decode(body: str, arguments_key: str) -> ToolCall | MalformedCall:
    shape = f'{{"name": ..., "{arguments_key}": {{...}}}}'
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        return MalformedCall(f"the tool call is not valid JSON ({err.msg} at character {err.pos}): {body[:_SHOWN]}")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return MalformedCall(f"a tool call is a JSON object {shape}; got {body[:_SHOWN]}")
    # Either key, whatever the format: Hermes models write "parameters" too, and Llama 3.2 "arguments".
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI style: the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):  # not JSON: refused below as not an object
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return MalformedCall(
            f"the {arguments_key} of a call to {data['name']!r} must be a JSON object; got {body[:_SHOWN]}"
        )
    return ToolCall(data["name"], arguments)
