"""Judges: who answers a judge reward's chat. Any OpenAI-compatible endpoint, or an engine the explorer starts.

A judge is one method, `complete(messages) -> text`; the rewards in `trinity.explorer.rewards.judge`
write the prompts, parse the replies and apply the time limit, retries and fallback, the same for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from trinity.config.explorer import JudgeConfig
from trinity.explorer.engines.base import Engine, GenerationRequest, SamplingSettings

Messages = list[dict[str, str]]


class JudgeError(RuntimeError):
    """The judge gave no usable answer (unreachable, an HTTP error, a reply that is not the asked-for JSON)."""


class Judge(Protocol):
    def complete(self, messages: Messages) -> str:
        """The judge's reply to a chat."""

    def close(self) -> None:
        """Release the connection or the engine."""


class OpenAIJudge:
    """A chat-completions endpoint (`base_url` ends in `/v1`): vLLM's server, Trinity's serve mode, a hosted API."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "",
        temperature: float = 0.0,
        max_tokens: int = 512,
        timeout_s: float = 60.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._client = httpx.Client(headers=headers, timeout=timeout_s)

    def complete(self, messages: Messages) -> str:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        try:
            reply = self._client.post(self.url, json=body)
        except httpx.HTTPError as err:
            raise JudgeError(f"judge {self.url} unreachable: {type(err).__name__}: {err}") from None
        if reply.status_code != 200:
            raise JudgeError(f"judge {self.url} answered HTTP {reply.status_code}: {reply.text[:200]}")
        try:
            content: Any = reply.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError(f"judge {self.url} sent no chat completion: {reply.text[:200]}") from None
        return content if isinstance(content, str) else ""

    def close(self) -> None:
        self._client.close()


class EngineJudge:
    """A judge model on a rollout engine of its own (never the policy's: its weights change every sync)."""

    def __init__(self, engine: Engine, *, temperature: float = 0.0, max_tokens: int = 512) -> None:
        self.engine = engine
        self.sampling = SamplingSettings(temperature=temperature, max_tokens=max_tokens)

    def complete(self, messages: Messages) -> str:
        (result,) = self.engine.generate([GenerationRequest(messages=messages, sampling=self.sampling)])
        return result.samples[0].text

    def close(self) -> None:
        self.engine.close()


@dataclass(frozen=True)
class JudgeSettings:
    """A judge and how to treat it: each call's time limit, calls per judgement, the reward when all fail."""

    judge: Judge
    timeout_s: float = 60.0
    max_attempts: int = 2
    fallback_reward: float = 0.0
    rubric: str = ""


def build_judge(config: JudgeConfig, seed: int = 0) -> JudgeSettings:
    """The judge `explorer.judge` describes: its endpoint, or its model loaded on an engine of its own."""
    judge: Judge
    if config.base_url:
        api_key = ""
        if config.api_key_env:
            api_key = os.environ.get(config.api_key_env, "")
            if not api_key:
                raise ValueError(f"explorer.judge.api_key_env: environment variable {config.api_key_env!r} is not set")
        judge = OpenAIJudge(
            config.base_url,
            config.model,
            api_key=api_key,
            temperature=config.temperature,
            max_tokens=config.max_tokens,
            timeout_s=config.timeout_seconds,
        )
    else:
        from trinity.explorer.engines import create_engine
        from trinity.models import resolve_model_path

        engine = create_engine(config.engine, model_path=resolve_model_path(config.model), seed=seed)
        judge = EngineJudge(engine, temperature=config.temperature, max_tokens=config.max_tokens)
    return JudgeSettings(
        judge=judge,
        timeout_s=config.timeout_seconds,
        max_attempts=config.max_attempts,
        fallback_reward=config.fallback_reward,
        rubric=config.rubric,
    )
