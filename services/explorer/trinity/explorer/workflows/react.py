"""ReAct: the model calls tools until it answers; the answer is scored by the task's reward.

A `multi_turn` episode whose environment is the toolbox: the first prompt lists the tools (the chat
template's own tool prompt, or a system prompt teaching the chosen call format), each model turn is
parsed for tool calls, and their results come back as `tool` messages, environment tokens masked from
the loss. A turn without a call is the final answer. Every failed call (unreadable, an unknown tool, bad
arguments, a raise, a timeout) is answered with an error message, so the model may try again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trinity.config.explorer import ToolCallFormat
from trinity.explorer.chat_tools import render_chat
from trinity.explorer.engines.base import Engine
from trinity.explorer.tools import Toolbox, ToolFn, parse_tool_calls
from trinity.explorer.workflows.base import WORKFLOWS, RolloutSettings
from trinity.explorer.workflows.multi_turn import ChatEnvironment, ChatEpisode, EnvReply, MultiTurnWorkflow
from trinity.v1 import common_pb2


class ToolEnvironment(ChatEnvironment):
    """Answers a model turn's tool calls with `tool` messages; a turn without a call ends the episode."""

    def __init__(self, toolbox: Toolbox, call_format: ToolCallFormat) -> None:
        self.toolbox = toolbox
        self.call_format = call_format

    def respond(self, messages: list[dict[str, str]], task: common_pb2.Task) -> EnvReply:
        calls = parse_tool_calls(messages[-1]["content"], self.call_format)
        if not calls:
            return EnvReply(done=True, metrics={"tool_calls": 0.0, "tool_errors": 0.0})
        answers = [self.toolbox.answer(call) for call in calls]
        return EnvReply(
            answers[0].text,
            role="tool",
            more=tuple(a.text for a in answers[1:]),
            metrics={"tool_calls": float(len(answers)), "tool_errors": float(sum(a.error for a in answers))},
        )


@WORKFLOWS.register("react")
class ReactWorkflow(MultiTurnWorkflow):
    """Tool calls, then an answer scored by `reward_fn` (the task's own if it names one).

    `tools` are registered tool names or typed functions (see `trinity.explorer.tools`). An episode that
    reaches `max_turns` still calling tools gave no answer: reward 0, `info["ended_by"] == "max_turns"`.
    """

    def __init__(
        self,
        tools: Sequence[str | ToolFn] = ("calculator",),
        tool_call_format: ToolCallFormat = "hermes",
        max_turns: int = 4,
        tool_timeout_s: float = 5.0,
        system_prompt: str | None = None,
        reward_fn: str = "",
    ) -> None:
        self.toolbox = Toolbox(tools, tool_timeout_s)
        self.call_format = tool_call_format
        super().__init__(
            environment=lambda task: ToolEnvironment(self.toolbox, self.call_format),
            max_turns=max_turns,
            system_prompt=system_prompt,
            reward_fn=reward_fn,
        )

    def run(self, task: common_pb2.Task, engine: Engine, settings: RolloutSettings) -> list[common_pb2.Experience]:
        self.reward_fn(task)  # an answer that nothing scores teaches nothing: refuse such a task up front
        return super().run(task, engine, settings)

    def prompt_ids(self, engine: Engine, messages: list[dict[str, str]]) -> list[int]:
        tok = engine.tokenizer
        text = render_chat(tok, messages, self.toolbox.schemas, self.call_format)
        # The template already wrote any BOS it wants; adding specials again would double it.
        return list(tok.encode(text, add_special_tokens=False))

    def _experience(
        self, task: common_pb2.Task, settings: RolloutSettings, group_id: str, ep: ChatEpisode, reward_fn: Any
    ) -> common_pb2.Experience:
        # Cut off while still calling tools, the last model turn is a call, not an answer to score.
        exp = super()._experience(task, settings, group_id, ep, reward_fn if ep.done else None)
        exp.info["ended_by"] = "answer" if ep.done else "max_turns"
        return exp
