"""Builders of experiences and algorithm parts shared by the trainer tests."""

from __future__ import annotations

import random

import trinity.algorithms as alg
from trinity.trainer.algorithm import AlgorithmParts
from trinity.v1 import common_pb2


def grpo_parts(kl_coef: float = 0.0, entropy_coef: float = 0.0, **loss_overrides: object) -> AlgorithmParts:
    """GRPO from the library's registered pieces, with explicit coefficients."""
    loss = alg.policy_loss("ppo", **loss_overrides)
    mode = loss.params["loss_agg_mode"]
    return AlgorithmParts(
        data_kind="rollout",
        advantage=alg.advantage("grpo"),
        policy_loss=loss,
        entropy=alg.entropy("default", entropy_coef=entropy_coef, loss_agg_mode=mode) if entropy_coef else None,
        kl=alg.kl("low_var_kl"),
        kl_coef=kl_coef,
        needs_reference=kl_coef > 0,
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


def grouped_rollouts(groups: int, per_group: int, *, seed: int = 0, vocab: int = 272) -> list[common_pb2.Experience]:
    """GRPO-shaped rollouts: `per_group` responses of varied length to each of `groups` prompts."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))]
        for k in range(per_group):
            r = rng.randint(1, 12)
            out.append(
                common_pb2.Experience(
                    id=f"g{seed}-{g}-{k}",
                    kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
                    group_id=f"g{g}",
                    prompt_token_ids=prompt,
                    response_token_ids=[rng.randrange(3, vocab) for _ in range(r)],
                    logprobs=[-rng.uniform(4.0, 7.0) for _ in range(r)],
                    action_mask=[rng.random() > 0.2 or j == 0 for j in range(r)],
                    reward=float(rng.random() > 0.5),
                )
            )
    return out
