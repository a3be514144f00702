"""The vLLM engine on CPU: log-probs match Hugging Face, weight loads take effect and are exact."""

from __future__ import annotations

import threading

import pytest
import torch
from explorer_helpers import hf_logprobs
from safetensors.torch import load_file

from trinity.explorer.engines import GenerationRequest, SamplingSettings

# fp32 on both sides; measured max |diff| here is ~1e-6, 1e-4 was measured for SmolLM2.
LOGPROB_TOL = 1e-4
GREEDY = SamplingSettings(temperature=0.0, max_tokens=12)


PROMPTS = ("The lake is", "abc", "hello world")


def greedy(engine) -> list[list[int]]:
    """Greedy continuations of a few prompts (random tiny models often repeat one token per prompt)."""
    results = engine.generate([GenerationRequest(prompt=p, sampling=GREEDY) for p in PROMPTS])
    return [r.samples[0].token_ids for r in results]


def test_sampled_logprobs_match_huggingface_recomputation(vllm_engine, hf_model):
    request = GenerationRequest(prompt="Once upon a time", n=3, sampling=SamplingSettings(max_tokens=12))
    result = vllm_engine.generate([request])[0]
    assert len(result.samples) == 3
    for sample in result.samples:
        assert len(sample.logprobs) == len(sample.token_ids) > 0
        expected = hf_logprobs(hf_model, result.prompt_token_ids, sample.token_ids)
        assert sample.logprobs == pytest.approx(expected, abs=LOGPROB_TOL)


def test_logprobs_are_of_the_tempered_distribution_that_was_sampled(vllm_engine, hf_model):
    request = GenerationRequest(prompt="abc", sampling=SamplingSettings(temperature=0.7, max_tokens=10))
    result = vllm_engine.generate([request])[0]
    sample = result.samples[0]
    tempered = hf_logprobs(hf_model, result.prompt_token_ids, sample.token_ids, temperature=0.7)
    untempered = hf_logprobs(hf_model, result.prompt_token_ids, sample.token_ids)
    assert sample.logprobs == pytest.approx(tempered, abs=LOGPROB_TOL)
    assert sample.logprobs != pytest.approx(untempered, abs=LOGPROB_TOL)


def test_chat_messages_use_the_tokenizer_chat_template(vllm_engine, tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    result = vllm_engine.generate([GenerationRequest(messages=messages, sampling=GREEDY)])[0]
    assert result.prompt_text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert result.prompt_token_ids == tokenizer.encode(result.prompt_text, add_special_tokens=False)


def test_max_tokens_ends_with_finish_reason_length(vllm_engine):
    sample = vllm_engine.generate([GenerationRequest(prompt="x", sampling=GREEDY)])[0].samples[0]
    assert len(sample.token_ids) == 12
    assert sample.finish_reason == "length"


def test_stop_string_cuts_the_text_and_reports_stop(vllm_engine, tokenizer):
    tokens = greedy(vllm_engine)[0]
    text = tokenizer.decode(tokens)
    stop = text[3:5]  # a string the greedy continuation is known to produce
    settings = SamplingSettings(temperature=0.0, max_tokens=12, stop=(stop,))
    sample = vllm_engine.generate([GenerationRequest(prompt="The lake is", sampling=settings)])[0].samples[0]
    assert sample.finish_reason == "stop"
    assert sample.text == text[: text.find(stop)]


def test_load_weights_changes_output_and_restoring_is_exact(vllm_engine, tiny_model_dir, other_model_dir):
    from transformers import AutoModelForCausalLM

    original = greedy(vllm_engine)
    start = vllm_engine.model_version
    other = load_file(str(other_model_dir / "model.safetensors"))
    try:
        vllm_engine.load_weights(start + 1, other.items())
        assert vllm_engine.model_version == start + 1
        changed = vllm_engine.generate([GenerationRequest(prompt=p, sampling=GREEDY) for p in PROMPTS])
        assert {r.model_version for r in changed} == {start + 1}
        assert [r.samples[0].token_ids for r in changed] != original
        # The new weights are really in use, tied lm_head included: HF on the same weights agrees.
        hf_other = AutoModelForCausalLM.from_pretrained(other_model_dir, dtype=torch.float32).eval()
        for r in changed:
            expected = hf_logprobs(hf_other, r.prompt_token_ids, r.samples[0].token_ids)
            assert r.samples[0].logprobs == pytest.approx(expected, abs=LOGPROB_TOL)
    finally:
        vllm_engine.load_weights_from_dir(start + 2, tiny_model_dir)
    assert vllm_engine.model_version == start + 2
    assert greedy(vllm_engine) == original


def test_partial_layer_update_is_refused(vllm_engine, other_model_dir):
    other = load_file(str(other_model_dir / "model.safetensors"))
    only_q = [(n, t) for n, t in other.items() if n == "model.layers.1.self_attn.q_proj.weight"]
    before = vllm_engine.model_version
    with pytest.raises(ValueError, match="partial weight update"):
        vllm_engine.load_weights(before + 1, only_q)
    assert vllm_engine.model_version == before
    assert vllm_engine.torn is None  # refused before any layer was loaded: it serves what it served


def test_weight_versions_never_go_back(vllm_engine):
    with pytest.raises(ValueError, match="older than the served version"):
        vllm_engine.load_weights(vllm_engine.model_version - 1, [])


def test_a_generate_call_sees_one_weight_version(vllm_engine, tiny_model_dir, other_model_dir):
    """Whichever order the lock gives, the tokens are exactly those of the version reported."""
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    other = load_file(str(other_model_dir / "model.safetensors"))
    v = vllm_engine.model_version
    expected = {v: greedy(vllm_engine)}
    vllm_engine.load_weights(v + 1, other.items())
    expected[v + 1] = greedy(vllm_engine)
    vllm_engine.load_weights(v + 2, original.items())
    expected[v + 2] = expected[v]

    results = []
    worker = threading.Thread(
        target=lambda: results.extend(
            vllm_engine.generate([GenerationRequest(prompt=p, sampling=GREEDY) for p in PROMPTS])
        )
    )
    worker.start()
    vllm_engine.load_weights(v + 3, other.items())
    worker.join()
    expected[v + 3] = expected[v + 1]
    vllm_engine.load_weights(v + 4, original.items())
    versions = {r.model_version for r in results}
    assert versions in ({v + 2}, {v + 3})
    assert [r.samples[0].token_ids for r in results] == expected[versions.pop()]


# ---- continuous batching --------------------------------------------------------------------------------

LONG = SamplingSettings(temperature=1.0, max_tokens=48)


def test_calls_from_many_threads_run_in_one_batch(vllm_engine):
    """While one call decodes, calls from other threads join the engine's batch instead of queueing behind it."""
    barrier = threading.Barrier(8)
    results: dict[int, list] = {}

    def call(i: int) -> None:
        barrier.wait()
        results[i] = vllm_engine.generate([GenerationRequest(prompt=PROMPTS[i % 3], n=2, sampling=LONG)])

    peak = 0
    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, vllm_engine.calls_in_flight)
    for t in threads:
        t.join()
    assert peak > 1
    assert sorted(results) == list(range(8))
    for (result,) in results.values():
        assert len(result.samples) == 2
        for sample in result.samples:
            assert sample.token_ids and len(sample.logprobs) == len(sample.token_ids)


