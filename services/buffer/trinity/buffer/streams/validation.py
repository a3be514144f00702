"""Checks on experiences at the boundary: a malformed one is refused with the field that is wrong."""

from __future__ import annotations

from collections.abc import Sequence

from trinity.runtime.errors import InvalidArgument
from trinity.v1 import common_pb2

MAX_ID_LENGTH = 256
PER_TOKEN_FIELDS = ("logprobs", "action_mask", "token_rewards", "teacher_logprobs")


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
    raise AssertionError(f"{where} failed validation for no reason the checks name")
