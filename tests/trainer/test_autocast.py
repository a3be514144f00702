"""bf16 autocast: the same training step, matmuls in bf16, weights and log-softmax in fp32."""

from __future__ import annotations

import torch
from trainer_helpers import random_rollouts, run_config

from trinity.trainer import build_backend
from trinity.trainer.batch import collate, to_samples


def _backend(tiny_model, autocast: str):
    return build_backend(run_config(tiny_model, "grpo", autocast=autocast))


def test_bf16_log_probs_stay_close_to_fp32_and_weights_stay_fp32(tiny_model):
    fp32, bf16 = _backend(tiny_model, "none"), _backend(tiny_model, "bfloat16")
    samples = to_samples(random_rollouts(4, seed=7), fp32.tokenizer)
    batch = collate([s.chosen for s in samples], fp32.pad_id)
    with torch.no_grad():
        exact, _ = fp32.logprobs(batch)
        mixed, _ = bf16.logprobs(batch)
    assert mixed.dtype == torch.float32
    diff = (exact - mixed).abs()[batch.mask]
    # bf16 keeps 8 bits of mantissa: log-probs move by a few hundredths, never by whole nats
    assert 0 < float(diff.mean()) < 0.05 and float(diff.max()) < 0.3
    assert all(p.dtype == torch.float32 for p in bf16.policy.parameters())


def test_a_bf16_step_trains(tiny_model):
    backend = _backend(tiny_model, "bfloat16")
    before = {n: p.detach().clone() for n, p in backend.named_weights()}
    metrics = backend.train_step(random_rollouts(8, seed=9))
    assert torch.isfinite(torch.tensor(metrics["loss/total"])) and metrics["grad_norm"] > 0
    after = dict(backend.named_weights())
    assert any(not torch.equal(before[n], after[n]) for n in before)
