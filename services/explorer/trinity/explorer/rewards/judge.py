"""Judge rewards, for tasks no rule can check: a judge model scores the responses.

- `judge_ruler` (RULER-style): the judge sees every response of a group at once and gives each a
  score in [0, 1] relative to the others. Group-relative advantages only use differences within a
  group, and ranking side by side is easier for a judge than grading each answer alone.
- `judge_rubric` (rubric as reward): the judge scores each response alone against a rubric, the
  task's `payload.rubric`, else `explorer.judge.rubric`.

Both reply in JSON. A judgement that fails `max_attempts` times (timeout, HTTP error, a reply that
is not the asked-for JSON) gives its responses `fallback_reward` and the component
`judge_fallback = 1`, and counts in `trinity_explorer_judge_fallbacks_total`: a flaky judge shows
in the metrics instead of stopping the run or passing unnoticed.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from trinity.explorer.metrics import JUDGE_FALLBACKS
from trinity.explorer.rewards.base import REWARDS, RewardOutcome, call_bounded
from trinity.explorer.rewards.judge_client import JudgeError, JudgeSettings, Messages
from trinity.runtime.logging import get_logger
from trinity.v1 import common_pb2

log = get_logger(__name__)
T = TypeVar("T")

RULER_SYSTEM = (
    "You are a strict judge. Several responses were written for the same task. Compare them with each other "
    "and give each a score between 0 and 1 for how well it accomplishes the task: better responses get higher "
    "scores, equally good ones equal scores. Reply with JSON only, in the form "
    '{"scores": [{"id": 1, "score": 0.7}, {"id": 2, "score": 0.2}]}, one entry per response.'
)
RUBRIC_SYSTEM = (
    "You are a strict judge. Score the response to the task against the rubric, between 0 (meets none of it) "
    'and 1 (meets all of it). Reply with JSON only, in the form {"score": 0.5}.'
)


class GroupReward(ABC):
    """A reward that needs the judge (and, for ranking, the whole group): the single-turn workflows call
    `score_group` with every response to one task."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, response_text: str, task: common_pb2.Task) -> float:
        # A per-sample caller (a composite, a multi-turn episode) cannot give the group or the judge.
        raise TypeError(
            f"reward {self.name!r} scores the responses to a task together with a judge; use it as the reward "
            "of a single-turn workflow (math, countdown), not inside a composite or per turn"
        )

    @abstractmethod
    def score_group(
        self, response_texts: Sequence[str], task: common_pb2.Task, judging: JudgeSettings | None
    ) -> list[RewardOutcome]:
        """One outcome per response, in order; a failed judgement gives the fallback, it never raises."""


def ask(judging: JudgeSettings, messages: Messages, parse: Callable[[str], T]) -> T:
    """The judge's parsed answer: up to `max_attempts` calls, each bounded by `timeout_s`; raises `JudgeError`."""
    errors: list[str] = []
    for _ in range(judging.max_attempts):
        try:
            return parse(call_bounded(lambda: judging.judge.complete(messages), judging.timeout_s, "judge"))
        except (JudgeError, TimeoutError) as err:
            errors.append(str(err))
    raise JudgeError(f"{judging.max_attempts} judge call(s) failed; last: {errors[-1]}")


def reply_json(text: str) -> Any:
    """The JSON object in a judge's reply (after any `</think>`, inside any code fence); `JudgeError` if none."""
    body = text.rsplit("</think>", 1)[-1]
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end < start:
        raise JudgeError(f"the judge's reply holds no JSON object: {text[:120]!r}")
    try:
        return json.loads(body[start : end + 1])
    except json.JSONDecodeError as err:
        raise JudgeError(f"the judge's reply is not valid JSON ({err.msg}): {text[:120]!r}") from None


