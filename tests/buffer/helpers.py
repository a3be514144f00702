"""Builders for realistic experiences in buffer tests."""

from __future__ import annotations

import uuid

from trinity.v1 import common_pb2


def experience(
    *,
    id: str | None = None,
    reward: float = 0.0,
    model_version: int = 0,
    group_id: str = "g",
    task_id: str = "",
    taskset: str = "",
    tokens: int = 4,
    failed: bool = False,
    components: dict[str, float] | None = None,
) -> common_pb2.Experience:
    return common_pb2.Experience(
        id=uuid.uuid4().hex if id is None else id,
        kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
        group_id=group_id,
        task_id=task_id,
        taskset=taskset,
        model_version=model_version,
        prompt_token_ids=[1, 2, 3],
        response_token_ids=list(range(tokens)),
        logprobs=[-0.5] * tokens,
        action_mask=[True] * tokens,
        reward=reward,
        reward_components=components or {},
        failed=failed,
    )
