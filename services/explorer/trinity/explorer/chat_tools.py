"""Chats with tools -> prompt tokens, and model text -> OpenAI tool calls (Hermes `<tool_call>` format).

Templates that know tools (Qwen2.5/3, Llama-3.1, SmolLM3, ...) get the `tools=` argument of
`apply_chat_template`. Templates that do not (plain ChatML, SmolLM2) would silently drop the tools,
so for them the tool list goes into the system message with instructions to answer in the Hermes
format (or Llama 3.1's bare JSON object, for the `react` workflow's `llama3` format), and earlier
assistant tool calls are written back in that same format: the model always sees the format it is
asked to produce. The OpenAI endpoint parses replies for `<tool_call>{json}</tool_call>`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from trinity.config.explorer import ToolCallFormat

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

TOOLS_SYSTEM_PROMPT = (
    "Functions you may call:\n<tools>\n{tools}\n</tools>\n"
    'To call one, reply <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>'
)
LLAMA3_TOOLS_SYSTEM_PROMPT = (
    "Functions you may call:\n{tools}\n"
    'To call one, reply with only a JSON object {{"name": ..., "parameters": {{...}}}}'
)
_SYSTEM_PROMPTS = {"hermes": TOOLS_SYSTEM_PROMPT, "llama3": LLAMA3_TOOLS_SYSTEM_PROMPT}


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads the `tools` variable (else it would drop them)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: HF picks "tool_use" when tools are given
        return "tool_use" in template or any("tools" in t for t in template.values())
    return isinstance(template, str) and "tools" in template


def content_text(content: Any) -> str:
    """OpenAI message content (a string, None, or a list of `{"type": "text", "text": ...}` parts) as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")


def render_chat(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    call_format: ToolCallFormat = "hermes",
) -> str:
    """The prompt text (chat template + generation prompt) for an OpenAI-style chat with optional tools.

    `call_format` is the format a template without tool support is taught (a template with it teaches its own).
    """
    if tools and template_supports_tools(tokenizer):
        native = [_native_message(m) for m in messages]
        return str(tokenizer.apply_chat_template(native, tools=list(tools), tokenize=False, add_generation_prompt=True))
    flat = [_flat_message(m, call_format) for m in messages]
    if tools:
        prompt = _SYSTEM_PROMPTS[call_format].format(
            tools="\n".join(json.dumps(t, separators=(",", ":")) for t in tools)
        )
        if flat and flat[0]["role"] == "system":
            flat[0] = {"role": "system", "content": f"{flat[0]['content']}\n\n{prompt}"}
        else:
            flat.insert(0, {"role": "system", "content": prompt})
    return str(tokenizer.apply_chat_template(flat, tokenize=False, add_generation_prompt=True))


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split a reply into its plain content and OpenAI `tool_calls` (arguments as a JSON string).

    A block that is not a JSON object with a string `name` stays in the content: the agent sees
    what the model wrote rather than a call it did not make.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in TOOL_CALL.finditer(text):
        call = _parse_call(match.group(1))
        if call is None:
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(call)
    kept.append(text[last:])
    return "".join(kept).strip() if calls else text, calls


def _parse_call(body: str) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": data["name"], "arguments": arguments},
    }


def _native_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as HF tool-aware templates expect it: text content, arguments parsed to a dict."""
    out: dict[str, Any] = {"role": message["role"], "content": content_text(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": "function",
                "id": call.get("id", ""),
                "function": {
                    "name": call["function"]["name"],
                    "arguments": _json_or_text(call["function"].get("arguments", "{}")),
                },
            }
            for call in message["tool_calls"]
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


def _flat_message(message: dict[str, Any], call_format: ToolCallFormat) -> dict[str, str]:
    """A message for a template without tool support: tool calls written out in `call_format`."""
    text = content_text(message.get("content"))
    for call in message.get("tool_calls") or []:
        name, arguments = call["function"]["name"], _json_or_text(call["function"].get("arguments", "{}"))
        if call_format == "llama3":
            text += "\n" + json.dumps({"name": name, "parameters": arguments})
        else:
            text += f"\n<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
    return {"role": message["role"], "content": text.strip() if message.get("tool_calls") else text}


def _json_or_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value
