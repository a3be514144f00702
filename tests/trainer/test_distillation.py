"""Distillation in the trainer: a frozen teacher scores every response token once per experience, and
on-policy distillation from a different tiny model lowers the student's KL to that teacher."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from trainer_helpers import random_rollouts, run_config

from trinity.config import RunConfig
from trinity.models.tiny import build_tiny_llama
from trinity.trainer import build_backend
from trinity.trainer.models import causal_lm, load_causal_lm
from trinity.trainer.torch_backend import TorchBackend
from trinity.v1 import common_pb2

VOCAB = 272
PROMPTS = [[5 + i, 40 + 3 * i, 90 + i] for i in range(8)]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another random tiny Llama (another seed) with the student's vocabulary."""
    return build_tiny_llama(tmp_path_factory.mktemp("teacher") / "model", vocab_size=VOCAB, seed=1)


def distill_config(student: Path, teacher: Path, algorithm: str = "on_policy_distill", **trainer: object) -> RunConfig:
    fields = {"teacher_model": str(teacher)}
    return run_config(student, algorithm, optimizer={"lr": 3e-3}, algorithm_fields=fields, **trainer)


def on_policy_rollouts(backend: TorchBackend, step: int, per_prompt: int = 64, length: int = 1) -> list:
    """Responses sampled from the student as it is now (no sampler log-probs: the trainer recomputes them).

    One-token responses, many per prompt: the distillation advantage has no baseline, so on a near-uniform
    tiny student its gradient is mostly sampling noise unless a step sees many samples of the same state."""
    lm = causal_lm(backend.policy)
    generator = torch.Generator().manual_seed(step)
    out = []
    with torch.no_grad():
        for g, prompt in enumerate(PROMPTS):
            ids = torch.tensor([prompt] * per_prompt)
            for _ in range(length):
                probs = lm(ids).logits[:, -1].float().softmax(-1)
                ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], dim=1)
            for k in range(per_prompt):
                out.append(
                    common_pb2.Experience(
                        id=f"s{step}-{g}-{k}",
                        kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
                        group_id=f"s{step}-{g}",
                        prompt_token_ids=prompt,
                        response_token_ids=ids[k, len(prompt) :].tolist(),
                    )
                )
    return out


def exact_kl(student: torch.nn.Module, teacher: torch.nn.Module, contexts: torch.Tensor) -> float:
    """KL(student || teacher) of the next-token distributions, summed over the vocabulary, averaged over
    every position of `contexts` `[n, seq]`."""
    with torch.no_grad():
        log_s = F.log_softmax(student(contexts).logits.float(), -1)
        log_t = F.log_softmax(teacher(contexts).logits.float(), -1)
    return float((log_s.exp() * (log_s - log_t)).sum(-1).mean())


def test_on_policy_distillation_lowers_the_kl_to_the_teacher(tiny_model, teacher):
    backend = build_backend(distill_config(tiny_model, teacher))
    assert isinstance(backend, TorchBackend)
    frozen_teacher = load_causal_lm(teacher).eval()
    contexts = torch.tensor(PROMPTS)  # every prefix of the prompts, the last one the state distilled on
    student = causal_lm(backend.policy)
    before = exact_kl(student, frozen_teacher, contexts)
    sampled = [backend.train_step(on_policy_rollouts(backend, step))["teacher_kl"] for step in range(8)]
    after = exact_kl(student, frozen_teacher, contexts)
    print(f"distillation KL(student || teacher): before {before:.4f}, after {after:.4f}; sampled {sampled}")
    assert after < 0.85 * before, (before, after)


def test_teacher_logprobs_are_the_teachers_own_and_those_given_are_kept(tiny_model, teacher):
    """The pass scores each response token under the teacher; an experience that brings them is not re-scored."""
    backend = build_backend(distill_config(tiny_model, teacher))
    assert isinstance(backend, TorchBackend)
    rollouts = random_rollouts(4, seed=3, vocab=VOCAB)
    samples = [s.chosen for s in backend_samples(backend, rollouts)]
    scored = backend.forward_rows(samples, "teacher")
    frozen_teacher = load_causal_lm(teacher).eval()
    for row, exp in enumerate(rollouts):
        ids = torch.tensor([list(exp.prompt_token_ids) + list(exp.response_token_ids)])
        with torch.no_grad():
            logp = F.log_softmax(frozen_teacher(ids).logits[0, len(exp.prompt_token_ids) - 1 : -1].float(), -1)
        expected = logp.gather(-1, torch.tensor(list(exp.response_token_ids)).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(scored[row, : len(expected)], expected, rtol=1e-5, atol=1e-5)
    # Given teacher log-probs equal to the sampler's: the advantage, and so the measured KL, is zero.
    for exp in rollouts:
        exp.teacher_logprobs.extend(exp.logprobs)
    metrics = backend.train_step(rollouts)
    assert metrics["teacher_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["advantage/mean"] == pytest.approx(0.0, abs=1e-7)


def backend_samples(backend: TorchBackend, experiences: list) -> list:
    from trinity.trainer.batch import to_samples

    return to_samples(experiences, backend.tokenizer, max_seq_len=backend.max_seq_len)


def test_jsd_trains_against_the_teacher(tiny_model, teacher):
    backend = build_backend(distill_config(tiny_model, teacher, "jsd"))
    assert isinstance(backend, TorchBackend)
    metrics = backend.train_step(on_policy_rollouts(backend, 0))
    assert metrics["teacher_kl"] > 0
    assert metrics["advantage/mean"] < 0  # -JSD per token: never positive, zero only where the two agree
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))


def test_a_teacher_preset_without_a_teacher_or_with_another_vocabulary_is_refused(tiny_model, tmp_path):
    with pytest.raises(ValueError, match=r"algorithm\.teacher_model\n.*'on_policy_distill' distills from a teacher"):
        run_config(tiny_model, "on_policy_distill")
    other = build_tiny_llama(tmp_path / "other", vocab_size=300, seed=2)
    with pytest.raises(ValueError, match="vocabulary of 300 tokens"):
        build_backend(distill_config(tiny_model, other))
    with pytest.raises(ValueError, match="not a model directory"):
        build_backend(distill_config(tiny_model, tmp_path / "missing"))


def test_a_relative_teacher_directory_is_relative_to_the_config_file(tmp_path, teacher):
    from trinity.config import load_run_config

    (tmp_path / "run.yaml").write_text(
        f"mode: train\nmodel: {{path: {teacher}}}\nalgorithm: {{algorithm_type: on_policy_distill, "
        f"teacher_model: {teacher.name}}}\nbuffer: {{offline_data: {{path: d.jsonl}}}}\n"
    )
    (tmp_path / teacher.name).mkdir()
    assert load_run_config(tmp_path / "run.yaml").algorithm.teacher_model == str(tmp_path / teacher.name)
