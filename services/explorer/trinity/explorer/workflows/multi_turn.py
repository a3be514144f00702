"""Multi-turn chat: model turns alternate with environment (user / tool) turns; one experience per episode.

The episode is one token stream: the prompt, then model tokens (`action_mask` true, sampled
log-probs) interleaved with environment tokens (`action_mask` false, log-prob 0). Each model turn
is generated from the exact token prefix (`prompt_token_ids`), so training sees the very tokens
that were sampled; environment turns are rendered with the tokenizer's chat template.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trinity.explorer.engines.base import Engine, GenerationRequest
from trinity.explorer.rewards.math import extract_last_number
from trinity.explorer.workflows.base import (
    WORKFLOWS,
    RolloutSettings,
    Workflow,
    new_experience,
    new_id,
    reward_timer,
    score,
    task_messages,
)
from trinity.registry import Registry
from trinity.v1 import common_pb2


@dataclass
class EnvReply:
    """The environment's answer to a model turn. `content=None` with `done=True` ends silently.

    `more` are further messages of `role` after `content` (the answers to a turn's several tool calls);
    `metrics` are added up over the episode into the experience's metrics.
    """

    content: str | None = None
    role: str = "user"  # "user" or "tool"
    done: bool = False
    reward: float = 0.0
    more: tuple[str, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)


class ChatEnvironment(ABC):
    """One episode's environment; a fresh instance per episode (it may keep state)."""

    @abstractmethod
    def respond(self, messages: list[dict[str, str]], task: common_pb2.Task) -> EnvReply:
        """React to the conversation so far (its last message is the model's turn)."""


ChatEnvironmentFactory = Callable[[common_pb2.Task], ChatEnvironment]
CHAT_ENVIRONMENTS: Registry[ChatEnvironmentFactory] = Registry("chat_environment")


@CHAT_ENVIRONMENTS.register("guess_number")
class GuessNumberEnvironment(ChatEnvironment):
    """The model guesses `task.answer`; the env says higher / lower; reward 1 when guessed."""

    def __init__(self, task: common_pb2.Task) -> None:
        self.secret = int(task.answer)

    def respond(self, messages: list[dict[str, str]], task: common_pb2.Task) -> EnvReply:
        guess = extract_last_number(messages[-1]["content"])
        if guess is None:
            return EnvReply("Please answer with a number.")
        value = float(guess)
        if value == self.secret:
            return EnvReply("Correct!", done=True, reward=1.0)
        return EnvReply("Higher." if value < self.secret else "Lower.")


@dataclass
class ChatEpisode:
    """One episode's transcript and token stream so far (`ids` [prompt + response], the rest [response])."""

    messages: list[dict[str, str]]
    ids: list[int]
    prompt_len: int
    prompt_text: str
    logprobs: list[float] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    env_reward: float = 0.0
    env_metrics: dict[str, float] = field(default_factory=dict)
    turns: int = 0
    done: bool = False
    finish_reason: str = ""

    def extend(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids.extend(ids)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.mask.extend([logprobs is not None] * len(ids))


@WORKFLOWS.register("multi_turn")
class MultiTurnWorkflow(Workflow):
    """Chat with an environment for up to `max_turns` model turns; repeats run in lockstep (batched).

    The reward is the sum of the environment's rewards, plus `reward_fn(last model turn)` when the
    task (or `reward_fn` here) names one.
    """

    def __init__(
        self,
        environment: str | ChatEnvironmentFactory = "guess_number",
        max_turns: int = 4,
        system_prompt: str | None = None,
        reward_fn: str = "",
    ) -> None:
        self.env_factory = CHAT_ENVIRONMENTS.get(environment) if isinstance(environment, str) else environment
        self.max_turns = max_turns
        self.system_prompt = system_prompt
        self.default_reward = reward_fn

    def run(self, task: common_pb2.Task, engine: Engine, settings: RolloutSettings) -> list[common_pb2.Experience]:
        tok = engine.tokenizer
        reward_fn = self.reward_fn(task) if (task.reward_fn or self.default_reward) else None
        start = task_messages(task, self.system_prompt)
        prompt_ids = self.prompt_ids(engine, start)
        prompt_text = tok.decode(prompt_ids)
        envs = [self.env_factory(task) for _ in range(settings.repeat_times)]
        episodes = [
            ChatEpisode(list(start), list(prompt_ids), len(prompt_ids), prompt_text)
            for _ in range(settings.repeat_times)
        ]
        for _ in range(self.max_turns):
            active = [i for i, ep in enumerate(episodes) if not ep.done]
            if not active:
                break
            requests = [GenerationRequest(prompt_token_ids=episodes[i].ids, sampling=settings.sampling) for i in active]
            for i, result in zip(active, engine.generate(requests), strict=True):
                ep, sample = episodes[i], result.samples[0]
                ep.extend(sample.token_ids, sample.logprobs)
                ep.versions.append(result.model_version)
                ep.turns += 1
                ep.finish_reason = sample.finish_reason
                ep.messages.append({"role": "assistant", "content": sample.text})
                reply = envs[i].respond(ep.messages, task)
                ep.env_reward += reply.reward
                for key, value in reply.metrics.items():
                    ep.env_metrics[key] = ep.env_metrics.get(key, 0.0) + value
                ep.done = reply.done
                if reply.content is None:
                    continue
                contents = (reply.content, *reply.more)
                ep.messages.extend({"role": reply.role, "content": c} for c in contents)
                if not ep.done:
                    # The final env message is kept in the transcript but needs no tokens: nothing follows it.
                    closing = [] if sample.token_ids[-1:] == [tok.eos_token_id] else [tok.eos_token_id]
                    ep.extend(closing + env_turn_ids(tok, reply.role, *contents), None)
        group_id = new_id()
        return [self._experience(task, settings, group_id, ep, reward_fn) for ep in episodes]

    def prompt_ids(self, engine: Engine, messages: list[dict[str, str]]) -> list[int]:
        """Tokens of an episode's first prompt: the chat template's; a workflow that prompts with more (tools)
        renders its own."""
        return engine.encode_prompt(GenerationRequest(messages=messages))

    def _experience(
        self, task: common_pb2.Task, settings: RolloutSettings, group_id: str, ep: ChatEpisode, reward_fn: Any
    ) -> common_pb2.Experience:
        response_ids = ep.ids[ep.prompt_len :]
        last_model_turn = next(m["content"] for m in reversed(ep.messages) if m["role"] == "assistant")
        exp = new_experience(
            task,
            settings,
            group_id=group_id,
            # The oldest weights that contributed: what the staleness bound must see.
            model_version=min(ep.versions),
            prompt_token_ids=ep.ids[: ep.prompt_len],
            response_token_ids=response_ids,
            logprobs=ep.logprobs,
            action_mask=ep.mask,
            prompt_text=ep.prompt_text,
            response_text=last_model_turn,
            finish_reason=ep.finish_reason,
        )
        for m in ep.messages:
            exp.messages.add(role=m["role"], content=m["content"])
        exp.episode_id = new_id()
        exp.metrics["turns"] = float(ep.turns)
        exp.metrics["env_tokens"] = float(ep.mask.count(False))
        exp.metrics.update(ep.env_metrics)
        exp.info["ended_by"] = "environment" if ep.done else "max_turns"
        exp.reward_components["env"] = ep.env_reward
        exp.reward = ep.env_reward
        if reward_fn is not None:
            env_reward = ep.env_reward
            with reward_timer(settings):
                score(exp, reward_fn, last_model_turn, task, settings.reward_timeout_s)
            exp.reward_components["env"] = env_reward
            exp.reward_components["reward_fn"] = exp.reward
            exp.reward += env_reward
        return exp


_PROBE_USER, _PROBE_ASSISTANT = "\x00probe-user\x00", "\x00probe-assistant\x00"


def env_turn_ids(tokenizer: Any, role: str, *contents: str) -> list[int]:
    """Tokens of environment messages (one per content, all of `role`) plus the next assistant header, as the
    chat template writes them.

    Found by rendering a probe chat with and without the messages: the difference is their
    turns and the generation prompt; whatever the template writes after an assistant turn's end-of-turn
    token (e.g. ChatML's newline) is prepended, because the model's tokens stop at that token.
    """
    probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
    before = tokenizer.apply_chat_template(probe, tokenize=False)
    after = tokenizer.apply_chat_template(
        [*probe, *({"role": role, "content": c} for c in contents)], tokenize=False, add_generation_prompt=True
    )
    if not after.startswith(before):
        raise ValueError(
            "the chat template re-renders earlier turns when a turn is added; multi_turn needs a prefix-stable template"
        )
    tail = before[before.index(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT) :]
    eos = tokenizer.eos_token or ""
    after_eos = tail[tail.index(eos) + len(eos) :] if eos and eos in tail else ""
    return list(tokenizer.encode(after_eos + after[len(before) :], add_special_tokens=False))
