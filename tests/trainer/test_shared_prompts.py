"""Shared-prompt rows: samples with the same prompt share one row under a block mask.

The layout must be exact: the same log-probs, the same values and the same update as one row per sample.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import assert_logprobs_of_single_rows, grouped_rollouts, random_rollouts, run_config
from transformers import AutoModelForCausalLM

from trinity.trainer import build_backend
from trinity.trainer.batch import collate, plan_micro_batches, to_samples
from trinity.trainer.logprobs import chunked_logprobs
from trinity.trainer.models import response_hidden
from trinity.v1 import common_pb2


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_prompt_rows_give_each_sequence_its_own_logprobs(tiny_model: Path, attention: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attention).eval()
    exps = grouped_rollouts(3, 4, seed=1)
    seqs = [s.chosen for s in to_samples(exps, None)]
    batch = collate(seqs, pad_id=2, pack_budget=40)
    assert batch.input_ids.shape[0] < len(exps)  # rows were shared
    assert batch.attention_mask.dim() == 4 and batch.response_row is not None
    with torch.no_grad():
        hidden, head = response_hidden(model, batch)
        lp, _ = chunked_logprobs(head, hidden, batch.targets, chunk_size=4)
        assert_logprobs_of_single_rows(model, exps, lp)


def test_rows_respect_the_budget_and_split_a_group_that_does_not_fit() -> None:
    seqs = [s.chosen for s in to_samples(grouped_rollouts(2, 6, seed=2), None)]
    budget = 30
    batch = collate(seqs, pad_id=2, pack_budget=budget)
    segments_per_row = torch.bincount(batch.response_row)
    assert batch.input_ids.shape[1] <= max(budget, max(s.length for s in seqs))
    assert batch.input_ids.shape[0] > 2 and int(segments_per_row.max()) > 1


def test_without_shared_prompts_the_plain_layout_is_kept() -> None:
    seqs = [s.chosen for s in to_samples(random_rollouts(6, seed=3), None)]  # every prompt differs
    batch = collate(seqs, pad_id=2, pack_budget=1000)
    assert batch.attention_mask.dim() == 2 and batch.response_row is None


def test_shared_prompt_plan_keeps_groups_together_and_covers_every_sample_once() -> None:
    samples = to_samples(grouped_rollouts(5, 4, seed=4), None)
    plan = plan_micro_batches(samples, token_budget=120, share_prompts=True)
    assert sorted(i for mb in plan for i in mb) == list(range(20))
    for mb in plan:
        groups = {samples[i].group for i in mb}
        assert all(sum(samples[i].group == g for i in mb) == 4 for g in groups)  # a 4-sample group fits 120
        batch = collate([samples[i].chosen for i in mb], pad_id=2, pack_budget=120)
        assert batch.input_ids.numel() <= 120 or batch.input_ids.shape[0] == 1


def _backend(tiny_model: Path, share: bool, algorithm: str = "grpo"):
    return build_backend(run_config(tiny_model, algorithm, share_prompts=share, micro_batch_tokens=64))


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_train_step_with_shared_prompts_equals_one_row_per_sample(tiny_model: Path, algorithm: str) -> None:
    exps = grouped_rollouts(3, 5, seed=5)
    plain, shared = _backend(tiny_model, False, algorithm), _backend(tiny_model, True, algorithm)
    before = {name: w.detach().clone() for name, w in plain.named_weights()}
    m_plain, m_shared = plain.train_step(exps), shared.train_step(exps)
    for key in ("loss/total", "grad_norm", "entropy"):
        assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-4, abs=1e-6), key
    if algorithm == "ppo":
        assert m_shared["value/mean"] == pytest.approx(m_plain["value/mean"], rel=1e-4, abs=1e-6)
    after_plain = dict(plain.named_weights())
    for name, weight in shared.named_weights():
        torch.testing.assert_close(weight, after_plain[name], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(before[n], after_plain[n]) for n in before)  # the updates were compared, not no-ops


def test_dpo_pairs_share_their_prompt_row(tiny_model: Path) -> None:
    pairs = [
        common_pb2.Experience(
            id=f"p{i}",
            kind=common_pb2.EXPERIENCE_KIND_PREFERENCE,
            prompt_token_ids=[5 + i, 6, 7],
            response_token_ids=[8, 9 + i],
            preference=common_pb2.Preference(rejected_token_ids=[10, 11, 12 + i]),
        )
        for i in range(4)
    ]
    plain, shared = _backend(tiny_model, False, "dpo"), _backend(tiny_model, True, "dpo")
    m_plain, m_shared = plain.train_step(pairs), shared.train_step(pairs)
    assert m_shared["loss/total"] == pytest.approx(m_plain["loss/total"], rel=1e-4)
    assert m_shared["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=1e-4)
