"""Accumulating micro-batch gradients reproduces the gradient of the whole batch in one pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import grpo_parts, random_rollouts, run_config

from trinity.trainer.algorithm import AlgorithmParts, build_algorithm
from trinity.trainer.batch import plan_micro_batches, to_samples
from trinity.trainer.torch_backend import TorchBackend
from trinity.v1 import common_pb2

FULL_BATCH = 10**9
SMALL = 24  # tokens per micro-batch: forces many micro-batches of 1-3 rows


def _grads(model: Path, parts: AlgorithmParts, exps: list, budget: int) -> dict[str, torch.Tensor]:
    backend = TorchBackend(run_config(model, micro_batch_tokens=budget, logprob_chunk_size=5), algorithm=parts)
    backend.compute_gradients(exps)
    return {n: p.grad.clone() for n, p in backend.policy.named_parameters() if p.grad is not None}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_grpo_micro_batch_gradients_sum_to_the_full_batch_gradient(tiny_model: Path, agg: str) -> None:
    exps = random_rollouts(12, seed=7)
    assert len(plan_micro_batches(to_samples(exps, None), SMALL)) >= 5
    parts = grpo_parts(loss_agg_mode=agg)
    _assert_same(_grads(tiny_model, parts, exps, SMALL), _grads(tiny_model, parts, exps, FULL_BATCH))


def test_grpo_with_kl_and_entropy_terms_accumulates_exactly(tiny_model: Path) -> None:
    exps = random_rollouts(10, seed=8)
    parts = grpo_parts(kl_coef=0.1, entropy_coef=0.01)
    _assert_same(_grads(tiny_model, parts, exps, SMALL), _grads(tiny_model, parts, exps, FULL_BATCH))


def test_sft_micro_batch_gradients_sum_to_the_full_batch_gradient(tiny_model: Path) -> None:
    exps = [
        common_pb2.Experience(
            id=f"s{i}",
            kind=common_pb2.EXPERIENCE_KIND_SFT,
            prompt_text="q" * (i + 1),
            response_text="a" * (2 * i + 1),
        )
        for i in range(6)
    ]
    parts = build_algorithm(run_config(tiny_model, "sft").algorithm)
    _assert_same(_grads(tiny_model, parts, exps, 40), _grads(tiny_model, parts, exps, FULL_BATCH))
