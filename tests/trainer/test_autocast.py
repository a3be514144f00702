"""bf16 autocast: the same training step, matmuls in bf16, weights and log-softmax in fp32 (attention too, on a CPU)."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import grouped_rollouts, random_rollouts, run_config

from trinity.trainer import build_backend
from trinity.trainer.attention import SDPA_FP32, sdpa_fp32_attention, use_fp32_attention
from trinity.trainer.batch import collate, to_samples
from trinity.trainer.models import load_causal_lm


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


def _plain_bf16(tiny_model):
    """The bf16 path as it was: autocast sends SDPA itself to bf16."""
    backend = _backend(tiny_model, "bfloat16")
    backend.policy.set_attn_implementation("sdpa")
    return backend


def _logprobs_and_grads(backend, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the batch's response tokens, and the gradient of their sum, flattened."""
    backend.policy.zero_grad(set_to_none=True)
    logprobs, _ = backend.logprobs(batch)
    logprobs[batch.mask].sum().backward()
    grads = torch.cat([p.grad.flatten() for p in backend.policy.parameters() if p.grad is not None])
    return logprobs.detach(), grads


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _attention_grads(attention, inputs, mask, module, autocast: bool) -> list[torch.Tensor]:
    """The output of `attention` on `inputs` (q, k, v) and the gradients of a fixed loss on it."""
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, _ = attention(module, *leaves, mask, dropout=0.0, scaling=module.scaling)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out.float() * weights).sum().backward()
    return [out.detach().float()] + [t.grad for t in leaves]


def test_fp32_attention_is_fp32_sdpa_under_autocast_with_a_shared_prompt_mask(tiny_model):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    backend = _backend(tiny_model, "bfloat16")
    batch = collate([s.chosen for s in to_samples(grouped_rollouts(3, 4, seed=11), None)], 0, backend.pack_budget)
    mask = batch.attention_mask
    assert mask.dim() == 4 and mask.dtype == torch.bool  # the shared-prompt block mask
    module = backend.policy.model.layers[0].self_attn
    rows, seq = batch.input_ids.shape
    heads, kv_heads = backend.policy.config.num_attention_heads, backend.policy.config.num_key_value_heads
    g = torch.Generator().manual_seed(0)
    # q and k come out of RoPE in fp32 under autocast, v out of a bf16 linear
    inputs = [torch.randn(rows, n, seq, module.head_dim, generator=g) for n in (heads, kv_heads, kv_heads)]
    inputs[2] = inputs[2].bfloat16()
    mine = _attention_grads(sdpa_fp32_attention, inputs, mask, module, autocast=True)
    exact = _attention_grads(sdpa_attention_forward, [t.float() for t in inputs], mask, module, autocast=False)
    bf16 = _attention_grads(sdpa_attention_forward, inputs, mask, module, autocast=True)
    for a, b, c in zip(mine, exact, bf16, strict=True):
        # fp32 SDPA's result, up to one rounding to the dtype of the input it is the gradient of (v: bf16)
        ulp = 1e-5 if a.dtype == torch.float32 else 2.0**-7
        assert torch.allclose(a.float(), b, atol=1e-5, rtol=ulp)
        assert not torch.equal(a.float(), c.float()) and torch.allclose(a.float(), c.float(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("shared_prompts", [True, False], ids=["shared-prompt rows", "one row per sequence"])
def test_fp32_attention_keeps_log_probs_and_gradients_within_bf16_tolerance(tiny_model, shared_prompts):
    fp32, plain, mixed = _backend(tiny_model, "none"), _plain_bf16(tiny_model), _backend(tiny_model, "bfloat16")
    samples = to_samples(grouped_rollouts(3, 4, seed=11), fp32.tokenizer)
    batch = collate([s.chosen for s in samples], fp32.pad_id, fp32.pack_budget if shared_prompts else None)
    assert batch.attention_mask.dim() == (4 if shared_prompts else 2)
    mine, mine_grad = _logprobs_and_grads(mixed, batch)
    assert not torch.equal(mine, _logprobs_and_grads(plain, batch)[0])  # the attention really ran another kernel
    # the bf16 matmuls, not the attention, set the error against fp32: both bf16 paths are equally close to it
    for logprobs, grad in (_logprobs_and_grads(plain, batch), _logprobs_and_grads(fp32, batch)):
        assert float((mine - logprobs).abs()[batch.mask].max()) < 0.02 and _rel(mine_grad, grad) < 0.02


def test_the_trainer_picks_fp32_attention_only_under_bf16_autocast_on_a_cpu(tiny_model):
    mixed = build_backend(run_config(tiny_model, "grpo", kl_coef=0.1, autocast="bfloat16"))
    assert mixed.policy.config._attn_implementation == SDPA_FP32
    assert mixed.reference is not None  # its frozen copy computes the KL's log-probs: the same attention
    with mixed.reference.active() as ref:
        assert ref.lm.config._attn_implementation == SDPA_FP32
    assert _backend(tiny_model, "none").policy.config._attn_implementation == "sdpa"


def test_fp32_attention_leaves_gpus_and_other_implementations_alone(tiny_model):
    model = load_causal_lm(tiny_model)
    assert not use_fp32_attention(model, autocast=True, device=torch.device("cuda"))
    assert not use_fp32_attention(model, autocast=False, device=torch.device("cpu"))
    model.set_attn_implementation("eager")
    assert not use_fp32_attention(model, autocast=True, device=torch.device("cpu"))
    assert model.config._attn_implementation == "eager"