def unit_score(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise JudgeError(f"{where}: score {value!r} is not a number in [0, 1]")
    return float(value)


def parse_ranking(text: str, n: int) -> list[float]:
    """`{"scores": [{"id": 1, "score": s}, ...]}` (or `{"scores": [s, ...]}`) -> n scores in response order."""
    reply = reply_json(text)
    scores = reply.get("scores") if isinstance(reply, dict) else None
    if not isinstance(scores, list) or len(scores) != n:
        raise JudgeError(f"the judge's reply needs 'scores' with {n} entries: {text[:120]!r}")
    if all(not isinstance(s, dict) for s in scores):
        return [unit_score(s, f"response {i + 1}") for i, s in enumerate(scores)]
    by_id: dict[int, float] = {}
    for entry in scores:
        if not isinstance(entry, dict) or "score" not in entry:
            raise JudgeError(f"the judge's 'scores' entry {entry!r} has no score")
        try:
            index = int(entry.get("id", len(by_id) + 1))
        except (TypeError, ValueError):
            raise JudgeError(f"the judge's 'scores' entry {entry!r} has no response id") from None
        by_id[index] = unit_score(entry["score"], f"response {index}")
    if sorted(by_id) != list(range(1, n + 1)):
        raise JudgeError(f"the judge scored responses {sorted(by_id)}, expected 1..{n}")
    return [by_id[i] for i in range(1, n + 1)]


def parse_rubric_score(text: str) -> float:
    reply = reply_json(text)
    if not isinstance(reply, dict) or "score" not in reply:
        raise JudgeError(f"the judge's reply has no 'score': {text[:120]!r}")
    return unit_score(reply["score"], "rubric")


def task_text(task: common_pb2.Task) -> str:
    if task.messages:
        return "\n".join(f"{m.role}: {m.content}" for m in task.messages)
    return task.prompt


def ruler_messages(task: common_pb2.Task, response_texts: Sequence[str]) -> Messages:
    responses = "\n\n".join(f'<response id="{i + 1}">\n{t}\n</response>' for i, t in enumerate(response_texts))
    return [
        {"role": "system", "content": RULER_SYSTEM},
        {"role": "user", "content": f"<task>\n{task_text(task)}\n</task>\n\n{responses}"},
    ]


def rubric_messages(task: common_pb2.Task, response_text: str, rubric: str) -> Messages:
    parts = (
        f"<task>\n{task_text(task)}\n</task>",
        f"<rubric>\n{rubric}\n</rubric>",
        f"<response>\n{response_text}\n</response>",
    )
    user = "\n\n".join(parts)
    return [{"role": "system", "content": RUBRIC_SYSTEM}, {"role": "user", "content": user}]


def _require(name: str, judging: JudgeSettings | None) -> JudgeSettings:
    # A missing judge is a config mistake, not a flaky judge: no fallback, the explorer stops and says why.
    if judging is None:
        raise ValueError(f"reward {name!r} needs a judge: set explorer.judge (base_url and model) in the run config")
    return judging


def judged(score: float) -> RewardOutcome:
    return RewardOutcome(reward=score, components={"judge": score})


def fallback(name: str, judging: JudgeSettings, count: int, err: JudgeError) -> list[RewardOutcome]:
    JUDGE_FALLBACKS.inc(count)
    log.warning("reward.judge_fallback", reward=name, responses=count, error=str(err))
    return [RewardOutcome(reward=judging.fallback_reward, components={"judge_fallback": 1.0}) for _ in range(count)]


class RulerReward(GroupReward):
    """The whole group in one judge call; all its responses fall back together if it fails."""

    def score_group(
        self, response_texts: Sequence[str], task: common_pb2.Task, judging: JudgeSettings | None
    ) -> list[RewardOutcome]:
        settings = _require(self.name, judging)
        n = len(response_texts)
        try:
            scores = ask(settings, ruler_messages(task, response_texts), lambda text: parse_ranking(text, n))
        except JudgeError as err:
            return fallback(self.name, settings, n, err)
        return [judged(s) for s in scores]


class RubricReward(GroupReward):
    """One judge call per response against the rubric; only the responses it failed on fall back."""

    def score_group(
        self, response_texts: Sequence[str], task: common_pb2.Task, judging: JudgeSettings | None
    ) -> list[RewardOutcome]:
        settings = _require(self.name, judging)
        fields = task.payload.fields
        rubric = fields["rubric"].string_value if "rubric" in fields else settings.rubric
        if not rubric:
            raise ValueError(
                f"reward {self.name!r}: task {task.id!r} has no payload.rubric and explorer.judge.rubric is empty"
            )
        outcomes = []
        for text in response_texts:
            try:
                outcomes.append(judged(ask(settings, rubric_messages(task, text, rubric), parse_rubric_score)))
            except JudgeError as err:
                outcomes.extend(fallback(self.name, settings, 1, err))
        return outcomes


REWARDS.register("judge_ruler")(RulerReward("judge_ruler"))
REWARDS.register("judge_rubric")(RubricReward("judge_rubric"))
