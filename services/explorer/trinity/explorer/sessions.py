"""Serve-mode sessions: every chat call an agent makes, recorded with its exact tokens, until feedback.

One session = one agent episode. Each recorded call becomes one experience when the application
posts the session's reward (`close`), all sharing that reward and one group id. Calls are kept
separate rather than concatenated into one token stream because agents re-send the whole history
and frameworks re-render it their own way (tool calls, trimmed context): only the tokens of each
call are known exactly, so that is what is trained on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trinity.explorer.workflows.base import RolloutSettings, new_experience
from trinity.v1 import common_pb2

SERVE_TASKSET = "serve"


@dataclass
class RecordedCall:
    """One chat completion: `logprobs[i]` is the sampling log-prob of `response_token_ids[i]` ([resp_len])."""

    call_id: str
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    logprobs: list[float]
    model_version: int
    prompt_text: str = ""
    response_text: str = ""
    finish_reason: str = ""
    tool_calls: int = 0


@dataclass
class Session:
    session_id: str
    calls: list[RecordedCall] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)


class SessionStore:
    """Open sessions by id; thread-safe. Sessions idle longer than `ttl_s` are dropped (never trained on)."""

    def __init__(self, ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.expired = 0

    def record(self, session_id: str, call: RecordedCall) -> int:
        """Append a call; returns the number of calls the session now holds."""
        with self._lock:
            self._expire()
            session = self._sessions.setdefault(session_id, Session(session_id))
            session.calls.append(call)
            session.last_used = self._clock()
            return len(session.calls)

    def close(self, session_id: str) -> Session | None:
        """Remove and return the session, or None if it is unknown, expired or already closed."""
        with self._lock:
            self._expire()
            return self._sessions.pop(session_id, None)

    def reopen(self, session: Session) -> None:
        """Put a closed session back (its experiences could not be stored; the caller may retry)."""
        with self._lock:
            self._sessions.setdefault(session.session_id, session).last_used = self._clock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _expire(self) -> None:
        cutoff = self._clock() - self.ttl_s
        for sid in [sid for sid, s in self._sessions.items() if s.last_used < cutoff]:
            del self._sessions[sid]
            self.expired += 1


def session_experiences(
    session: Session,
    *,
    run_id: str,
    reward: float,
    components: dict[str, float] | None = None,
    group_id: str = "",
) -> list[common_pb2.Experience]:
    """One ROLLOUT experience per recorded call, in call order, all with the session's reward.

    `group_id` (default: the session id) is what GRPO-style advantages normalise over: sessions that
    attempt the same task should share it. `episode_id` is the session id, `step_index` the call index.
    """
    group = group_id or session.session_id
    task = common_pb2.Task(id=group, taskset=SERVE_TASKSET)
    settings = RolloutSettings(run_id=run_id)
    out = []
    for index, call in enumerate(session.calls):
        exp = new_experience(
            task,
            settings,
            group_id=group,
            model_version=call.model_version,
            prompt_token_ids=call.prompt_token_ids,
            response_token_ids=call.response_token_ids,
            logprobs=call.logprobs,
            prompt_text=call.prompt_text,
            response_text=call.response_text,
            finish_reason=call.finish_reason,
        )
        exp.reward = reward
        exp.reward_components.update(components or {})
        exp.episode_id = session.session_id
        exp.step_index = index
        exp.metrics["tool_calls"] = float(call.tool_calls)
        exp.info["session_id"] = session.session_id
        exp.info["call_id"] = call.call_id
        out.append(exp)
    return out
