import math

import pytest
import torch

from trinity import algorithms as A

EPS = 1e-6
SQRT_HALF = math.sqrt(0.5)


def _mask(*lengths: int, seq: int = 3) -> torch.Tensor:
    return torch.tensor([[t < n for t in range(seq)] for n in lengths])


def _rows(adv: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The per-row advantage, after checking it is constant on valid tokens and zero elsewhere."""
    out = []
    for row, m in zip(adv, mask, strict=True):
        assert torch.all(row[~m] == 0), "advantages must be zero on masked positions"
        vals = row[m]
        out.append(vals[0].item() if len(vals) else 0.0)
        assert torch.allclose(vals, vals[0] if len(vals) else vals)
    return out


def test_grpo_by_hand_with_equal_and_single_groups() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 3.0])
    group_ids = torch.tensor([0, 0, 1, 1, 2])
    mask = _mask(3, 2, 3, 1, 3)
    adv, returns = A.advantage("grpo")(rewards=rewards, mask=mask, group_ids=group_ids)
    assert returns is None
    # group 0: mean .5, unbiased std sqrt(.5) -> +-.5 / (sqrt(.5) + eps)
    # group 1: all equal -> 0 exactly; group 2: one sample -> mean 0, std 1 -> 3 / (1 + eps)
    expected = [0.5 / (SQRT_HALF + EPS), -0.5 / (SQRT_HALF + EPS), 0.0, 0.0, 3.0 / (1 + EPS)]
    assert _rows(adv, mask) == pytest.approx(expected)
    assert not torch.isnan(adv).any()


def test_grpo_without_std_is_mean_centering() -> None:
    rewards, group_ids, mask = torch.tensor([0.0, 2.0, 4.0]), torch.zeros(3, dtype=torch.long), _mask(3, 3, 3)
    # mean 2, std 2: normalized (x - 2) / (2 + eps); unnormalized x - 2
    assert _rows(A.advantage("grpo")(rewards=rewards, mask=mask, group_ids=group_ids)[0], mask) == pytest.approx(
        [-1.0, 0.0, 1.0], abs=1e-5
    )
    adv, _ = A.advantage("grpo", std_normalize=False)(rewards=rewards, mask=mask, group_ids=group_ids)
    assert _rows(adv, mask) == pytest.approx([-2.0, 0.0, 2.0])


def test_grpo_fully_masked_row_has_zero_advantage() -> None:
    mask = _mask(0, 2)
    adv, _ = A.advantage("grpo")(rewards=torch.tensor([1.0, 0.0]), mask=mask, group_ids=torch.tensor([0, 0]))
    assert torch.all(adv[0] == 0) and not torch.isnan(adv).any()


def test_rec_by_hand() -> None:
    rewards, gid, mask = torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), _mask(2, 2)
    assert _rows(A.advantage("rec")(rewards=rewards, mask=mask, group_ids=gid)[0], mask) == pytest.approx([0.5, -0.5])
    adv, _ = A.advantage("rec", std_normalize=True)(rewards=rewards, mask=mask, group_ids=gid)
    assert _rows(adv, mask) == pytest.approx([0.5 / (SQRT_HALF + EPS), -0.5 / (SQRT_HALF + EPS)])


def test_rloo_by_hand() -> None:
    rewards = torch.tensor([1.0, 0.0, 2.0, 5.0])
    gid = torch.tensor([7, 7, 7, 9])
    mask = _mask(1, 2, 3, 2)
    adv, _ = A.advantage("rloo")(rewards=rewards, mask=mask, group_ids=gid)
    # r_i - mean of the others: 1 - mean(0, 2) = 0; 0 - mean(1, 2) = -1.5; 2 - mean(1, 0) = 1.5; alone: 5
    assert _rows(adv, mask) == pytest.approx([0.0, -1.5, 1.5, 5.0])


def test_reinforce_is_the_raw_reward() -> None:
    mask = _mask(1, 3)
    adv, _ = A.advantage("reinforce")(rewards=torch.tensor([0.3, -2.0]), mask=mask)
    assert _rows(adv, mask) == pytest.approx([0.3, -2.0])


def test_asymre_by_hand() -> None:
    rewards, gid, mask = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), _mask(2, 2, 2)
    adv, _ = A.advantage("asymre")(rewards=rewards, mask=mask, group_ids=gid)
    # baseline mean .5 + shift -.1 = .4 -> .6, -.4; a single sample has baseline 0 -> 1
    assert _rows(adv, mask) == pytest.approx([0.6, -0.4, 1.0])


def test_opmd_mean_and_logavgexp_baselines_by_hand() -> None:
    rewards, gid, mask = torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), _mask(2, 2)
    assert _rows(A.advantage("opmd")(rewards=rewards, mask=mask, group_ids=gid)[0], mask) == pytest.approx([0.5, -0.5])
    # tau = 1: baseline log((e + 1) / 2) = 0.620115
    baseline = math.log((math.e + 1) / 2)
    adv, _ = A.advantage("opmd", opmd_baseline="logavgexp")(rewards=rewards, mask=mask, group_ids=gid)
    assert _rows(adv, mask) == pytest.approx([1 - baseline, -baseline])
    with pytest.raises(ValueError, match="logavgexp"):
        A.advantage("opmd", opmd_baseline="max")(rewards=rewards, mask=mask, group_ids=gid)


def test_reinforce_plus_plus_whitens_returns_by_hand() -> None:
    rewards, mask = torch.tensor([1.0, 0.0]), _mask(2, 1, seq=2)
    adv, returns = A.advantage("reinforceplusplus")(rewards=rewards, mask=mask)
    # gamma 1: returns row0 [1, 1], row1 [0]; valid mean 2/3, unbiased var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3
    std = math.sqrt(1 / 3)
    assert returns.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert adv.flatten().tolist() == pytest.approx([(1 / 3) / std, (1 / 3) / std, (-2 / 3) / std, 0.0], abs=1e-6)
    # gamma .5: returns row0 [.5, 1], row1 [0]: mean .5, var (0 + .25 + .25) / 2 = .25 -> [0, 1], [-1]
    adv, _ = A.advantage("reinforceplusplus", gamma=0.5)(rewards=rewards, mask=mask)
    assert adv.flatten().tolist() == pytest.approx([0.0, 1.0, -1.0, 0.0], abs=1e-6)


def test_gae_by_hand_gamma_lam_one_gives_monte_carlo_returns() -> None:
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = _mask(3)
    adv, returns = A.advantage("gae", whiten=False)(rewards=torch.tensor([1.0]), mask=mask, values=values)
    # reward 1 on the last token. t2: delta = 1 - .7 = .3
    # t1: delta = .7 - .6 = .1 -> A = .1 + .3 = .4; t0: delta = .6 - .5 = .1 -> A = .5
    assert adv[0].tolist() == pytest.approx([0.5, 0.4, 0.3])
    assert returns[0].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_gae_by_hand_with_discount() -> None:
    values = torch.tensor([[0.5, 0.6, 0.7]])
    fn = A.advantage("ppo", gamma=0.5, lam=0.5, whiten=False)
    adv, returns = fn(rewards=torch.tensor([1.0]), mask=_mask(3), values=values)
    # t2: .3; t1: delta = .5 * .7 - .6 = -.25, A = -.25 + .25 * .3 = -.175
    # t0: delta = .5 * .6 - .5 = -.2, A = -.2 + .25 * -.175 = -.24375; returns = A + V
    assert adv[0].tolist() == pytest.approx([-0.24375, -0.175, 0.3])
    assert returns[0].tolist() == pytest.approx([0.25625, 0.425, 1.0])


def test_gae_skips_masked_tokens_inside_a_row_and_whitens() -> None:
    values = torch.tensor([[0.5, 99.0, 0.7]])
    mask = torch.tensor([[True, False, True]])
    adv, _ = A.advantage("gae", whiten=False)(rewards=torch.tensor([1.0]), mask=mask, values=values)
    # t2: .3; t1 is skipped (its value 99 never read); t0: delta = .7 - .5 = .2 -> .5
    assert adv[0].tolist() == pytest.approx([0.5, 0.0, 0.3])
    adv, _ = A.advantage("gae")(rewards=torch.tensor([1.0]), mask=_mask(3), values=torch.tensor([[0.5, 0.6, 0.7]]))
    # default whitening of [.5, .4, .3]: mean .4, unbiased std .1
    assert adv[0].tolist() == pytest.approx([1.0, 0.0, -1.0], abs=1e-5)


def test_on_policy_distill_by_hand() -> None:
    teacher = torch.tensor([[-1.0, -2.0, -5.0]])
    old = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = _mask(2)
    adv, returns = A.advantage("on_policy_distill")(mask=mask, old_logprobs=old, teacher_logprobs=teacher)
    # teacher - student: .5, -1; masked token 0
    assert adv[0].tolist() == pytest.approx([0.5, -1.0, 0.0])
    assert returns is None
    adv, _ = A.advantage("on_policy_distill", kl_coef=2.0, reward_to_go=True)(
        mask=mask, old_logprobs=old, teacher_logprobs=teacher
    )
    # x2 -> 1, -2; reward-to-go: 1 + (-2) = -1, -2
    assert adv[0].tolist() == pytest.approx([-1.0, -2.0, 0.0])


def test_jsd_by_hand() -> None:
    teacher = torch.tensor([[math.log(0.5), math.log(0.3)]])
    student = torch.tensor([[math.log(0.25), math.log(0.3)]])
    adv, _ = A.advantage("jsd")(mask=_mask(2, seq=2), old_logprobs=student, teacher_logprobs=teacher)
    # P=.5, Q=.25, M=.375: .5 * .5 ln(.5/.375) + .5 * .25 ln(.25/.375) = .0719205 - .0506831 = .0212374
    # identical distributions (token 1): 0
    expected = 0.25 * math.log(0.5 / 0.375) + 0.125 * math.log(0.25 / 0.375)
    assert adv[0].tolist() == pytest.approx([-expected, 0.0], abs=1e-7)


GIGPO_INPUTS = dict(
    # task 0, two episodes of two steps: A = rows 0, 1 (return 1); B = rows 2, 3 (return 0).
    # rows 0 and 2 start from the same state (anchor 0); rows 1 and 3 from unseen states (singletons).
    rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]),
    group_ids=torch.tensor([0, 0, 0, 0]),
    episode_ids=torch.tensor([10, 10, 11, 11]),
    step_group_ids=torch.tensor([0, 1, 0, 2]),
    step_rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]),
    mask=_mask(3, 2, 3, 1),
)


def test_gigpo_episode_plus_anchor_step_advantages_by_hand() -> None:
    adv, _ = A.advantage("gigpo")(**GIGPO_INPUTS)
    # A_E = +-.5 / (1 + eps) (fnorm none); A_S: anchor 0 {1, 0} -> +-.5, singletons -> 0
    a = 0.5 / (1 + EPS)
    assert _rows(adv, GIGPO_INPUTS["mask"]) == pytest.approx([a + a, a, -a - a, -a])
    adv, _ = A.advantage("gigpo", omega=0.5, fnorm="std")(**GIGPO_INPUTS)
    # std of {1, 0} = sqrt(.5): A_E = A_S = +-.5 / sqrt(.5) = +-.7071
    b = 0.5 / (SQRT_HALF + EPS)
    assert _rows(adv, GIGPO_INPUTS["mask"]) == pytest.approx([b + 0.5 * b, b, -b - 0.5 * b, -b])


def test_gigpo_counts_each_episode_once() -> None:
    # episode A has three steps, B one: the group mean is (1 + 0) / 2, not (1 + 1 + 1 + 0) / 4
    mask = _mask(1, 1, 1, 1)
    adv, _ = A.advantage("gigpo")(
        rewards=torch.tensor([1.0, 1.0, 1.0, 0.0]),
        group_ids=torch.zeros(4, dtype=torch.long),
        episode_ids=torch.tensor([0, 0, 0, 1]),
        mask=mask,
    )
    a = 0.5 / (1 + EPS)
    assert _rows(adv, mask) == pytest.approx([a, a, a, -a])


def test_gigpo_rejects_unknown_fnorm() -> None:
    with pytest.raises(ValueError, match="fnorm"):
        A.advantage("gigpo", fnorm="minmax")(**GIGPO_INPUTS)


def test_advantages_reject_misshaped_inputs() -> None:
    with pytest.raises(ValueError, match="rewards must be"):
        A.advantage("grpo")(rewards=torch.zeros(3), mask=_mask(1, 1), group_ids=torch.zeros(2, dtype=torch.long))


def test_outcome_token_rewards_and_group_stats_helpers() -> None:
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    out = A.outcome_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask)
    assert out.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0]]
    mean, std, count = A.group_stats(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([4, 4, 2]))
    assert mean.tolist() == [2.0, 2.0, 5.0]
    assert std.tolist() == pytest.approx([math.sqrt(2), math.sqrt(2), 0.0])
    assert count.tolist() == [2.0, 2.0, 1.0]
