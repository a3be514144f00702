"""A row -> its task's fields: the prompt (the prompt_key field, or the task set's template over the row), the
answer, and the per-row reward function and workflow names.

`check_rows` maps every row once when a task set is created, so a bad row is refused then, naming the key and
the row, and never when a task is leased.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from trinity.buffer.rows import Row, columns_of, lookup
from trinity.config import TaskSetConfig
from trinity.config.registered import RewardSpec, WorkflowName
from trinity.runtime.errors import InvalidArgument

Message = tuple[str, str]  # (role, content)

_NAMES: dict[str, TypeAdapter[str]] = {
    "reward_fn_key": TypeAdapter(RewardSpec),
    "workflow_key": TypeAdapter(WorkflowName),
}


@dataclass(frozen=True)
class TaskFields:
    prompt: str = ""
    messages: tuple[Message, ...] = ()  # a chat prompt (then `prompt` is empty)
    answer: str = ""
    reward_fn: str = ""
    workflow: str = ""


@dataclass
class RowMapping:
    """How `config` maps rows; remembers the per-row names it has checked against the registries."""

    config: TaskSetConfig
    _checked: set[tuple[str, str]] = field(default_factory=set)

    def fields(self, row: Row, index: int) -> TaskFields:
        """The task fields of row `index`; InvalidArgument naming the key when the row cannot fill them."""
        prompt, messages = self._prompt(row, index)
        answer = lookup(row, self.config.answer_key)
        return TaskFields(
            prompt=prompt,
            messages=messages,
            answer="" if answer is None else as_text(answer),
            reward_fn=self._name(row, index, "reward_fn_key", self.config.reward_fn_key) or self.config.reward_fn,
            workflow=self._name(row, index, "workflow_key", self.config.workflow_key),
        )

    def _prompt(self, row: Row, index: int) -> tuple[str, tuple[Message, ...]]:
        template = self.config.template
        value = self._question(row, index)
        if template is None:
            return ("", tuple(_chat(value, index, "prompt_key"))) if isinstance(value, list) else (as_text(value), ())
        if template.format == "chat":
            turns: list[Message] = [("system", template.system_prompt)] if template.system_prompt else []
            for example in template.few_shot:
                turns += [("user", example.prompt), ("assistant", example.answer)]
            turns += _chat(value, index, "prompt_key") if isinstance(value, list) else [("user", as_text(value))]
            return "", tuple(turns)
        if isinstance(value, list):
            raise InvalidArgument(
                "template.prompt",
                f"row {index}: {self.config.prompt_key!r} is a chat (a list of messages); the raw format needs "
                "text: set template.prompt to build it from the row's columns",
            )
        parts = [template.system_prompt] if template.system_prompt else []
        parts += [f"{example.prompt}\n{example.answer}" for example in template.few_shot]
        return "\n\n".join([*parts, as_text(value)]), ()

    def _question(self, row: Row, index: int) -> Any:
        """The row's own prompt: the template's format string filled from the row, or the prompt_key field."""
        template = self.config.template
        if template is not None and template.prompt:
            try:
                return template.prompt.format_map(row)
            except KeyError as err:
                raise InvalidArgument(
                    "template.prompt", f"row {index} has no {err.args[0]!r}; the row has: {columns_of(row)}"
                ) from None
            except (IndexError, TypeError, ValueError, AttributeError) as err:
                raise InvalidArgument("template.prompt", f"row {index}: {err}") from None
        value = lookup(row, self.config.prompt_key)
        if value is None:
            raise InvalidArgument(
                "prompt_key", f"{self.config.prompt_key!r} missing in row {index}; the row has: {columns_of(row)}"
            )
        return value

    def _name(self, row: Row, index: int, key_field: str, key: str) -> str:
        """A registry name the row gives under `key` ("" when it gives none), checked once per distinct name."""
        if not key:
            return ""
        value = lookup(row, key)
        if value is None or value == "":
            return ""
        if not isinstance(value, str):
            raise InvalidArgument(key_field, f"row {index}: {key!r} is {value!r}; it must name one (text)")
        if (key_field, value) not in self._checked:
            try:
                _NAMES[key_field].validate_python(value)
            except ValidationError as err:
                reason = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
                raise InvalidArgument(key_field, f"row {index}: {key!r} is {value!r}: {reason}") from None
            self._checked.add((key_field, value))
        return value


def check_rows(rows: Sequence[Row], mapping: RowMapping) -> None:
    """Every row maps to a task; a per-row key set on the task set must be a column of some row."""
    for index, row in enumerate(rows):
        mapping.fields(row, index)
    config = mapping.config
    for key_field, key in (("reward_fn_key", config.reward_fn_key), ("workflow_key", config.workflow_key)):
        if key and rows and all(lookup(row, key) is None for row in rows):
            raise InvalidArgument(key_field, f"{key!r} is in no row; the rows have: {columns_of(rows[0])}")


def as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _chat(messages: list[Any], index: int, key_field: str) -> list[Message]:
    """A prompt given as a chat: [{role, content}, ...] (role defaults to user)."""
    turns: list[Message] = []
    for message in messages:
        if not isinstance(message, dict):
            raise InvalidArgument(key_field, f"row {index}: a chat prompt is a list of {{role, content}} messages")
        turns.append((str(message.get("role", "user")), as_text(message.get("content", ""))))
    return turns
