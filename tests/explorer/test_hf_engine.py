"""The transformers fallback engine keeps the same contract as vLLM."""

from __future__ import annotations

import pytest
from explorer_helpers import hf_logprobs

from trinity.explorer.engines import GenerationRequest, SamplingSettings


def test_sampled_logprobs_match_recomputation(hf_engine, hf_model):
    request = GenerationRequest(prompt="Once", n=2, sampling=SamplingSettings(temperature=0.8, max_tokens=8))
    result = hf_engine.generate([request])[0]
    for sample in result.samples:
        expected = hf_logprobs(hf_model, result.prompt_token_ids, sample.token_ids, temperature=0.8)
        assert sample.logprobs == pytest.approx(expected, abs=1e-4)


def test_greedy_output_matches_vllm(hf_engine, vllm_engine):
    greedy = SamplingSettings(temperature=0.0, max_tokens=10)
    requests = [GenerationRequest(messages=[{"role": "user", "content": "hi"}], sampling=greedy)]
    ours, theirs = hf_engine.generate(requests)[0], vllm_engine.generate(requests)[0]
    assert ours.prompt_token_ids == theirs.prompt_token_ids
    assert ours.samples[0].token_ids == theirs.samples[0].token_ids
    assert ours.samples[0].logprobs == pytest.approx(theirs.samples[0].logprobs, abs=1e-4)


def test_load_weights_from_dir_switches_models_and_back(hf_engine, tiny_model_dir, other_model_dir):
    greedy = GenerationRequest(prompt="abc", sampling=SamplingSettings(temperature=0.0, max_tokens=8))
    before = hf_engine.generate([greedy])[0].samples[0].token_ids
    v = hf_engine.model_version
    hf_engine.load_weights_from_dir(v + 1, other_model_dir)
    assert hf_engine.generate([greedy])[0].samples[0].token_ids != before
    hf_engine.load_weights_from_dir(v + 2, tiny_model_dir)
    assert hf_engine.generate([greedy])[0].samples[0].token_ids == before
    assert hf_engine.model_version == v + 2


def test_unknown_weight_names_are_refused(hf_engine):
    import torch

    with pytest.raises(ValueError, match="not in the model"):
        hf_engine.load_weights(hf_engine.model_version, [("model.bogus.weight", torch.zeros(1))])
    assert hf_engine.torn is None  # refused before anything was copied: it serves what it served