def test_a_stream_delivers_the_tokens_of_the_whole_result(vllm_engine):
    stream = vllm_engine.stream(GenerationRequest(prompt="The lake is", n=2, sampling=LONG))
    deltas = list(stream)
    result = stream.result()
    assert len(deltas) > 4  # token by token, not one block per sample
    for index, sample in enumerate(result.samples):
        assert sample.token_ids == [t for d in deltas if d.index == index for t in d.token_ids]
        assert sample.logprobs == [lp for d in deltas if d.index == index for lp in d.logprobs]
        assert sample.finish_reason in ("stop", "length")
    greedy_stream = vllm_engine.stream(GenerationRequest(prompt=PROMPTS[0], sampling=GREEDY))
    assert [t for d in greedy_stream for t in d.token_ids] == greedy(vllm_engine)[0]


def test_a_call_past_its_deadline_times_out_and_leaves_the_engine_free(vllm_engine):
    from trinity.explorer.engines import GenerationTimeout, deadline

    with deadline(0.0), pytest.raises(GenerationTimeout):
        vllm_engine.generate([GenerationRequest(prompt="abc", sampling=LONG)])
    assert vllm_engine.calls_in_flight == 0
    assert greedy(vllm_engine)  # the engine still serves


def test_the_engine_loop_aborts_a_request_once_its_deadline_passes(vllm_engine):
    """The loop, not only the caller, enforces the limit: the engine stops spending steps on the request."""
    import time

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from trinity.explorer.engines import GenerationTimeout

    ended = threading.Event()
    _, deltas = vllm_engine._loop.submit(
        TokensPrompt(prompt_token_ids=[1, 2, 3]),
        SamplingParams(max_tokens=40),
        deadline=time.monotonic(),
        on_end=ended.set,
    )
    with pytest.raises(GenerationTimeout):
        list(deltas)
    assert ended.is_set()
    assert not vllm_engine._llm.llm_engine.has_unfinished_requests()


def test_a_weight_load_waits_for_streams_in_flight_and_holds_new_calls(vllm_engine, tiny_model_dir):
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    v = vllm_engine.model_version
    stream = vllm_engine.stream(GenerationRequest(prompt="abc", sampling=LONG))
    loader = threading.Thread(target=vllm_engine.load_weights, args=(v + 1, original.items()))
    loader.start()
    tokens = [t for d in stream for t in d.token_ids]  # the load waits: this stream is not dropped
    loader.join()
    assert stream.model_version == v
    assert stream.result().samples[0].token_ids == tokens
    (after,) = vllm_engine.generate([GenerationRequest(prompt="abc", sampling=GREEDY)])
    assert after.model_version == v + 1


def test_a_closed_stream_is_aborted(vllm_engine):
    slow = SamplingSettings(temperature=1.0, max_tokens=4000)
    stream = vllm_engine.stream(GenerationRequest(prompt="abc", sampling=slow))
    first = next(iter(stream))
    stream.close()
    rest = list(stream)  # ends promptly instead of running to 4000 tokens
    assert sum(len(d.token_ids) for d in [first, *rest]) < 4000
    assert vllm_engine.calls_in_flight == 0


def test_the_kv_cache_holds_the_fraction_of_a_gib_and_the_block_size_asked_for(vllm_engine, tiny_model_dir):
    import json

    vllm_config = vllm_engine._llm.llm_engine.vllm_config
    cache = vllm_config.cache_config
    assert cache.kv_cache_memory_bytes == 2**28
    assert cache.block_size == 32 and cache.enable_prefix_caching  # vLLM's CPU default would be 128
    model = json.loads((tiny_model_dir / "config.json").read_text())
    head_dim = model.get("head_dim") or model["hidden_size"] // model["num_attention_heads"]
    per_token = 2 * model["num_hidden_layers"] * model["num_key_value_heads"] * head_dim * 4  # K and V, fp32
    slots = cache.num_gpu_blocks * cache.block_size
    assert 0.9 * 2**28 <= slots * per_token <= 2**28  # the whole budget, and no more
