"""Checks on experiences at the boundary: a malformed one is refused with the field that is wrong."""

from __future__ import annotations

from collections.abc import Sequence

from trinity.runtime.errors import InvalidArgument
from trinity.runtime.limits import MAX_EXPERIENCE_TOKENS, MAX_ITEMS, MAX_NAME_CHARS
from trinity.v1 import common_pb2

MAX_ID_LENGTH = 256
PER_TOKEN_FIELDS = ("logprobs", "action_mask", "token_rewards", "teacher_logprobs")
NAME_FIELDS = ("run_id", "taskset", "task_id", "group_id", "episode_id", "state_key", "finish_reason")
MAP_FIELDS = ("reward_components", "metrics", "info")


def validate_experiences(experiences: Sequence[common_pb2.Experience], field: str = "experiences") -> None:
    for i, e in enumerate(experiences):
        experience_id = e.id
        n = len(e.response_token_ids)
        # One test per experience on the hot path; the slow path below names what is wrong.
        if (
            0 < len(experience_id) <= MAX_ID_LENGTH
            and e.model_version >= 0
            and len(e.logprobs) in (0, n)
            and len(e.action_mask) in (0, n)
            and len(e.token_rewards) in (0, n)
            and len(e.teacher_logprobs) in (0, n)
            and n + len(e.prompt_token_ids) + len(e.preference.rejected_token_ids) <= MAX_EXPERIENCE_TOKENS
            and max(len(e.run_id), len(e.taskset), len(e.task_id), len(e.group_id), len(e.episode_id), len(e.state_key))
            <= MAX_NAME_CHARS
            and len(e.finish_reason) <= MAX_NAME_CHARS
            and len(e.reward_components) + len(e.metrics) + len(e.info) <= MAX_ITEMS
        ):
            continue
        _refuse(e, f"{field}[{i}]")


def _refuse(e: common_pb2.Experience, where: str) -> None:
    if not e.id:
        raise InvalidArgument(f"{where}.id", "must be set (the Buffer drops duplicates by it)")
    if len(e.id) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{where}.id", f"longer than {MAX_ID_LENGTH} characters")
    if e.model_version < 0:
        raise InvalidArgument(f"{where}.model_version", f"must be >= 0, got {e.model_version}")
    n = len(e.response_token_ids)
    for name in PER_TOKEN_FIELDS:
        got = len(getattr(e, name))
        if got and got != n:
            raise InvalidArgument(
                f"{where}.{name}", f"has {got} entries but response_token_ids has {n} (one per token, or none)"
            )
    tokens = n + len(e.prompt_token_ids) + len(e.preference.rejected_token_ids)
    if tokens > MAX_EXPERIENCE_TOKENS:
        raise InvalidArgument(
            f"{where}.response_token_ids",
            f"{tokens} prompt, response and rejected tokens; at most {MAX_EXPERIENCE_TOKENS}",
        )
    for name in NAME_FIELDS:
        if len(getattr(e, name)) > MAX_NAME_CHARS:
            raise InvalidArgument(f"{where}.{name}", f"longer than {MAX_NAME_CHARS} characters")
    if sum(len(getattr(e, name)) for name in MAP_FIELDS) > MAX_ITEMS:
        raise InvalidArgument(f"{where}.metrics", f"{', '.join(MAP_FIELDS)} hold over {MAX_ITEMS} entries together")
    raise AssertionError(f"{where} failed validation for no reason the checks name")
