"""Tools by registry name (`calculator`), their schemas, and the tool calls of a model's reply."""

from trinity.explorer.tools.base import TOOLS, Tool, ToolAnswer, Toolbox, ToolFn, describe_tool
from trinity.explorer.tools.calls import MalformedCall, ToolCall, parse_tool_calls

__all__ = [
    "TOOLS",
    "MalformedCall",
    "Tool",
    "ToolAnswer",
    "ToolCall",
    "ToolFn",
    "Toolbox",
    "describe_tool",
    "parse_tool_calls",
]
