"""mix_chord end to end in the trainer: demonstrations (SFT kind) in an RL batch are its expert rows."""

from __future__ import annotations

from trainer_helpers import random_rollouts, run_config

from trinity.trainer import build_backend
from trinity.v1 import common_pb2


def _demonstrations(n: int) -> list[common_pb2.Experience]:
    return [
        common_pb2.Experience(
            id=f"demo-{i}",
            kind=common_pb2.EXPERIENCE_KIND_SFT,
            prompt_token_ids=[5, 6, 7],
            response_token_ids=[8 + i, 9, 10, 11],
            action_mask=[True] * 4,
        )
        for i in range(n)
    ]


def test_expert_rows_get_the_sft_term_and_rollouts_the_rl_term(tiny_model):
    backend = build_backend(run_config(tiny_model, "mix_chord"))
    mixed = backend.train_step(random_rollouts(6, seed=1) + _demonstrations(2))
    assert any(k.startswith("expert/") for k in mixed), sorted(mixed)
    assert any(k.startswith("usual/") for k in mixed)
    rollouts_only = backend.train_step(random_rollouts(6, seed=2))
    assert not any(k.startswith("expert/") for k in rollouts_only)
