"""GRPO learns a bandit: the tiny model picks one of four answer tokens and only one is rewarded."""

from __future__ import annotations

from pathlib import Path

import torch
from trainer_helpers import grpo_parts, run_config

from trinity.trainer.torch_backend import TorchBackend
from trinity.v1 import common_pb2

CHOICES = "ABCD"
REWARDED = "C"
GROUP = 8


def _answer_logprobs(backend: TorchBackend, prompt: list[int], choice_ids: list[int]) -> torch.Tensor:
    """Full-vocabulary log-probs `[4]` of the four answer tokens after the prompt."""
    with torch.no_grad():
        logits = backend.policy(torch.tensor([prompt])).logits[0, -1].float()
    return torch.log_softmax(logits, -1)[choice_ids]


def test_grpo_raises_the_probability_of_the_rewarded_answer(tiny_model: Path) -> None:
    config = run_config(tiny_model, optimizer={"lr": 3e-3, "weight_decay": 0.0})
    backend = TorchBackend(config, algorithm=grpo_parts())
    tok = backend.hf_tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Pick one"}], add_generation_prompt=True, tokenize=False
    )
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    choice_ids = [tok.convert_tokens_to_ids(c) for c in CHOICES]
    rewarded = choice_ids[CHOICES.index(REWARDED)]
    gen = torch.Generator().manual_seed(0)

    start = _answer_logprobs(backend, prompt, choice_ids).exp()
    for step in range(12):
        logp = _answer_logprobs(backend, prompt, choice_ids)
        # Constrained decoding over the four answers (as a multiple-choice guided decode would do); the
        # recorded log-prob is the model's full-vocabulary one, which the trainer recomputes identically.
        picks = torch.multinomial(logp.exp() / logp.exp().sum(), GROUP, replacement=True, generator=gen)
        exps = [
            common_pb2.Experience(
                id=f"s{step}-{i}",
                kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
                group_id=f"step{step}",
                model_version=backend.model_version,
                prompt_token_ids=prompt,
                response_token_ids=[choice_ids[k]],
                logprobs=[float(logp[k])],
                reward=1.0 if choice_ids[k] == rewarded else 0.0,
            )
            for i, k in enumerate(picks.tolist())
        ]
        metrics = backend.train_step(exps)
        assert metrics["staleness/max"] == 0.0
    end = _answer_logprobs(backend, prompt, choice_ids).exp()

    i = CHOICES.index(REWARDED)
    share_start, share_end = start[i] / start.sum(), end[i] / end.sum()
    assert 0.15 < share_start < 0.35  # a fair start: the random model has no preference among the four
    print(f"rewarded share {share_start:.3f} -> {share_end:.3f}, p {start[i]:.4f} -> {end[i]:.4f}")
    assert share_end > 0.8, (share_start, share_end)
    assert end[i] > 3 * start[i]
