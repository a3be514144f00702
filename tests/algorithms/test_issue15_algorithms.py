"""Hand-computed values of the algorithms added for the whole Trinity-RFT family: ReMax, multi-step GRPO,
OPMD, MIX, RAFT, IS-PPO and M2PO."""

import math

import pytest
import torch

from trinity import algorithms as A
from trinity.algorithms.policy_losses.unclipped import m2po_mask

EPS = 1e-6
SQRT_HALF = math.sqrt(0.5)


def _mask(*lengths: int, seq: int = 3) -> torch.Tensor:
    return torch.tensor([[t < n for t in range(seq)] for n in lengths])


def _row_values(adv: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The per-row value, after checking it is constant on valid tokens and zero elsewhere."""
    out = []
    for row, m in zip(adv, mask, strict=True):
        assert torch.all(row[~m] == 0)
        assert torch.allclose(row[m], row[m][0].expand(int(m.sum())))
        out.append(row[m][0].item())
    return out


# ----------------------------------------------------------------------------------------------- ReMax
def test_remax_subtracts_the_greedy_reward_from_the_reward_to_go() -> None:
    mask = _mask(2, 3)
    adv, returns = A.advantage("remax")(
        rewards=torch.tensor([1.0, 0.0]), reward_baselines=torch.tensor([0.25, 0.5]), mask=mask
    )
    assert _row_values(adv, mask) == pytest.approx([0.75, -0.5])
    assert returns is not None
    # the outcome reward sits on the last token; its undiscounted reward-to-go reaches every earlier token
    assert _row_values(returns, mask) == pytest.approx([1.0, 0.0])


def test_remax_without_baselines_names_the_missing_input() -> None:
    with pytest.raises(ValueError, match="reward_baselines"):
        A.advantage("remax")(rewards=torch.tensor([1.0]), mask=_mask(1))
    with pytest.raises(ValueError, match="reward_baselines must be"):
        A.advantage("remax")(rewards=torch.tensor([1.0]), reward_baselines=torch.zeros(2), mask=_mask(1))


# ------------------------------------------------------------------------------------- multi-step GRPO
# Task group 0: episode 10 (two steps, return 1; its first row carries a stale 9 that must be ignored) and
# episode 11 (one step, return 0). Task group 1: episode 12 alone (three steps, return 2).
STEPS = dict(
    rewards=torch.tensor([9.0, 1.0, 0.0, 2.0, 2.0, 2.0]),
    group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
    episode_ids=torch.tensor([10, 10, 11, 12, 12, 12]),
    mask=_mask(1, 2, 3, 1, 2, 3),
)


def test_step_wise_grpo_scores_each_episode_by_its_last_step_within_its_task_group() -> None:
    adv, returns = A.advantage("step_wise_grpo")(**STEPS)
    assert returns is None
    a, b, c = 0.5 / (SQRT_HALF + EPS), -0.5 / (SQRT_HALF + EPS), 2.0 / (1.0 + EPS)  # c: a group of one
    assert _row_values(adv, STEPS["mask"]) == pytest.approx([a, a, b, c, c, c])


def test_step_wise_grpo_step_norm_divides_by_the_episode_length() -> None:
    adv, _ = A.advantage("step_wise_grpo", enable_step_norm=True)(**STEPS)
    a, b, c = 0.5 / (SQRT_HALF + EPS), -0.5 / (SQRT_HALF + EPS), 2.0 / (1.0 + EPS)
    assert _row_values(adv, STEPS["mask"]) == pytest.approx([a / 2, a / 2, b, c / 3, c / 3, c / 3])


def test_step_wise_grpo_batch_and_no_std_levels() -> None:
    # episode returns 1, 0, 2: batch mean 1, unbiased variance (0 + 1 + 1) / 2 = 1
    adv, _ = A.advantage("step_wise_grpo", std_cal_level="batch")(**STEPS)
    assert _row_values(adv, STEPS["mask"]) == pytest.approx(
        [0.5 / (1 + EPS)] * 2 + [-0.5 / (1 + EPS)] + [2.0 / (1 + EPS)] * 3
    )
    adv, _ = A.advantage("step_wise_grpo", std_cal_level="none")(**STEPS)
    assert _row_values(adv, STEPS["mask"]) == pytest.approx([0.5, 0.5, -0.5, 2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="std_cal_level"):
        A.advantage("step_wise_grpo", std_cal_level="token")(**STEPS)


def test_step_wise_grpo_with_one_step_episodes_is_grpo() -> None:
    inputs = dict(
        rewards=torch.tensor([1.0, 0.0, 3.0, 1.0]), group_ids=torch.tensor([0, 0, 1, 1]), mask=_mask(3, 2, 1, 3)
    )
    stepwise, _ = A.advantage("step_wise_grpo")(**inputs)
    grpo, _ = A.advantage("grpo")(**inputs)
    assert torch.allclose(stepwise, grpo)


# --------------------------------------------------------------------------------------------- OPMD
def test_opmd_preset_advantage_and_loss_by_hand() -> None:
    p = A.preset("opmd")
    mask = torch.ones(2, 1, dtype=torch.bool)
    adv, _ = A.advantage(p.advantage or "")(rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]), mask=mask)
    assert adv.squeeze(-1).tolist() == pytest.approx([0.5, -0.5])
    lp = torch.tensor([[-1.0], [-2.0]], requires_grad=True)
    loss, _ = A.policy_loss(p.policy_loss)(logprobs=lp, advantages=adv, mask=mask)
    # token-mean of -A * logprobs = (0.5 - 1.0) / 2, divided by 1 + tau = 2
    assert loss.item() == pytest.approx(-0.125)
    loss.backward()
    assert lp.grad is not None and lp.grad.squeeze(-1).tolist() == pytest.approx([-0.125, 0.125])


# ---------------------------------------------------------------------------------------------- MIX
def test_mix_weighs_ppo_on_rollouts_and_per_sequence_sft_on_expert_rows() -> None:
    mask = _mask(2, 1, 3)
    lp = torch.tensor([[-0.5, -0.5, 0.0], [-1.0, 0.0, 0.0], [-2.0, -2.0, -2.0]], requires_grad=True)
    adv = torch.where(mask, torch.tensor([[1.0], [0.0], [0.0]]), 0.0)
    loss, metrics = A.policy_loss("mix")(
        logprobs=lp, old_logprobs=lp.detach(), advantages=adv, mask=mask, expert_mask=torch.tensor([False, True, True])
    )
    # on-policy PPO on row 0: -A * 1 averaged over its tokens = -1.
    # SFT per sequence on rows 1 and 2: (1 + 2) / 2 = 1.5 (token-mean would give (1 + 6) / 4 = 1.75).
    assert loss.item() == pytest.approx(0.9 * -1.0 + 0.1 * 1.5)
    assert metrics["mu"] == 0.1 and metrics["expert/sft_loss"] == pytest.approx(1.5)


def test_mix_equals_mix_chord_with_a_constant_mu_and_no_phi_when_aggregations_agree() -> None:
    mask = _mask(2, 3, 1)
    lp = torch.tensor([[-0.3, -0.9, 0.0], [-1.2, -0.4, -2.0], [-0.7, 0.0, 0.0]])
    inputs = dict(
        logprobs=lp, old_logprobs=lp - 0.1, advantages=torch.where(mask, 0.7, 0.0), mask=mask,
        expert_mask=torch.tensor([False, True, False]),
    )  # fmt: skip
    mixed, _ = A.policy_loss("mix", mu=0.3, sft_loss_agg_mode="token-mean")(**inputs)
    chord, _ = A.policy_loss("mix_chord", mu_peak=0.3, mu_valley=0.3, enable_phi_function=False)(**inputs, step=5)
    assert mixed.item() == pytest.approx(chord.item())


def test_mix_preset_declares_expert_data() -> None:
    assert A.preset("mix").uses_expert_data and A.preset("mix_chord").uses_expert_data
    assert A.policy_loss(A.preset("mix").policy_loss).params["mu"] == 0.1
    assert not A.preset("grpo").uses_expert_data


# --------------------------------------------------------------------------------------------- RAFT
def test_raft_is_sft_on_reward_filtered_rollouts() -> None:
    p = A.preset("raft")
    assert (p.policy_loss, p.advantage, p.data_kind) == ("sft", None, "rollout")
    assert p.operators == ("reward_filter",) and not p.needs_reference
    mask = _mask(1, 3)
    lp = torch.tensor([[-1.0, 0.0, 0.0], [-2.0, -2.0, -3.0]])
    loss, _ = A.policy_loss(p.policy_loss)(logprobs=lp, mask=mask)
    assert loss.item() == pytest.approx((1 + 2 + 2 + 3) / 4)


# ------------------------------------------------------------------------------------ IS-PPO and M2PO
def test_importance_sampling_keeps_the_gradient_where_ppo_clips() -> None:
    mask = torch.ones(1, 2, dtype=torch.bool)
    old = torch.tensor([[-1.0, -1.0]])
    lp = (old + torch.tensor([[math.log(2.0), -0.5]])).requires_grad_()
    adv = torch.tensor([[1.0, -1.0]])
    loss, metrics = A.policy_loss("importance_sampling")(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
    assert loss.item() == pytest.approx((-2.0 + math.exp(-0.5)) / 2)
    assert metrics["ratio/mean"] == pytest.approx((2.0 + math.exp(-0.5)) / 2)
    loss.backward()
    assert lp.grad is not None
    # d(-A r)/d logp = -A r, over 2 tokens; PPO's clip (ratio 2 > 1.2 with A > 0) would give 0 for token 0
    assert lp.grad.squeeze(0).tolist() == pytest.approx([-1.0, math.exp(-0.5) / 2])
    ppo_lp = lp.detach().clone().requires_grad_()
    A.policy_loss("ppo")(logprobs=ppo_lp, old_logprobs=old, advantages=adv, mask=mask)[0].backward()
    assert ppo_lp.grad is not None and ppo_lp.grad[0, 0].item() == 0.0


M2PO_CASE = dict(
    old_logprobs=torch.zeros(1, 5),
    logprobs=torch.tensor([[0.1, 0.3, -0.2, 0.0, 0.4]]),
    advantages=torch.tensor([[1.0, 1.0, 1.0, 1.0, -1.0]]),
    mask=torch.tensor([[True, True, True, True, False]]),  # the fifth token is padding
)


def test_m2po_masks_the_largest_second_moments_until_the_mean_is_under_the_threshold() -> None:
    # trust-region candidates (A > 0 and log r > 0): tokens 0 and 1, (log r)^2 = 0.01 and 0.09, mean 0.05 > 0.04;
    # prefix means of the sorted moments are 0.01, 0.05: keep one, mask token 1
    mask = m2po_mask(M2PO_CASE["logprobs"], M2PO_CASE["old_logprobs"], M2PO_CASE["advantages"], M2PO_CASE["mask"], 0.04)
    assert mask.tolist() == [[True, False, True, True, False]]
    loss, metrics = A.policy_loss("m2po")(**M2PO_CASE)
    # masked tokens stay in the denominator: 4 valid tokens
    assert loss.item() == pytest.approx(-(math.exp(0.1) + math.exp(-0.2) + 1.0) / 4)
    assert metrics["m2po_masked_fraction"] == pytest.approx(0.25)


def test_m2po_under_the_threshold_is_importance_sampling() -> None:
    loose, _ = A.policy_loss("m2po", m2_threshold=1.0)(**M2PO_CASE)
    plain, _ = A.policy_loss("importance_sampling")(**M2PO_CASE)
    assert loose.item() == pytest.approx(plain.item())
    with pytest.raises(ValueError, match="m2_threshold"):
        A.policy_loss("m2po", m2_threshold=-1.0)(**M2PO_CASE)


def test_m2po_candidates_include_negative_advantages_with_falling_ratios() -> None:
    lp = torch.tensor([[-0.5, 0.5]])
    adv = torch.tensor([[-1.0, -1.0]])  # token 0: A < 0 and log r < 0, a candidate; token 1 is not
    assert m2po_mask(lp, torch.zeros(1, 2), adv, torch.ones(1, 2, dtype=torch.bool), 0.04).tolist() == [[False, True]]
