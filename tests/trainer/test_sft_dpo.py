"""Offline modes: SFT drives the NLL down; DPO widens the chosen-over-rejected margin."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import preference_pairs, run_config

from trinity.trainer.torch_backend import TorchBackend
from trinity.v1 import common_pb2

SFT_DATA = [("2+2", "4"), ("3+3", "6"), ("hello", "world"), ("sky", "blue")]


def _sft_experiences() -> list[common_pb2.Experience]:
    return [
        common_pb2.Experience(id=f"sft{i}", kind=common_pb2.EXPERIENCE_KIND_SFT, prompt_text=p, response_text=r)
        for i, (p, r) in enumerate(SFT_DATA)
    ]


def test_sft_on_a_tiny_dataset_drives_the_loss_down(tiny_model: Path) -> None:
    backend = TorchBackend(run_config(tiny_model, "sft", optimizer={"lr": 1e-2}))
    losses = []
    for epoch in range(8):
        exps = _sft_experiences()
        for e in exps:
            e.id = f"{e.id}-epoch{epoch}"  # a new epoch re-reads the data under new ids
        losses.append(backend.train_step(exps)["sft_loss"])
    assert losses[0] > 5.0  # ~log(272) for a random model
    assert losses[-1] < 0.5 * losses[0], losses


def test_dpo_raises_the_chosen_over_rejected_margin(tiny_model: Path) -> None:
    config = run_config(tiny_model, "dpo", policy_loss={"beta": 0.5}, optimizer={"lr": 3e-3}, micro_batch_tokens=64)
    backend = TorchBackend(config)
    assert backend.reference is not None
    metrics = []
    for epoch in range(8):
        exps = preference_pairs()
        for e in exps:
            e.id = f"{e.id}-epoch{epoch}"
        metrics.append(backend.train_step(exps))
    first, last = metrics[0], metrics[-1]
    print([round(m["dpo_loss"], 3) for m in metrics], last["chosen_reward"] - last["rejected_reward"])
    # The first step starts at the reference: margin 0, loss log 2 (closed form of -log sigmoid(0)).
    assert first["dpo_loss"] == pytest.approx(float(torch.log(torch.tensor(2.0))), abs=1e-5)
    assert last["dpo_loss"] < 0.5
    assert last["chosen_reward"] - last["rejected_reward"] > 1.0


def test_duplicate_ids_are_dropped_and_counted(tiny_model: Path) -> None:
    backend = TorchBackend(run_config(tiny_model, "sft"))
    backend.train_step(_sft_experiences())
    again = backend.train_step(_sft_experiences())
    assert again["dropped/duplicate"] == len(SFT_DATA)
    assert again["skipped"] == 1.0
    assert backend.step == 1
