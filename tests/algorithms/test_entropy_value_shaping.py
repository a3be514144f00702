import math

import pytest
import torch

from trinity import algorithms as A

ENT = torch.tensor([[1.0, 2.0], [3.0, 9.0]])
MASK = torch.tensor([[True, True], [True, False]])


def test_default_entropy_bonus_by_hand() -> None:
    loss, metrics = A.entropy("default", entropy_coef=0.1)(entropies=ENT, mask=MASK)
    # token-mean of 1, 2, 3 = 2; bonus -> loss -0.1 * 2
    assert loss.item() == pytest.approx(-0.2)
    assert metrics["entropy"] == pytest.approx(2.0)


def test_entropy_from_uniform_logits_is_log_vocab() -> None:
    logits = torch.zeros(1, 2, 4, requires_grad=True)
    loss, metrics = A.entropy("default", entropy_coef=1.0)(logits=logits, mask=torch.ones(1, 2, dtype=torch.bool))
    assert metrics["entropy"] == pytest.approx(math.log(4))
    loss.backward()
    assert torch.isfinite(logits.grad).all()


def test_mix_entropy_skips_expert_rows() -> None:
    loss, metrics = A.entropy("mix", entropy_coef=0.1)(
        entropies=ENT, mask=MASK, expert_mask=torch.tensor([False, True])
    )
    # only row 0: mean(1, 2) = 1.5
    assert metrics["entropy"] == pytest.approx(1.5)
    assert loss.item() == pytest.approx(-0.15)


def test_none_entropy_is_zero_and_entropy_needs_an_input() -> None:
    assert A.entropy("none")(mask=MASK)[0].item() == 0.0
    with pytest.raises(TypeError, match="entropies"):
        A.entropy("default")(mask=MASK)


def test_clipped_value_loss_by_hand() -> None:
    values = torch.tensor([[1.0, 1.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    returns = torch.tensor([[0.0, 2.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = A.value_loss("clipped")(values=values, old_values=old, returns=returns, mask=mask)
    # V clipped to old +- 0.5 = 0.5.  token0: max((1-0)^2, (0.5-0)^2) = 1
    # token1: max((1-2)^2, (0.5-2)^2) = 2.25
    # 0.5 * mean(1, 2.25) = 0.8125; clipped side chosen on token1 only
    assert loss.item() == pytest.approx(0.8125)
    assert metrics["vf_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # token0 grad: 0.5 * 2 (1 - 0) / 2 tokens = 0.5; token1 uses the clipped value, whose grad is 0
    assert values.grad[0].tolist() == pytest.approx([0.5, 0.0])


def test_mse_value_loss_by_hand() -> None:
    loss, _ = A.value_loss("mse")(
        values=torch.tensor([[1.0, 3.0]]),
        returns=torch.tensor([[0.0, 1.0]]),
        mask=torch.ones(1, 2, dtype=torch.bool),
    )
    assert loss.item() == pytest.approx(0.5 * (1 + 4) / 2)


def test_overlong_reward_penalty_by_hand() -> None:
    lengths = torch.tensor([5, 6, 8, 10, 12])
    # L_max 10, cache 4: free up to 6, linear to -1 at 10, -1 beyond: (6 - 8) / 4 = -0.5
    out = A.overlong_reward_penalty(lengths, max_response_length=10, cache_length=4)
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    doubled = A.overlong_reward_penalty(lengths, max_response_length=10, cache_length=4, penalty_factor=2.0)
    assert doubled.tolist() == pytest.approx([0.0, 0.0, -1.0, -2.0, -2.0])
    with pytest.raises(ValueError):
        A.overlong_reward_penalty(lengths, max_response_length=10, cache_length=0)
