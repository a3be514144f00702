"""Data parallelism of the Megatron backend: DP=2 replicas train exactly as one (gloo, real processes).

One scenario per layout, run once per module against the DP=1 Megatron backend on the same batches:
score a batch, export, three GRPO steps (KL and entropy terms, two mini-batches per step; the third
batch has a single sample, so one replica has nothing to train on), checkpoint after step 1, resume and
replay steps 2 and 3.

Tolerances (float32): log-probs 1e-6 absolute; loss and metrics 1e-5 relative; weights after 5 AdamW
updates at lr 1e-3: 1e-5 absolute (an update moves a weight by about 1e-3, so a replica's missing share
of the gradient shows as ~1e-3; a doubled gradient, to which Adam is blind, shows in grad_norm). Export
before training and resume on the same layout are bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from megatron_helpers import grpo_config, random_rollouts
from pydantic import ValidationError
from safetensors.torch import load_file

from trinity.config import MegatronTrainerConfig, RunConfig
from trinity.trainer.megatron import MegatronBackend
from trinity.trainer.megatron.backend import check_devices
from trinity.trainer.megatron.engine import check_resumable

LAYOUTS: dict[str, dict[str, Any]] = {
    "dp2": {"data_parallel_size": 2},
    "dp2_distributed_optimizer": {"data_parallel_size": 2, "use_distributed_optimizer": True},
    "pp2_dp2": {"pipeline_parallel_size": 2, "data_parallel_size": 2},
}
METRICS = (
    *("loss/total", "pg_loss", "kl", "entropy", "grad_norm", "advantage/mean", "reward/mean", "lr"),
    *("consistency/logprob_diff_mean", "consistency/logprob_diff_max", "consistency/k3_kl"),  # the probe, merged
)
BATCHES = [random_rollouts(8, seed=21), random_rollouts(8, seed=22), random_rollouts(1, seed=23)]


def _config(model: Path, **trainer: Any) -> RunConfig:
    return grpo_config(
        model,
        kl_coef=0.1,
        entropy_coef=0.01,
        seed=5,
        backend="megatron",
        micro_batch_tokens=40,
        mini_batch_size=4,
        optimizer={"lr": 1e-3},
        **trainer,
    )


def _export(backend: MegatronBackend) -> dict[str, torch.Tensor]:
    items = [(name, tensor.detach().clone()) for name, tensor in backend.named_weights()]
    names = [name for name, _ in items]
    assert len(names) == len(set(names)), "a tensor was exported twice"
    return dict(items)


@dataclass
class Outcome:
    layout: dict[str, Any]
    scores: torch.Tensor
    initial: dict[str, torch.Tensor]
    metrics: list[dict[str, float]]
    weights: dict[str, torch.Tensor]
    checkpoint: Path
    resumed_metrics: list[dict[str, float]]
    resumed_weights: dict[str, torch.Tensor]


def _scenario(model: Path, checkpoints: Path, **trainer: Any) -> Outcome:
    with MegatronBackend(_config(model, **trainer)) as backend:
        scores = backend.score(BATCHES[0])
        initial = _export(backend)
        metrics = [backend.train_step(BATCHES[0])]
        ckpt = backend.save_checkpoint(checkpoints)
        metrics += [backend.train_step(b) for b in BATCHES[1:]]
        weights = _export(backend)
        backend.load_checkpoint(ckpt)
        resumed = [backend.train_step(b) for b in BATCHES[1:]]
        return Outcome(trainer, scores, initial, metrics, weights, ckpt, resumed, _export(backend))


@pytest.fixture(scope="module")
def single(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return _scenario(tiny_model, tmp_path_factory.mktemp("ckpt-dp1"))


@pytest.fixture(scope="module", params=list(LAYOUTS))
def replicated(request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return _scenario(tiny_model, tmp_path_factory.mktemp(f"ckpt-{request.param}"), **LAYOUTS[request.param])


def _stable(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if "second" not in k and "per_s" not in k}


@pytest.mark.system  # Megatron workers train three steps per layout: minutes on 2 cores
def test_scores_equal_the_single_replica_scores(replicated: Outcome, single: Outcome) -> None:
    # Positions past a row's response are padding: their values depend on the micro-batch the row was in.
    valid = torch.zeros_like(single.scores, dtype=torch.bool)
    for row, experience in enumerate(BATCHES[0]):
        valid[row, : len(experience.response_token_ids)] = True
    torch.testing.assert_close(replicated.scores[valid], single.scores[valid], rtol=0, atol=1e-6)


@pytest.mark.system  # Megatron workers train three steps per layout: minutes on 2 cores
def test_the_export_is_every_hugging_face_tensor_once_and_bit_exact(replicated: Outcome, tiny_model: Path) -> None:
    hf = load_file(str(tiny_model / "model.safetensors"))
    assert replicated.initial.keys() == hf.keys()
    assert all(torch.equal(replicated.initial[k], hf[k]) for k in hf)


@pytest.mark.system  # Megatron workers train three steps per layout: minutes on 2 cores
@pytest.mark.parametrize("step", [0, 1, 2])
def test_each_step_reports_the_single_replica_loss_and_metrics(replicated: Outcome, single: Outcome, step: int) -> None:
    mine, ref = replicated.metrics[step], single.metrics[step]
    assert mine["updates"] == ref["updates"] and mine["samples"] == ref["samples"] == len(BATCHES[step])
    for name in METRICS:
        assert mine[name] == pytest.approx(ref[name], rel=1e-5, abs=1e-7), name


@pytest.mark.system  # Megatron workers train three steps per layout: minutes on 2 cores
def test_weights_after_training_equal_the_single_replica_weights(replicated: Outcome, single: Outcome) -> None:
    assert replicated.weights.keys() == single.weights.keys()
    moved = max(float((single.weights[k] - single.initial[k]).abs().max()) for k in single.weights)
    assert moved > 1e-3  # a replica's missing share of the gradient would show
    for name, tensor in single.weights.items():
        torch.testing.assert_close(replicated.weights[name], tensor, rtol=0, atol=1e-5, msg=name)


@pytest.mark.system  # Megatron workers train three steps per layout: minutes on 2 cores
def test_resume_replays_the_next_steps_exactly(replicated: Outcome) -> None:
    assert [_stable(m) for m in replicated.resumed_metrics] == [_stable(m) for m in replicated.metrics[1:]]
    assert all(torch.equal(replicated.resumed_weights[k], v) for k, v in replicated.weights.items())


@pytest.mark.system  # Megatron workers train three steps per layout: minutes on 2 cores
def test_a_two_replica_checkpoint_resumes_on_one_replica(
    replicated: Outcome, single: Outcome, tiny_model: Path
) -> None:
    # The plain optimizer's state is whole on every replica, so the replica count may change on resume.
    if replicated.layout != LAYOUTS["dp2"]:
        pytest.skip("one layout is enough: the others need as many workers again")
    with MegatronBackend(_config(tiny_model)) as backend:
        backend.load_checkpoint(replicated.checkpoint)
        assert backend.step == 1
        resumed = [backend.train_step(b) for b in BATCHES[1:]]
        weights = _export(backend)
    for mine, ref in zip(resumed, single.metrics[1:], strict=True):
        assert mine["loss/total"] == pytest.approx(ref["loss/total"], rel=1e-5, abs=1e-7)
    for name, tensor in single.weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-5, msg=name)


def _trainer(**fields: Any) -> MegatronTrainerConfig:
    return MegatronTrainerConfig(backend="megatron", **fields)


def test_the_world_size_is_tensor_times_pipeline_times_data_parallel() -> None:
    assert _trainer(tensor_parallel_size=2, pipeline_parallel_size=3, data_parallel_size=4).world_size == 24


@pytest.mark.system  # Megatron workers train three steps per layout: minutes on 2 cores
def test_a_distributed_optimizer_checkpoint_refuses_another_replica_count(tmp_path: Path, replicated: Outcome) -> None:
    if not replicated.layout.get("use_distributed_optimizer"):
        pytest.skip("this layout uses the plain optimizer")
    with pytest.raises(ValueError, match=r"sharded over 2 data-parallel ranks; resume with data_parallel_size=2"):
        check_resumable(replicated.checkpoint, _trainer(data_parallel_size=4, use_distributed_optimizer=True))
    with pytest.raises(ValueError, match="use_distributed_optimizer=True; resume with the same setting"):
        check_resumable(replicated.checkpoint, _trainer(data_parallel_size=2))


@pytest.mark.system  # Megatron workers train three steps per layout: minutes on 2 cores
def test_a_checkpoint_of_another_model_parallel_layout_is_refused_before_loading(single: Outcome) -> None:
    with pytest.raises(ValueError, match=r"holds 1 model-parallel shard\(s\), not the 2 of .* = 2 x 1"):
        check_resumable(single.checkpoint, _trainer(tensor_parallel_size=2))


def test_a_checkpoint_with_more_shards_than_the_layout_is_refused(tmp_path: Path) -> None:
    for stage in range(2):  # what a PP=2 run writes (check_resumable reads only the layout of the files)
        shard = tmp_path / f"mp_rank_00_{stage:03d}"
        shard.mkdir()
        (shard / "model_optim_rng.pt").touch()
    (tmp_path / "state.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds 2 model-parallel shard\(s\), not the 1 of .* = 1 x 1"):
        check_resumable(tmp_path, _trainer(data_parallel_size=2))


def test_nccl_without_a_gpu_is_refused_before_any_worker_starts() -> None:
    with pytest.raises(ValueError, match="distributed_backend='nccl' needs a GPU per worker"):
        check_devices(_trainer(distributed_backend="nccl"), gpus=0)


def test_more_workers_than_gpus_is_refused_with_the_layout() -> None:
    trainer = _trainer(tensor_parallel_size=2, data_parallel_size=2)
    with pytest.raises(ValueError, match=r"data_parallel_size=2 = 4 workers, one GPU each, but 2 GPU\(s\)"):
        check_devices(trainer, gpus=2)
    check_devices(trainer, gpus=4)
    check_devices(_trainer(data_parallel_size=8), gpus=0)  # CPU workers over gloo: any number


@pytest.mark.parametrize("key", ["sequence_parallel", "context_parallel_size", "expert_model_parallel_size"])
def test_unsupported_megatron_parallelism_is_rejected_naming_the_key(key: str) -> None:
    with pytest.raises(ValidationError, match=key):
        MegatronTrainerConfig.model_validate({"backend": "megatron", key: 2})
