"""Tools a model may call: typed Python functions, their OpenAI schemas, and bounded calls that never raise.

A tool is one function with type hints and a Google-style docstring, registered by name::

    @TOOLS.register("lookup")
    def lookup(word: str, limit: int = 3) -> list[str]:
        \"\"\"Dictionary entries of a word.

        Args:
            word: the word to look up
            limit: entries at most
        \"\"\"

`describe_tool` derives its OpenAI function schema from the signature (pydantic turns each annotation
into JSON schema) and the docstring (the summary, and each argument's line under `Args:`); the same
pydantic model checks the arguments a model sends. `Toolbox.answer` runs one call under a time limit
and turns every failure (an unknown tool, bad arguments, a raise, a timeout) into the text the model
reads next, so that a bad call costs the model a turn and never the rollout.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from trinity.explorer.rewards.base import call_bounded
from trinity.explorer.tools.calls import MalformedCall, ToolCall
from trinity.registry import Registry

ToolFn = Callable[..., Any]
TOOLS: Registry[ToolFn] = Registry("tool")

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Yields|Raises|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class Tool:
    """A callable tool: its function, its OpenAI schema and the pydantic model of its arguments."""

    name: str
    fn: ToolFn
    schema: dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}
    arguments: type[BaseModel]

    def signature(self) -> str:
        """`name(arg: type, ...)` as the model is told when its arguments are wrong."""
        props = self.schema["function"]["parameters"]["properties"]
        params = ", ".join(f"{key}: {prop.get('type', 'any')}" for key, prop in props.items())
        return f"{self.name}({params})"


@dataclass(frozen=True)
class ToolAnswer:
    """What a call returns to the model (a `tool` message), and whether it is an error."""

    text: str
    error: bool = False


def describe_tool(fn: ToolFn, name: str | None = None) -> Tool:
    """The tool of a typed function: every parameter needs a type hint; `name` defaults to the function's."""
    name = name or fn.__name__
    hints = typing.get_type_hints(fn)
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"tool {name!r}: parameter {param.name!r} must be a plain named parameter")
        if param.name not in hints:
            raise TypeError(f"tool {name!r}: parameter {param.name!r} needs a type hint (its JSON schema type)")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], Field(default, description=arg_docs.get(param.name)))
    arguments = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    parameters = _without_titles(arguments.model_json_schema())
    parameters.pop("additionalProperties", None)
    parameters.setdefault("properties", {})
    parameters.setdefault("required", [])
    schema = {"type": "function", "function": {"name": name, "description": summary, "parameters": parameters}}
    return Tool(name=name, fn=fn, schema=schema, arguments=arguments)


class Toolbox:
    """The tools one workflow offers, by name; every call runs in a thread bounded by `timeout_s`."""

    def __init__(self, tools: Sequence[str | ToolFn], timeout_s: float) -> None:
        built = [describe_tool(TOOLS.get(t), t) if isinstance(t, str) else describe_tool(t) for t in tools]
        self.tools = {t.name: t for t in built}
        if len(self.tools) != len(built):
            raise ValueError(f"tools: a name is offered twice in {[t.name for t in built]}")
        self.timeout_s = timeout_s

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def answer(self, call: ToolCall | MalformedCall) -> ToolAnswer:
        """The result of `call` as text, or an error message naming the problem (never raises)."""
        if isinstance(call, MalformedCall):
            return ToolAnswer(f"Error: {call.problem}", error=True)
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolAnswer(f"Error: unknown tool {call.name!r}; the tools are: {', '.join(self.tools)}", error=True)
        try:
            arguments = tool.arguments.model_validate(call.arguments)
        except ValidationError as err:
            return ToolAnswer(f"Error: bad arguments: {_problems(err)}; call it as {tool.signature()}", error=True)
        kwargs = {key: getattr(arguments, key) for key in type(arguments).model_fields}
        try:
            value = call_bounded(lambda: tool.fn(**kwargs), self.timeout_s, f"tool {tool.name}")
        except TimeoutError as err:
            return ToolAnswer(f"Error: {err}", error=True)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - whatever a tool raises is the model's to read
            return ToolAnswer(f"Error: {tool.name} failed: {type(err).__name__}: {err}", error=True)
        return ToolAnswer(value if isinstance(value, str) else json.dumps(value, default=str))


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The summary (text before the first section) and `Args:` descriptions of a Google-style docstring.

    Under `Args:`, a line at the indent of the first argument starts an argument (`name: text` or
    `name (type): text`); a line indented deeper continues the description before it.
    """
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    arg_indent: int | None = None
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if (header := _SECTION.match(stripped)) is not None:
            section, arg_indent, current = header.group(1), None, None
        elif section is None:
            summary.append(stripped)
        elif section in ("Args", "Arguments", "Parameters") and stripped:
            arg_indent = indent if arg_indent is None else arg_indent
            match = _ARG_LINE.match(stripped)
            if indent == arg_indent and match is not None:
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif indent > arg_indent and current is not None:
                args[current] = f"{args[current]} {stripped}".strip()
    return " ".join(" ".join(summary).split()), args


def _without_titles(schema: Any) -> Any:
    """pydantic's schema without its generated `title` keys (a property *named* title is kept)."""
    if isinstance(schema, dict):
        return {
            k: (_without_titles(v) if k != "properties" else {p: _without_titles(s) for p, s in v.items()})
            for k, v in schema.items()
            if not (k == "title" and isinstance(v, str))
        }
    if isinstance(schema, list):
        return [_without_titles(v) for v in schema]
    return schema


def _problems(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "arguments"
        if e["type"] == "extra_forbidden":
            parts.append(f"{where}: unknown argument")
        elif e["type"] == "missing":
            parts.append(f"{where}: missing")
        else:
            parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)
