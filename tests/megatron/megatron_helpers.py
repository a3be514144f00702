"""Run configs and random rollouts for the Megatron tests (same generator as tests/trainer/trainer_helpers.py)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from trinity.config import RunConfig
from trinity.v1 import common_pb2


def grpo_config(model: Path, *, kl_coef: float = 0.0, entropy_coef: float | None = None, seed: int = 0,
                **trainer: Any) -> RunConfig:  # fmt: skip
    """A GRPO run config for `model`; `trainer` are fields of the trainer section (`backend` included)."""
    return RunConfig.model_validate(
        {
            "mode": "train",  # with placeholder offline data: the backends read neither
            "seed": seed,
            "model": {"path": str(model)},
            "algorithm": {"algorithm_type": "grpo", "kl_coef": kl_coef, "entropy_coef": entropy_coef},
            "buffer": {"offline_data": {"path": "unused.jsonl"}},
            "trainer": trainer,
        }
    )


def random_rollouts(n: int, *, seed: int = 0, vocab: int = 272, groups: int = 2) -> list[common_pb2.Experience]:
    """Rollouts of varied prompt/response lengths with sampler log-probs, partial action masks and rewards."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = rng.randint(2, 9)
        r = rng.randint(1, 12)
        out.append(
            common_pb2.Experience(
                id=f"r{seed}-{i}",
                kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
                group_id=f"g{i % groups}",
                prompt_token_ids=[rng.randrange(3, vocab) for _ in range(p)],
                response_token_ids=[rng.randrange(3, vocab) for _ in range(r)],
                logprobs=[-rng.uniform(4.0, 7.0) for _ in range(r)],
                action_mask=[rng.random() > 0.2 or j == 0 for j in range(r)],
                reward=float(rng.random() > 0.5) + 0.1 * i,
            )
        )
    return out
