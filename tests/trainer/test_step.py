"""The shared train step hands each function exactly the inputs it declares: GiGPO its anchor states, the `mix`
entropy term its expert mask, a plugin's aggregation mode its micro-batch share."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from trainer_helpers import grpo_parts, random_rollouts, run_config

import trinity.algorithms as A
from trinity.algorithms import LOSS_AGGREGATIONS, Aggregation, masked_mean, masked_sum
from trinity.algorithms.registry import FunctionRegistry
from trinity.trainer.algorithm import AlgorithmParts, build_algorithm
from trinity.trainer.batch import collate, to_samples
from trinity.trainer.step import prepare
from trinity.trainer.torch_backend import TorchBackend
from trinity.v1 import common_pb2


def _step(episode: str, index: int, state: str, episode_return: float, to_go: float) -> common_pb2.Experience:
    """One step of a FrozenLake-like episode, as the multi-step workflow writes it."""
    exp = common_pb2.Experience(
        id=f"{episode}{index}", group_id="task", episode_id=episode, step_index=index, state_key=state,
        prompt_token_ids=[5, 6, 7], response_token_ids=[8, 9], logprobs=[-1.0, -1.0], reward=episode_return,
    )  # fmt: skip
    exp.reward_components.update(step_reward=to_go, return_to_go=to_go, episode_return=episode_return)
    return exp


def test_gigpo_adds_the_step_level_advantage_where_states_repeat(tiny_model: Path) -> None:
    # Two episodes of one task both start in s0; episode a then reaches s1 and succeeds, episode b reaches s2 and
    # fails. Episode level (mean-centred in the task group): a +0.5, b -0.5. Step level, anchor group (task, s0):
    # returns-to-go 1 and 0 -> +0.5 and -0.5; s1 and s2 are anchor groups of one -> 0. omega = 1.
    exps = [_step("a", 0, "s0", 1.0, 1.0), _step("a", 1, "s1", 1.0, 1.0)]
    exps += [_step("b", 0, "s0", 0.0, 0.0), _step("b", 1, "s2", 0.0, 0.0)]
    backend = TorchBackend(run_config(tiny_model, "gigpo", kl_coef=0.0))
    batch = prepare(backend, backend.algorithm, to_samples(exps, None), [[0, 1, 2, 3]])
    assert batch.advantages is not None
    assert batch.advantages[:, 0].tolist() == pytest.approx([1.0, 0.5, -1.0, -0.5], abs=1e-5)
    assert batch.metrics["advantage/within_episode_std"] == pytest.approx(0.25, abs=1e-5)
    # multi-step GRPO on the same batch: the episode's score on each of its steps, no step-level term
    grpo = TorchBackend(run_config(tiny_model, "multi_step_grpo", kl_coef=0.0))
    episode_level = prepare(grpo, grpo.algorithm, to_samples(exps, None), [[0, 1, 2, 3]]).advantages
    assert episode_level is not None
    assert episode_level[:, 0].tolist() == pytest.approx([0.7071, 0.7071, -0.7071, -0.7071], abs=1e-4)
    assert prepare(grpo, grpo.algorithm, to_samples(exps, None), [[0, 1, 2, 3]]).metrics[
        "advantage/within_episode_std"
    ] == pytest.approx(0.0, abs=1e-6)


def test_gigpo_refuses_a_batch_without_state_keys_naming_where_they_come_from(tiny_model: Path) -> None:
    backend = TorchBackend(run_config(tiny_model, "gigpo", kl_coef=0.0))
    with pytest.raises(ValueError, match=r"step_group_ids \(from Experience\.state_key"):
        backend.train_step(random_rollouts(4, seed=1))


def _mixed_batch() -> list[common_pb2.Experience]:
    demos = [
        common_pb2.Experience(
            id=f"d{i}", kind=common_pb2.EXPERIENCE_KIND_SFT, prompt_token_ids=[4, 5 + i], response_token_ids=[9, 10, 11]
        )
        for i in range(2)
    ]
    return random_rollouts(4, seed=11) + demos


@pytest.mark.parametrize("name", ["mix", "mix_chord"])
def test_the_entropy_bonus_skips_demonstration_rows(tiny_model: Path, name: str) -> None:
    seen: list[torch.Tensor] = []
    mix = A.ENTROPY_TERMS.get("mix")

    def recorded_mix(*, mask, entropy_coef, loss_agg_mode, norm_constant, entropies, expert_mask):  # type: ignore[no-untyped-def]
        seen.append(expert_mask)
        return mix(mask=mask, entropy_coef=entropy_coef, loss_agg_mode=loss_agg_mode, norm_constant=norm_constant,
                   entropies=entropies, expert_mask=expert_mask)  # fmt: skip

    terms = FunctionRegistry("entropy_term")
    terms.register("recorded_mix", entropy_coef=0.01, loss_agg_mode="token-mean", norm_constant=None)(recorded_mix)
    config = run_config(tiny_model, name)
    parts = replace(build_algorithm(config.algorithm), entropy=terms.build("recorded_mix"))
    exps = _mixed_batch()
    metrics = TorchBackend(config, algorithm=parts).compute_gradients(exps)

    samples = to_samples(exps, None)
    expert = torch.tensor([s.expert for s in samples])
    assert [m.tolist() for m in seen] == [expert.tolist()]  # one micro-batch, its rows' flags
    backend = TorchBackend(config, algorithm=parts)
    batch = collate([s.chosen for s in samples], backend.pad_id)
    with torch.no_grad():
        _, entropy = backend.logprobs(batch, with_entropy=True)
    rollouts = batch.mask & ~expert.unsqueeze(-1)
    assert metrics["entropy_term/entropy"] == pytest.approx(float(masked_mean(entropy, rollouts)), rel=1e-5)


def _sqrt_length(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's token sum over the square root of its length: a mode no built-in has."""
    return masked_sum(masked_sum(loss, mask, dim=-1) / mask.sum(-1).clamp(min=1).sqrt(), mask.any(-1))


