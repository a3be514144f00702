import math

import pytest
import torch

from trinity import algorithms as A

LN2 = math.log(2.0)
# Token 0: pi = 0.5, pi_ref = 0.25 -> d = log pi - log pi_ref = ln 2.  Token 1: the reverse, d = -ln 2.
LOGPROBS = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=torch.float64)
REF = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("k1", [LN2, -LN2]),  # d
        ("k2", [0.5 * LN2**2, 0.5 * LN2**2]),  # d^2 / 2 = 0.240227
        ("k3", [0.5 + LN2 - 1, 2 - LN2 - 1]),  # exp(-d) + d - 1 = 0.193147, 0.306853
        ("low_var_kl", [0.5 + LN2 - 1, 2 - LN2 - 1]),  # k3, inside the clamp
        ("abs", [LN2, LN2]),
        ("none", [0.0, 0.0]),
    ],
)
def test_kl_estimators_by_hand(name: str, expected: list[float]) -> None:
    out = A.kl(name)(LOGPROBS, REF)
    assert out.shape == (1, 2)
    assert out[0].tolist() == pytest.approx(expected)
    # keyword call works the same
    assert torch.equal(A.kl(name)(logprobs=LOGPROBS, ref_logprobs=REF), out)


def test_low_var_kl_is_clamped_like_verl() -> None:
    lp, ref = torch.tensor([[0.0]]), torch.tensor([[-30.0]])
    # k3 = exp(-30) + 30 - 1 ~ 29, unclamped
    assert A.kl("k3")(lp, ref).item() == pytest.approx(29.0)
    # low_var_kl: -d clamped to -20 gives ~19, then the result to 10
    assert A.kl("low_var_kl")(lp, ref).item() == pytest.approx(10.0)
    assert A.kl("low_var_kl", clamp=15.0)(lp, ref).item() == pytest.approx(15.0)


def test_kl_estimators_pass_gradient() -> None:
    lp = LOGPROBS.clone().requires_grad_(True)
    A.kl("k3")(lp, REF).sum().backward()
    # d/dlp [exp(ref - lp) - (ref - lp) - 1] = 1 - exp(ref - lp) = 1 - 0.5, 1 - 2
    assert lp.grad[0].tolist() == pytest.approx([0.5, -1.0])


def test_kl_loss_term_by_hand() -> None:
    mask = torch.tensor([[True, False]])
    loss, metrics = A.kl_loss(logprobs=LOGPROBS, ref_logprobs=REF, mask=mask, estimator="k1", coef=0.5)
    # only token 0: k1 = ln 2, times 0.5
    assert loss.item() == pytest.approx(0.5 * LN2)
    assert metrics["kl"] == pytest.approx(LN2)


def test_kl_reward_penalty_by_hand() -> None:
    rewards = torch.tensor([[0.0, 1.0, 7.0]])
    lp = torch.tensor([[0.2, 0.4, 5.0]])
    ref = torch.zeros(1, 3)
    mask = torch.tensor([[True, True, False]])
    out, metrics = A.apply_kl_penalty(token_rewards=rewards, logprobs=lp, ref_logprobs=ref, mask=mask, coef=0.5)
    # r - 0.5 * k1: 0 - 0.1, 1 - 0.2; the masked token keeps its reward
    assert out[0].tolist() == pytest.approx([-0.1, 0.8, 7.0])
    assert metrics["kl"] == pytest.approx(0.3)  # mean of 0.2, 0.4


def test_adaptive_kl_controller_by_hand() -> None:
    ctl = A.kl_controller("adaptive", kl_coef=0.1, target_kl=0.01, horizon=100)
    # kl 0.02: error clip(2 - 1) = 0.2 -> x (1 + 0.2 * 10 / 100) = 0.102
    ctl.update(0.02, n_steps=10)
    assert ctl.value == pytest.approx(0.102)
    # kl 0: error clip(-1) = -0.2 -> x 0.98
    ctl.update(0.0, n_steps=10)
    assert ctl.value == pytest.approx(0.102 * 0.98)


def test_fixed_kl_controller_never_moves() -> None:
    ctl = A.kl_controller("fixed", kl_coef=0.05)
    ctl.update(10.0, n_steps=1000)
    assert ctl.value == 0.05


def test_kl_controller_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="adaptive, fixed"):
        A.kl_controller("pid")
    with pytest.raises(ValueError, match="target_kl"):
        A.AdaptiveKLController(0.1, target_kl=0.0, horizon=10)
