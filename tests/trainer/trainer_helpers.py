"""Builders of experiences and algorithm parts shared by the trainer tests."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import trinity.algorithms as alg
from trinity.config import RunConfig
from trinity.trainer.algorithm import AlgorithmParts
from trinity.v1 import common_pb2


def run_config(
    model: Path,
    algorithm: str = "grpo",
    *,
    seed: int = 0,
    total_steps: int = 10,
    kl_coef: float | None = None,
    entropy_coef: float | None = None,
    policy_loss: dict[str, Any] | None = None,
    algorithm_fields: dict[str, Any] | None = None,
    **trainer: Any,
) -> RunConfig:
    """A run config that trains `model` with `algorithm` (its coefficients and policy-loss overrides, and any other
    `algorithm_fields`); `trainer` are fields of the trainer section.

    Mode `train` with a placeholder offline data path: the backends read neither the mode nor the data.
    """
    return RunConfig.model_validate(
        {
            "mode": "train",
            "seed": seed,
            "model": {"path": str(model)},
            "algorithm": {
                "algorithm_type": algorithm,
                "kl_coef": kl_coef,
                "entropy_coef": entropy_coef,
                "policy_loss": policy_loss or {},
                **(algorithm_fields or {}),
            },
            "buffer": {"total_steps": total_steps, "offline_data": {"path": "unused.jsonl"}},
            "trainer": trainer,
        }
    )


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


def _rollout(
    rng: random.Random, *, id: str, group_id: str, prompt: list[int], r: int, vocab: int, reward_offset: float = 0.0
) -> common_pb2.Experience:
    """A rollout with `r` random response tokens, sampler log-probs, a partial action mask and a 0/1 reward."""
    return common_pb2.Experience(
        id=id,
        kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
        group_id=group_id,
        prompt_token_ids=prompt,
        response_token_ids=[rng.randrange(3, vocab) for _ in range(r)],
        logprobs=[-rng.uniform(4.0, 7.0) for _ in range(r)],
        action_mask=[rng.random() > 0.2 or j == 0 for j in range(r)],
        reward=float(rng.random() > 0.5) + reward_offset,
    )


def random_rollouts(n: int, *, seed: int = 0, vocab: int = 272, groups: int = 2) -> list[common_pb2.Experience]:
    """Rollouts of varied prompt/response lengths with sampler log-probs, partial action masks and rewards."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = rng.randint(2, 9)
        r = rng.randint(1, 12)
        prompt = [rng.randrange(3, vocab) for _ in range(p)]
        out.append(
            _rollout(rng, id=f"r{seed}-{i}", group_id=f"g{i % groups}", prompt=prompt, r=r, vocab=vocab,
                     reward_offset=0.1 * i)
        )  # fmt: skip
    return out


def grouped_rollouts(groups: int, per_group: int, *, seed: int = 0, vocab: int = 272) -> list[common_pb2.Experience]:
    """GRPO-shaped rollouts: `per_group` responses of varied length to each of `groups` prompts."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))]
        for k in range(per_group):
            r = rng.randint(1, 12)
            out.append(_rollout(rng, id=f"g{seed}-{g}-{k}", group_id=f"g{g}", prompt=prompt, r=r, vocab=vocab))
    return out


PAIRS = [("Is fire hot?", "yes", "no"), ("Is ice hot?", "no", "yes"), ("Color of grass?", "green", "red")]


def preference_pairs(suffix: str = "") -> list[common_pb2.Experience]:
    """Three chosen/rejected pairs of short chat answers (ids end with `suffix`)."""
    return [
        common_pb2.Experience(
            id=f"dpo{i}{suffix}",
            kind=common_pb2.EXPERIENCE_KIND_PREFERENCE,
            messages=[common_pb2.ChatMessage(role="user", content=q)],
            response_text=good,
            preference=common_pb2.Preference(rejected_text=bad),
        )
        for i, (q, good, bad) in enumerate(PAIRS)
    ]


def assert_logprobs_of_single_rows(model: Any, experiences: list[common_pb2.Experience], logprobs: Any) -> None:
    """`logprobs[i]` equals what `model` gives experience i's response in a row of its own (full forward)."""
    import torch

    from trinity.trainer.logprobs import naive_logprobs

    for row, exp in enumerate(experiences):
        ids = torch.tensor([list(exp.prompt_token_ids) + list(exp.response_token_ids)])
        logits = model(ids).logits[0, len(exp.prompt_token_ids) - 1 : -1]
        ref, _ = naive_logprobs(logits, torch.tensor(list(exp.response_token_ids)))
        torch.testing.assert_close(logprobs[row, : len(ref)], ref, rtol=1e-5, atol=1e-5)