def test_a_plugin_aggregation_mode_gives_the_same_gradient_in_one_and_in_four_micro_batches(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mode = Aggregation(_sqrt_length, lambda mask, _: mask.any(-1).sum().clamp(min=1))
    monkeypatch.setitem(LOSS_AGGREGATIONS._entries, "test-sqrt-length", mode)
    parts = grpo_parts(loss_agg_mode="test-sqrt-length", entropy_coef=0.01)
    exps = random_rollouts(8, seed=12)

    def grads(budget: int) -> dict[str, torch.Tensor]:
        backend = TorchBackend(run_config(tiny_model, micro_batch_tokens=budget), algorithm=parts)
        backend.compute_gradients(exps)
        return {n: p.grad.clone() for n, p in backend.policy.named_parameters() if p.grad is not None}

    whole, split = grads(10**9), grads(40)
    assert whole.keys() == split.keys() and whole
    for name, grad in whole.items():
        torch.testing.assert_close(split[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_the_step_hands_each_function_only_what_it_declares(tiny_model: Path) -> None:
    # `reinforce` reads no group ids and `opmd`'s loss no old log-probs: were everything passed, they would raise.
    parts = AlgorithmParts(data_kind="rollout", policy_loss=A.policy_loss("opmd"), advantage=A.advantage("reinforce"))
    metrics = TorchBackend(run_config(tiny_model), algorithm=parts).train_step(random_rollouts(4, seed=13))
    assert metrics["updates"] == 1.0


def test_a_preset_group_size_applies_unless_the_config_sets_one(tiny_model: Path) -> None:
    assert run_config(tiny_model, "grpo").algorithm.group_size == 2
    assert run_config(tiny_model, "dapo").algorithm.group_size == 16
    assert run_config(tiny_model, "grpo", algorithm_fields={"repeat_times": 5}).algorithm.group_size == 5
    assert build_algorithm(run_config(tiny_model, "dapo").algorithm).policy_loss.params["clip_range_high"] == 0.28
