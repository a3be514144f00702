"""Serve-mode sessions: every chat call an agent makes, recorded with its exact tokens, until feedback.

One session = one agent episode. Feedback rewards either a whole session (every call left in it) or
one response (its choices, or one choice): the rewarded calls leave the store and become experiences
(`feedback_experiences`). Calls are kept separate rather than concatenated into one token stream
because agents re-send the whole history and frameworks re-render it their own way (tool calls,
trimmed context): only the tokens of each call are known exactly, so that is what is trained on.

Sessions idle longer than the TTL expire: their calls are counted, never trained (`expire`, which
the serve loop calls periodically).
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
    """One choice of one chat completion: `logprobs[i]` is the sampling log-prob of `response_token_ids[i]`.

    `call_id` is unique (it becomes the experience id, so a retried feedback is deduplicated by the
    Buffer); the `n` choices of one request share `response_id` and `step_index`.
    """

    call_id: str
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    logprobs: list[float]
    model_version: int
    prompt_text: str = ""
    response_text: str = ""
    finish_reason: str = ""
    tool_calls: int = 0
    response_id: str = ""
    choice_index: int = 0
    step_index: int = 0


@dataclass
class Session:
    """A session's calls (or, handed out by `take_response`, the calls of one response)."""

    session_id: str
    calls: list[RecordedCall] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)
    steps: int = 0  # requests recorded so far: the next request's step index


@dataclass(frozen=True)
class Expired:
    """What one `expire` sweep dropped."""

    sessions: int = 0
    calls: int = 0


@dataclass(frozen=True)
class SessionStats:
    """Totals since the store was made (the serve loop reports them as metrics)."""

    open_sessions: int
    open_calls: int
    recorded_calls: int
    rewarded_calls: int
    expired_sessions: int
    expired_calls: int


class SessionStore:
    """Open sessions by id, and which session holds each response; thread-safe."""

    def __init__(self, ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._responses: dict[str, str] = {}  # response id -> session id
        self._lock = threading.Lock()
        self._recorded = self._rewarded = self._expired_sessions = self._expired_calls = 0

    def record(self, session_id: str, calls: list[RecordedCall]) -> int:
        """Record the choices of one request (they get the session's next step index); returns that index."""
        with self._lock:
            session = self._sessions.setdefault(session_id, Session(session_id))
            step = session.steps
            session.steps += 1
            for call in calls:
                call.step_index = step
                session.calls.append(call)
                self._responses[call.response_id] = session_id
            session.last_used = self._clock()
            self._recorded += len(calls)
            return step

    def close(self, session_id: str) -> Session | None:
        """Remove and return the session, or None if it is unknown, expired or already closed."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is None:
                return None
            for call in session.calls:
                self._responses.pop(call.response_id, None)
            self._rewarded += len(session.calls)
            return session

    def take_response(self, response_id: str, choice_index: int | None = None) -> Session | None:
        """Remove and return the calls of one response (all its choices, or one), or None if none is open."""
        with self._lock:
            session_id = self._responses.get(response_id)
            session = None if session_id is None else self._sessions.get(session_id)
            if session is None:
                return None
            taken = [
                c
                for c in session.calls
                if c.response_id == response_id and (choice_index is None or c.choice_index == choice_index)
            ]
            if not taken:
                return None
            taken_ids = {c.call_id for c in taken}
            session.calls = [c for c in session.calls if c.call_id not in taken_ids]
            if not any(c.response_id == response_id for c in session.calls):
                del self._responses[response_id]
            if not session.calls:  # nothing left to reward; a later call with this id opens it afresh
                del self._sessions[session.session_id]
            self._rewarded += len(taken)
            return Session(session.session_id, taken, steps=session.steps)

    def restore(self, taken: Session) -> None:
        """Put back calls that `close` / `take_response` handed out (their experiences could not be stored)."""
        with self._lock:
            session = self._sessions.setdefault(taken.session_id, Session(taken.session_id, steps=taken.steps))
            session.calls = sorted(session.calls + taken.calls, key=lambda c: (c.step_index, c.choice_index))
            session.steps = max(session.steps, taken.steps)
            session.last_used = self._clock()
            for call in taken.calls:
                self._responses[call.response_id] = taken.session_id
            self._rewarded -= len(taken.calls)

    def expire(self) -> Expired:
        """Drop the sessions idle longer than the TTL; returns what this sweep dropped (counted, never trained).

        The only place sessions expire, so every expired session is reported by the sweep that dropped it.
        """
        with self._lock:
            cutoff = self._clock() - self.ttl_s
            stale = [s for s in self._sessions.values() if s.last_used < cutoff]
            for session in stale:
                del self._sessions[session.session_id]
                for call in session.calls:
                    self._responses.pop(call.response_id, None)
            swept = Expired(sessions=len(stale), calls=sum(len(s.calls) for s in stale))
            self._expired_sessions += swept.sessions
            self._expired_calls += swept.calls
            return swept

    def stats(self) -> SessionStats:
        with self._lock:
            return SessionStats(
                open_sessions=len(self._sessions),
                open_calls=sum(len(s.calls) for s in self._sessions.values()),
                recorded_calls=self._recorded,
                rewarded_calls=self._rewarded,
                expired_sessions=self._expired_sessions,
                expired_calls=self._expired_calls,
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


def feedback_experiences(
    taken: Session,
    *,
    run_id: str,
    reward: float,
    group_id: str,
    components: dict[str, float] | None = None,
    task: common_pb2.Task | None = None,
) -> list[common_pb2.Experience]:
    """One ROLLOUT experience per rewarded call, in call order, all with `reward` and group `group_id`.

    `group_id` is what GRPO-style advantages normalise over (the caller picks the default: the
    session id for session feedback, the response id for response feedback, so the `n` choices of one
    prompt form one group). `episode_id` is the session id, `step_index` the request's index in it. `task` is the
    task the calls answered, when there is one (the in-process `agentscope` workflow's).
    """
    task = task if task is not None else common_pb2.Task(id=group_id, taskset=SERVE_TASKSET)
    settings = RolloutSettings(run_id=run_id)
    out = []
    for call in taken.calls:
        exp = new_experience(
            task,
            settings,
            group_id=group_id,
            model_version=call.model_version,
            prompt_token_ids=call.prompt_token_ids,
            response_token_ids=call.response_token_ids,
            logprobs=call.logprobs,
            prompt_text=call.prompt_text,
            response_text=call.response_text,
            finish_reason=call.finish_reason,
        )
        exp.id = call.call_id
        exp.reward = reward
        exp.reward_components.update(components or {})
        exp.episode_id = taken.session_id
        exp.step_index = call.step_index
        exp.metrics["tool_calls"] = float(call.tool_calls)
        exp.info["session_id"] = taken.session_id
        exp.info["response_id"] = call.response_id
        exp.info["call_id"] = call.call_id
        exp.info["choice_index"] = str(call.choice_index)
        out.append(exp)
    return out
