"""The Megatron backend (gloo, 2 processes) trains exactly as the PyTorch backend does.

One scenario per parallel layout, run once per module: score a batch, export, two GRPO steps (with KL
and entropy terms, several micro-batches, two mini-batches per step), checkpoint after step 1, resume
and replay step 2. The PyTorch backend runs the same steps on the same batches as the reference.

Tolerances (float32): log-probs 2e-5 absolute; loss and metrics 1e-5 relative; weights after 4 AdamW
updates at lr 1e-3: 5e-5 absolute (each update moves a weight by about 1e-3, so a wrong gradient shows
as ~1e-3). HF -> Megatron -> HF export before training and checkpoint resume are bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from megatron_helpers import grpo_config, random_rollouts
from safetensors.torch import load_file

from trinity.config import RunConfig
from trinity.trainer.batch import to_samples
from trinity.trainer.megatron import MegatronBackend
from trinity.trainer.torch_backend import TorchBackend

LAYOUTS = {"tp1": (1, 1), "tp2": (2, 1), "pp2": (1, 2)}
METRICS = (
    *("loss/total", "pg_loss", "kl", "entropy", "grad_norm", "advantage/mean", "reward/mean", "lr"),
    *("consistency/logprob_diff_mean", "consistency/logprob_diff_max", "consistency/k3_kl"),  # the probe, merged
)


def _config(model: Path, **trainer: object) -> RunConfig:
    """The same run for both backends; `trainer` adds the backend and its parallel layout."""
    return grpo_config(
        model,
        kl_coef=0.1,
        entropy_coef=0.01,
        seed=5,
        micro_batch_tokens=40,
        mini_batch_size=4,
        optimizer={"lr": 1e-3, "schedule": "warmup", "warmup_steps": 3},
        **trainer,
    )


BATCH_A = random_rollouts(8, seed=11)
BATCH_B = random_rollouts(8, seed=12)


@dataclass
class Outcome:
    scores: torch.Tensor
    initial: dict[str, torch.Tensor]
    metrics: list[dict[str, float]]
    weights: dict[str, torch.Tensor]
    resumed_metrics: dict[str, float] = field(default_factory=dict)
    resumed_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    hf_dir: Path | None = None


def _copy(weights: object) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in weights}  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> Outcome:
    backend = TorchBackend(_config(tiny_model))
    seqs = [q for s in to_samples(BATCH_A, None) for q in s.sequences]
    scores = backend.forward_rows(seqs, "policy")
    initial = _copy(backend.named_weights())
    metrics = [backend.train_step(BATCH_A), backend.train_step(BATCH_B)]
    return Outcome(scores, initial, metrics, _copy(backend.named_weights()))


@pytest.fixture(scope="module", params=list(LAYOUTS))
def megatron(request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    tp, pp = LAYOUTS[request.param]
    config = _config(tiny_model, backend="megatron", tensor_parallel_size=tp, pipeline_parallel_size=pp)
    with MegatronBackend(config) as backend:
        scores = backend.score(BATCH_A)
        initial = _copy(backend.named_weights())
        first = backend.train_step(BATCH_A)
        ckpt = backend.save_checkpoint(tmp_path_factory.mktemp("ckpt"))
        second = backend.train_step(BATCH_B)
        weights = _copy(backend.named_weights())
        backend.load_checkpoint(ckpt)
        assert backend.model_version == 1
        resumed = backend.train_step(BATCH_B)
        hf_dir = backend.save_hf(tmp_path_factory.mktemp("hf") / "policy")
        return Outcome(scores, initial, [first, second], weights, resumed, _copy(backend.named_weights()), hf_dir)


def test_log_probs_match_the_hugging_face_model(megatron: Outcome, reference: Outcome) -> None:
    torch.testing.assert_close(megatron.scores, reference.scores, rtol=0, atol=2e-5)


def test_exported_weights_before_training_equal_the_checkpoint_bit_for_bit(megatron: Outcome, tiny_model: Path) -> None:
    hf = load_file(str(tiny_model / "model.safetensors"))
    assert megatron.initial.keys() == hf.keys()
    assert all(torch.equal(megatron.initial[k], hf[k]) for k in hf)


@pytest.mark.parametrize("step", [0, 1])
def test_grpo_step_loss_and_metrics_match_the_torch_backend(megatron: Outcome, reference: Outcome, step: int) -> None:
    mine, ref = megatron.metrics[step], reference.metrics[step]
    assert mine["updates"] == ref["updates"] == 2
    for name in METRICS:
        assert mine[name] == pytest.approx(ref[name], rel=1e-5, abs=1e-7), name


def test_weights_after_training_match_the_torch_backend(megatron: Outcome, reference: Outcome) -> None:
    assert megatron.weights.keys() == reference.weights.keys()
    moved = max(float((reference.weights[k] - reference.initial[k]).abs().max()) for k in reference.weights)
    assert moved > 1e-3  # the comparison below is meaningful
    for name, tensor in reference.weights.items():
        torch.testing.assert_close(megatron.weights[name], tensor, rtol=0, atol=5e-5, msg=name)


def test_resume_from_a_checkpoint_replays_the_next_step_exactly(megatron: Outcome) -> None:
    second = {k: v for k, v in megatron.metrics[1].items() if "second" not in k and "per_s" not in k}
    assert {k: megatron.resumed_metrics[k] for k in second} == second
    assert all(torch.equal(megatron.resumed_weights[k], v) for k, v in megatron.weights.items())


def test_save_hf_writes_a_loadable_model_with_the_trained_weights(megatron: Outcome) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert megatron.hf_dir is not None
    model = AutoModelForCausalLM.from_pretrained(str(megatron.hf_dir))
    assert AutoTokenizer.from_pretrained(str(megatron.hf_dir)).eos_token == "<|im_end|>"
    state = dict(model.named_parameters())
    assert state.keys() == megatron.resumed_weights.keys()
    assert all(torch.equal(state[k].detach(), v) for k, v in megatron.resumed_weights.items())
