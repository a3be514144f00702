"""The per-row inputs some presets need from the trainer: RAFT trains without advantages, ReMax reads the
greedy baseline the explorer writes, multi-step presets get episode ids, GiGPO its anchor states."""

from __future__ import annotations

import pytest
from trainer_helpers import random_rollouts, run_config

from trinity.algorithm_table import RowInput
from trinity.trainer import build_backend
from trinity.trainer.batch import REWARD_BASELINE, row_inputs, to_samples
from trinity.v1 import common_pb2


def test_raft_trains_its_rollouts_without_an_advantage(tiny_model):
    metrics = build_backend(run_config(tiny_model, "raft")).train_step(random_rollouts(4, seed=2))
    assert "advantage/mean" not in metrics
    assert metrics["loss/total"] > 0  # the SFT negative log-likelihood of the responses


def test_remax_reads_the_greedy_baseline_and_names_it_when_missing(tiny_model):
    rollouts = random_rollouts(4, seed=3)
    with pytest.raises(ValueError, match=r"reward_baselines \(from Experience\.reward_components"):
        build_backend(run_config(tiny_model, "remax")).train_step(rollouts)
    for exp in rollouts:
        exp.reward_components[REWARD_BASELINE] = exp.reward  # baseline = reward: every advantage is zero
    metrics = build_backend(run_config(tiny_model, "remax")).train_step(rollouts)
    assert metrics["advantage/mean"] == pytest.approx(0.0, abs=1e-7)


def test_episode_ids_number_episodes_and_rows_without_one_stand_alone():
    def step(episode: str, i: int) -> common_pb2.Experience:
        return common_pb2.Experience(
            id=f"e{episode}-{i}", group_id="task", episode_id=episode, prompt_token_ids=[5], response_token_ids=[6]
        )

    samples = to_samples([step("a", 0), step("b", 0), step("a", 1), step("", 0), step("", 1)], None)
    inputs = row_inputs(samples)
    assert inputs[RowInput.EPISODE_IDS] is not None
    assert inputs[RowInput.EPISODE_IDS].tolist() == [0, 1, 0, 2, 3]
    assert inputs[RowInput.REWARD_BASELINES] is None
    plain = row_inputs(to_samples(random_rollouts(3), None))
    assert set(plain.values()) == {None}


def test_multi_step_grpo_refuses_a_batch_without_episodes(tiny_model):
    with pytest.raises(ValueError, match=r"episode_ids \(from Experience\.episode_id"):
        build_backend(run_config(tiny_model, "multi_step_grpo")).train_step(random_rollouts(4, seed=5))
