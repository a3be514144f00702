"""Where a rank's tensors live, what dtype they have, and how a mini-batch is dealt to ranks (no process group)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from trainer_helpers import run_config

from trinity.config import TorchTrainerConfig
from trinity.trainer.batch import Sample, TokenSequence
from trinity.trainer.parallel import Precision, Ranks, deal, rank_micro_batches, resolve_device, resolve_precision

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def test_auto_is_the_cpu_without_a_gpu_and_cuda_is_refused_clearly() -> None:
    assert not torch.cuda.is_available()  # this suite runs on CPU machines; the GPU paths run in `make gpu-check`
    assert resolve_device("auto") == CPU
    assert resolve_device("cpu") == CPU
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=rf"trainer.device is '{spec}' but this torch sees no CUDA device"):
            resolve_device(spec)


def test_a_device_that_is_no_device_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="device"):
        TorchTrainerConfig(device="gpu0")
    assert TorchTrainerConfig(device="cuda:3").device == "cuda:3"


@pytest.mark.parametrize(
    ("fields", "device", "sharded", "expected"),
    [
        ({}, CPU, False, Precision(torch.float32)),
        # On a GPU: bf16 compute over fp32 master weights by default (autocast on one rank, FSDP2's mixed precision
        # when sharded), so that an lr-1e-6 update is not rounded away.
        ({}, CUDA, False, Precision(torch.float32, autocast=True)),
        ({}, CUDA, True, Precision(torch.float32, compute=torch.bfloat16)),
        ({"weights_dtype": "bfloat16"}, CUDA, False, Precision(torch.float32, autocast=True)),
        ({"fp32_master_weights": False}, CUDA, False, Precision(torch.bfloat16)),  # pure bf16 only when asked for
        ({"autocast": "bfloat16"}, CPU, True, Precision(torch.float32, autocast=True)),
        ({"weights_dtype": "float32"}, CUDA, True, Precision(torch.float32)),
        ({"fp32_master_weights": True}, CUDA, True, Precision(torch.float32, compute=torch.bfloat16)),
        ({"fp32_master_weights": True}, CUDA, False, Precision(torch.float32, autocast=True)),
        ({"weights_dtype": "bfloat16"}, CPU, False, Precision(torch.bfloat16)),  # a CPU keeps no master copy
        (
            {"weights_dtype": "bfloat16", "fp32_master_weights": True},
            CPU,
            False,
            Precision(torch.float32, autocast=True),
        ),
    ],
)
def test_precision_follows_the_device_unless_set(
    fields: dict, device: torch.device, sharded: bool, expected: Precision
) -> None:
    assert resolve_precision(TorchTrainerConfig(**fields), "float32", device, sharded) == expected


def test_the_model_dtype_is_kept_on_a_cpu_and_master_weights_need_bf16() -> None:
    assert resolve_precision(TorchTrainerConfig(), "bfloat16", CPU, False).load == torch.bfloat16
    with pytest.raises(ValueError, match="fp32_master_weights needs bfloat16"):
        resolve_precision(TorchTrainerConfig(fp32_master_weights=True, weights_dtype="float32"), "float32", CPU, False)


def _samples(prompts: int, per_prompt: int) -> list[Sample]:
    out = []
    for p in range(prompts):
        for k in range(per_prompt):
            seq = TokenSequence(prompt=[p + 3] * (2 + p), response=[7] * (1 + k + p), action_mask=[True] * (1 + k + p))
            out.append(Sample(id=f"{p}-{k}", chosen=seq, group=p))
    return out


@pytest.mark.parametrize(("prompts", "per_prompt", "world"), [(4, 4, 2), (3, 2, 2), (1, 8, 2), (2, 1, 3)])
def test_every_sample_goes_to_exactly_one_rank_and_prompts_stay_together(
    prompts: int, per_prompt: int, world: int
) -> None:
    samples = _samples(prompts, per_prompt)
    shares = deal(samples, world, share_prompts=True)
    assert sorted(i for s in shares for i in s) == list(range(len(samples)))
    assert shares == deal(samples, world, share_prompts=True)  # every rank computes every rank's share
    if prompts >= world:
        for p in range(prompts):
            holders = [r for r, share in enumerate(shares) if any(samples[i].group == p for i in share)]
            assert len(holders) == 1, f"prompt {p} split over ranks {holders}"
    else:  # fewer prompts than ranks: split by sample, so no rank idles
        assert all(shares[r] for r in range(min(world, len(samples))))


def test_ranks_run_the_same_number_of_passes_padding_with_empty_ones() -> None:
    samples = _samples(3, 2)
    plans = [rank_micro_batches(samples, Ranks(r, 2), token_budget=12, share_prompts=False) for r in range(2)]
    real = [[mb for mb in plan if mb is not None] for plan in plans]
    assert sorted(i for share in real for mb in share for i in mb) == list(range(len(samples)))
    assert all(len(plan) == max(len(r) for r in real) for plan in plans)  # padded to the busiest rank
    for plan, own in zip(plans, real, strict=True):
        assert all(mb is not None for mb in plan[: len(own)])  # real passes first, padding after


def test_a_backend_refuses_a_process_group_of_another_size(tiny_model: Path) -> None:
    from trinity.trainer.torch_backend import TorchBackend

    with pytest.raises(ValueError, match="data_parallel_size is 2 but this rank's process group has 1"):
        TorchBackend(run_config(tiny_model, "grpo", data_parallel_size=2))


def test_the_backend_logs_the_precision_it_resolved(tiny_model: Path) -> None:
    from structlog.testing import capture_logs

    from trinity.trainer.torch_backend import TorchBackend

    with capture_logs() as logs:
        TorchBackend(run_config(tiny_model, "grpo", weights_dtype="bfloat16"))
    (event,) = [e for e in logs if e["event"] == "trainer.precision"]
    assert {k: event[k] for k in ("device", "weights", "compute", "autocast")} == {
        "device": "cpu",
        "weights": "bfloat16",
        "compute": "bfloat16",
        "autocast": False,
    }
