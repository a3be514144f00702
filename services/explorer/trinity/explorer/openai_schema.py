"""The request bodies of the serve endpoint (`openai_api.py`), validated with OpenAI's ranges.

A field that would change the sampling distribution but that the engine cannot honour is refused
(422 naming it) rather than ignored: the recorded log-probs would no longer be those of the
distribution sampled from, and the trainer would learn from the wrong ratio.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trinity.runtime.limits import MAX_ITEMS, MAX_NAME_CHARS, MAX_PROMPT_CHARS, MAX_STOP_STRINGS, MIN_TEMPERATURE

MAX_CHOICES = 16  # `n` per request: each choice is a recorded call, so n bounds one request's share of a batch


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arguments: str | dict[str, Any] = Field(default="{}", description="JSON text (OpenAI), or an object")


class ToolCall(BaseModel):
    """An assistant message's call of a tool, as the model's earlier reply gave it to the agent."""

    model_config = ConfigDict(extra="allow")

    id: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)


class ToolSpec(BaseModel):
    """A tool the model may call; rendered into the prompt as the client sent it."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    function: FunctionSpec


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    content: str | list[dict[str, Any]] | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_ITEMS)
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, value: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        # Dropping an image or audio part would train the model on a prompt that is not the one the agent sent.
        for part in value if isinstance(value, list) else ():
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"only text parts ({{'type': 'text', 'text': ...}}) are supported, got {part.get('type')!r}"
                )
        return value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


StopText = Annotated[str, Field(max_length=MAX_NAME_CHARS)]


class ChatCompletionRequest(BaseModel):
    """The OpenAI fields serve mode honours; others clients send (`metadata`, `store`, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_ITEMS)
    tools: list[ToolSpec] | None = Field(default=None, max_length=MAX_ITEMS)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = Field(default=None, description="accepted: every call a reply holds is parsed")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, description="vLLM's extension: -1 (off) or > 0")
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    session_id: str | None = Field(default=None, max_length=MAX_NAME_CHARS)

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float | None) -> float | None:
        if value is not None and 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"must be 0 (greedy) or at least {MIN_TEMPERATURE:g}")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("must be -1 (no top-k) or a positive number of tokens")
        return value

    @field_validator("seed")
    @classmethod
    def _seed(cls, value: int | None) -> int | None:
        if value is not None:
            # vLLM's CPU build fails per-request seeds; the engine is seeded once for the run instead.
            raise ValueError("per-request seeds are not supported: the engine is seeded once per run; drop seed")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("only 0 is supported: a penalty would sample away from the policy being trained")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("not supported: a bias would sample away from the policy being trained")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("only 0 is supported: the engine reports the sampled token's log-prob alone")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type", "text") != "text":
            raise ValueError("only {'type': 'text'} is supported (no constrained decoding)")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value not in (None, "auto", "none"):
            raise ValueError("only 'auto' and 'none' are supported (no constrained decoding)")
        return value


class FeedbackRequest(BaseModel):
    """A reward for a whole session (`session_id`) or for one response (`response_id`, maybe one choice)."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    response_id: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    choice_index: int | None = Field(default=None, ge=0, lt=MAX_CHOICES)
    reward: float = Field(allow_inf_nan=False)
    components: dict[str, float] = Field(default_factory=dict, max_length=MAX_ITEMS)
    group_id: str = Field(
        default="",
        max_length=MAX_NAME_CHARS,
        description="GRPO group; default: the session id (session feedback) or the response id (response feedback)",
    )

    @model_validator(mode="after")
    def _one_target(self) -> FeedbackRequest:
        if (self.session_id is None) == (self.response_id is None):
            raise ValueError("give exactly one of session_id (reward a session) or response_id (reward a response)")
        if self.choice_index is not None and self.response_id is None:
            raise ValueError("choice_index needs response_id")
        return self
