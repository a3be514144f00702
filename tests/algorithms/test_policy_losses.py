import math
from typing import Any

import pytest
import torch

from trinity import algorithms as A

LN = math.log
ONES2 = torch.ones(1, 2, dtype=torch.bool)


def _leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def _t(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _assert_grad(leaf: torch.Tensor, expected: list[list[float]]) -> None:
    assert leaf.grad is not None
    torch.testing.assert_close(leaf.grad, _t(expected), rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------------------------------------ PPO
def test_ppo_dual_clip_by_hand() -> None:
    # old = 0, so ratio = exp(logprobs). Third row: fully masked garbage that must not count.
    lp = _leaf([[LN(1.5), LN(0.5)], [LN(0.5), LN(5.0)], [30.0, -30.0]])
    adv = _t([[1.0, 1.0], [-1.0, -1.0], [5.0, 5.0]])
    mask = torch.tensor([[True, True], [True, True], [False, False]])
    loss, m = A.policy_loss("ppo")(logprobs=lp, old_logprobs=torch.zeros(3, 2), advantages=adv, mask=mask)
    # t0: r 1.5, A+1: max(-1.5, -1.2) = -1.2 (clipped)   t1: r .5, A+1: max(-.5, -.8) = -.5
    # t2: r .5, A-1: max(.5, .8) = .8 (clipped), dual min(.8, 3) = .8
    # t3: r 5, A-1: max(5, 1.2) = 5, dual min(5, 3) = 3 (lower clip)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 3.0) / 4)
    assert m["pg_clipfrac"] == pytest.approx(0.5)  # t0, t2
    assert m["pg_clipfrac_lower"] == pytest.approx(0.25)  # t3
    assert m["ppo_kl"] == pytest.approx(-(LN(1.5) + 2 * LN(0.5) + LN(5.0)) / 4)
    loss.backward()
    # only t1 is unclipped: d(-A r)/d lp = -A r = -.5, / 4 tokens
    _assert_grad(lp, [[0.0, -0.125], [0.0, 0.0], [0.0, 0.0]])


def test_ppo_clip_higher_override_like_dapo() -> None:
    lp = _t([[LN(1.25)]])
    args = dict(logprobs=lp, old_logprobs=torch.zeros(1, 1), advantages=_t([[1.0]]), mask=torch.ones(1, 1))
    # r 1.25 > 1.2: clipped to -1.2 by default, but inside 1 + .28
    assert A.policy_loss("ppo")(**args)[0].item() == pytest.approx(-1.2)
    assert A.policy_loss("ppo", clip_range_low=0.2, clip_range_high=0.28)(**args)[0].item() == pytest.approx(-1.25)


def test_ppo_rejects_dual_clip_ratio_below_one() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c"):
        A.policy_loss("ppo", clip_ratio_c=0.9)(
            logprobs=_t([[0.0]]), old_logprobs=_t([[0.0]]), advantages=_t([[1.0]]), mask=torch.ones(1, 1)
        )


# ----------------------------------------------------------------------------------------------- GSPO
def test_gspo_sequence_ratio_by_hand() -> None:
    lp = _leaf([[0.1, 0.3, 0.0], [1e-4, 1e-4, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    adv = _t([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    loss, m = A.policy_loss("gspo")(logprobs=lp, old_logprobs=torch.zeros(2, 3), advantages=adv, mask=mask)
    # row0: s = exp(mean(.1, .3)) = e^.2 = 1.2214 > 1 + 4e-4, A+1 -> max(-1.2214, -1.0004) = -1.0004 (clipped)
    # row1: s = e^1e-4 = 1.0001 inside [1 - 3e-4, 1 + 4e-4], A-1 -> 1.0001
    # seq-mean-token-mean: (-1.0004 + 1.0001) / 2
    assert loss.item() == pytest.approx((-1.0004 + math.exp(1e-4)) / 2)
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # row1 token grad: -A * s = 1.0001, / 2 tokens / 2 rows; row0 clipped -> 0
    g = math.exp(1e-4) / 4
    _assert_grad(lp, [[0.0, 0.0, 0.0], [g, g, 0.0]])


def test_gspo_on_policy_is_minus_mean_sequence_advantage() -> None:
    lp = _leaf([[-1.0, -2.0, -3.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    adv = _t([[2.0, 2.0, 2.0], [-1.0, 0.0, 0.0]])
    loss, _ = A.policy_loss("gspo")(logprobs=lp, old_logprobs=lp.detach(), advantages=adv, mask=mask)
    # s = 1: row losses -2 and 1 -> mean -.5
    assert loss.item() == pytest.approx(-0.5)


# ---------------------------------------------------------------------------------------------- CISPO
def test_cispo_by_hand() -> None:
    lp = _leaf([[-1.0, -2.0]])
    old = _t([[-1.0 - LN(1.5), -2.0 - LN(0.5)]])  # ratios 1.5 and .5
    loss, m = A.policy_loss("cispo")(logprobs=lp, old_logprobs=old, advantages=_t([[1.0, -1.0]]), mask=ONES2)
    # weights: clip(1.5, 0, 1.28) = 1.28; clip(.5) = .5.  t0: -1 * 1.28 * -1 = 1.28; t1: 1 * .5 * -2 = -1
    assert loss.item() == pytest.approx((1.28 - 1.0) / 2)
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # grad -A * w / 2: -.64, +.25 (the clipped token still learns, unlike PPO)
    _assert_grad(lp, [[-0.64, 0.25]])


# ----------------------------------------------------------------------------------------------- SAPO
def test_sapo_on_policy_by_hand() -> None:
    lp = _leaf([[-1.0, -2.0]])
    loss, _ = A.policy_loss("sapo")(logprobs=lp, old_logprobs=lp.detach(), advantages=_t([[1.0, -1.0]]), mask=ONES2)
    # r = 1: gate = sigmoid(0) * 4 / tau = 2 / tau.  A+1 (tau 1): -2; A-1 (tau 1.05): +2 / 1.05
    assert loss.item() == pytest.approx((-2.0 + 2.0 / 1.05) / 2)
    loss.backward()
    # d gate / d lp = 4 sigma (1 - sigma) * r = 1 at r = 1: the plain policy gradient -A / 2
    _assert_grad(lp, [[-0.5, 0.5]])


def test_sapo_off_policy_gate_by_hand() -> None:
    lp = _leaf([[1.0]])  # r = e
    loss, m = A.policy_loss("sapo")(
        logprobs=lp, old_logprobs=_t([[0.0]]), advantages=_t([[1.0]]), mask=torch.ones(1, 1)
    )
    sig = 1.0 / (1.0 + math.exp(-(math.e - 1.0)))
    assert loss.item() == pytest.approx(-4.0 * sig)
    loss.backward()
    # -A * 4 sigma (1 - sigma) * r: the gate shrinks the gradient as r leaves 1
    assert lp.grad.item() == pytest.approx(-4.0 * sig * (1 - sig) * math.e)
    assert m["sapo_gate_mean"] == pytest.approx(4.0 * sig)


# ----------------------------------------------------------------------------------------------- sPPO
def test_sppo_by_hand() -> None:
    lp = _leaf([[0.1, 0.5]])
    loss, m = A.policy_loss("sppo")(
        logprobs=lp, old_logprobs=torch.zeros(1, 2), advantages=_t([[2.0, 2.0]]), mask=ONES2
    )
    # eps .3: ratio range [1/1.3, 1.3]. t0 r = e^.1 inside: -2 * .1; t1 r = e^.5 = 1.65 outside: 0
    assert loss.item() == pytest.approx(-0.1)
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    _assert_grad(lp, [[-1.0, 0.0]])


# ----------------------------------------------------------------------------------------------- TOPR
def test_topr_by_hand() -> None:
    lp = _leaf([[-1.0, -2.0, -1.0]])
    old = _t([[-1.0, -2.0 - LN(0.5), -1.0 - LN(2.0)]])  # ratios 1, .5, 2
    adv = _t([[1.0, -1.0, -1.0]])
    loss, _ = A.policy_loss("topr")(logprobs=lp, old_logprobs=old, advantages=adv, mask=torch.ones(1, 3))
    # alpha: A > 0 -> 1; A <= 0 -> clip(r, 0, 1) = .5, 1.  -alpha A lp: 1, -1, -1
    assert loss.item() == pytest.approx(-1 / 3)
    loss.backward()
    _assert_grad(lp, [[-1 / 3, 0.5 / 3, 1 / 3]])


# ----------------------------------------------------------------------------------------- OPMD / REC
def test_opmd_by_hand() -> None:
    lp = _leaf([[-1.0, -2.0]])
    loss, _ = A.policy_loss("opmd")(logprobs=lp, advantages=_t([[1.0, -1.0]]), mask=ONES2)
    # -A lp = 1, -2 -> mean -.5, / (1 + tau=1)
    assert loss.item() == pytest.approx(-0.25)


def test_rec_modes_by_hand() -> None:
    lp = _t([[-1.0, -2.0]])
    old = _t([[-1.0 - LN(1.5), -2.0 - LN(0.9)]])  # ratios 1.5, .9
    args = dict(logprobs=lp, old_logprobs=old, advantages=_t([[1.0, -1.0]]), mask=ONES2)
    # none: -A lp = 1, -2 -> -.5
    assert A.policy_loss("rec")(**args)[0].item() == pytest.approx(-0.5)
    # two-side [.8, 1.2]: t0 (1.5) dropped -> (0 - 2) / 2
    assert A.policy_loss("rec", clip_mode="two-side")(**args)[0].item() == pytest.approx(-1.0)
    # importance sampling: 1.5 * 1 = 1.5; .9 * -2 = -1.8 -> -.15
    assert A.policy_loss("rec", weight="importance_sampling")(**args)[0].item() == pytest.approx(-0.15)
    # k2 regularizer: + .5 * (log r)^2 per token
    reg = 0.5 * (LN(1.5) ** 2 + LN(0.9) ** 2) / 2
    assert A.policy_loss("rec", regularizer="k2", regularizer_coef=0.5)(**args)[0].item() == pytest.approx(-0.5 + reg)
    with pytest.raises(ValueError, match="clip_mode"):
        A.policy_loss("rec", clip_mode="sideways")(**args)


# ------------------------------------------------------------------------------------------------ SFT
def test_sft_and_phi_weighted_sft_by_hand() -> None:
    lp = _t([[-1.0, -2.0], [-3.0, 99.0]])
    mask = torch.tensor([[True, True], [True, False]])
    assert A.policy_loss("sft")(logprobs=lp, mask=mask)[0].item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    # phi = p (1 - p), p = e^lp
    phi = [math.exp(x) * (1 - math.exp(x)) for x in (-1.0, -2.0, -3.0)]
    expected = (phi[0] * 1 + phi[1] * 2 + phi[2] * 3) / 3
    assert A.policy_loss("sft_phi")(logprobs=lp, mask=mask)[0].item() == pytest.approx(expected)


# ------------------------------------------------------------------------------------------------ DPO
DPO_MASK = torch.tensor([[True, True], [True, True]])
DPO_REF = _t([[-1.5, -1.5], [-1.5, -1.5]])  # sums -3, -3


def test_dpo_by_hand_chosen_first() -> None:
    lp = _leaf([[-1.0, -1.0], [-2.0, -2.0]])  # chosen sum -2, rejected sum -4
    loss, m = A.policy_loss("dpo")(logprobs=lp, ref_logprobs=DPO_REF, mask=DPO_MASK)
    # h = (-2 + 3) - (-4 + 3) = 2; loss = -log sigmoid(.1 * 2) = log(1 + e^-.2) = .598139
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.2)))
    assert m["chosen_reward"] == pytest.approx(0.1)
    assert m["rejected_reward"] == pytest.approx(-0.1)
    assert m["accuracy"] == 1.0
    loss.backward()
    # dL/dh = -beta sigmoid(-beta h) = -.1 * sigmoid(-.2); each chosen token +1 in h, each rejected -1
    g = 0.1 / (1 + math.exp(0.2))
    _assert_grad(lp, [[-g, -g], [g, g]])


def test_dpo_pair_order_matters() -> None:
    # same rows with the rejected one first: h = -2, loss log(1 + e^.2), accuracy 0
    lp = _t([[-2.0, -2.0], [-1.0, -1.0]])
    loss, m = A.policy_loss("dpo")(logprobs=lp, ref_logprobs=DPO_REF, mask=DPO_MASK)
    assert loss.item() == pytest.approx(math.log1p(math.exp(0.2)))
    assert m["accuracy"] == 0.0


def test_dpo_pairs_are_adjacent_rows_and_sums_respect_the_mask() -> None:
    # pairs (0, 1) and (2, 3); masked tokens (value 50) must not enter the sums
    lp = _t([[-1.0, 50.0], [-2.0, 50.0], [-3.0, -3.0], [-1.0, -1.0]])
    ref = torch.zeros(4, 2, dtype=torch.float64)
    mask = torch.tensor([[True, False], [True, False], [True, True], [True, True]])
    loss, m = A.policy_loss("dpo", beta=1.0)(logprobs=lp, ref_logprobs=ref, mask=mask)
    # pair 0: h = -1 - (-2) = 1; pair 1: h = -6 - (-2) = -4
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(4.0))) / 2
    assert loss.item() == pytest.approx(expected)
    assert m["accuracy"] == 0.5


def test_dpo_rejects_odd_batch() -> None:
    with pytest.raises(ValueError, match="pairs"):
        A.policy_loss("dpo")(logprobs=_t([[0.0]]), ref_logprobs=_t([[0.0]]), mask=torch.ones(1, 1))


# ---------------------------------------------------------------------------------------------- CHORD
def test_chord_mu_schedule_by_hand() -> None:
    kw = dict(warmup_steps=10, decay_steps=10, peak=0.5, valley=0.1)
    assert A.chord_mu_schedule(5, **kw) == pytest.approx(0.25)  # warmup 5/10 * .5
    assert A.chord_mu_schedule(10, **kw) == pytest.approx(0.5)  # peak
    assert A.chord_mu_schedule(15, **kw) == pytest.approx(0.3)  # .1 + .4 * (1 + cos(pi/2)) / 2
    assert A.chord_mu_schedule(25, **kw) == pytest.approx(0.1)  # valley
    assert A.chord_mu_schedule(0, 0, 0, 0.1, 0.1) == pytest.approx(0.1)  # Trinity default: constant .1


def test_mix_chord_by_hand() -> None:
    lp = _leaf([[-1.0, -1.0], [-1.0, -1.0]])
    inputs = dict(
        logprobs=lp,
        old_logprobs=lp.detach(),
        advantages=_t([[1.0, 1.0], [0.0, 0.0]]),
        mask=DPO_MASK,
        expert_mask=torch.tensor([False, True]),
    )
    loss, m = A.policy_loss("mix_chord")(**inputs)
    # rollout row on-policy: PPO = -A = -1; expert row phi-SFT: p = e^-1, phi * 1 = .232544; mu = .1
    phi = math.exp(-1) * (1 - math.exp(-1))
    assert loss.item() == pytest.approx(0.9 * -1.0 + 0.1 * phi)
    assert m["mu"] == pytest.approx(0.1)
    plain, _ = A.policy_loss("mix_chord", enable_phi_function=False)(**inputs)
    assert plain.item() == pytest.approx(0.9 * -1.0 + 0.1 * 1.0)
    scheduled, m = A.policy_loss("mix_chord", mu_warmup_steps=10, mu_peak=0.5)(**inputs, step=5)
    assert m["mu"] == pytest.approx(0.25)
    assert scheduled.item() == pytest.approx(0.75 * -1.0 + 0.25 * phi)


def test_mix_chord_with_only_expert_rows_still_backpropagates() -> None:
    lp = _leaf([[-1.0, -1.0]])
    loss, _ = A.policy_loss("mix_chord", mu_peak=1.0, mu_valley=1.0, enable_phi_function=False)(
        logprobs=lp,
        old_logprobs=lp.detach(),
        advantages=_t([[0.0, 0.0]]),
        mask=ONES2,
        expert_mask=torch.tensor([True]),
    )
    loss.backward()
    assert loss.item() == pytest.approx(1.0)
    _assert_grad(lp, [[-0.5, -0.5]])


# ------------------------------------------------------------------------------------- every loss: shared
def _generic_inputs() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    lp = (-torch.rand(4, 3, dtype=torch.float64) - 0.1).requires_grad_(True)
    mask = torch.tensor([[True, True, True], [True, True, False], [True, False, False], [False, False, False]])
    return dict(
        logprobs=lp,
        old_logprobs=lp.detach().clone(),
        ref_logprobs=lp.detach() - 0.3,
        advantages=torch.tensor([[1.0] * 3, [-1.0] * 3, [0.5] * 3, [0.0] * 3], dtype=torch.float64),
        mask=mask,
        expert_mask=torch.tensor([False, True, False, True]),
    )


ALL_LOSSES = A.available()["policy_losses"]


def _call(fn: A.BoundFn, inputs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
    """`fn` on the inputs it reads out of `inputs` (as the trainer calls it)."""
    return fn(**fn.given(inputs))  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ALL_LOSSES)
def test_every_loss_returns_scalar_float_metrics_and_gradient(name: str) -> None:
    inputs = _generic_inputs()
    loss, metrics = _call(A.policy_loss(name), inputs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert metrics and all(isinstance(v, float) for v in metrics.values())
    loss.backward()
    grad = inputs["logprobs"].grad
    assert grad is not None and torch.isfinite(grad).all()
    assert grad.abs().sum() > 0
    # the fully masked last row receives no gradient (DPO pairs rows 2/3, so skip its row-3 check)
    if name != "dpo":
        assert torch.all(grad[3] == 0)


@pytest.mark.parametrize("name", ALL_LOSSES)
def test_every_loss_survives_an_all_masked_batch(name: str) -> None:
    inputs = _generic_inputs()
    inputs["mask"] = torch.zeros(4, 3, dtype=torch.bool)
    loss, _ = _call(A.policy_loss(name), inputs)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(inputs["logprobs"].grad).all()


@pytest.mark.parametrize("name", [n for n in ALL_LOSSES if "loss_agg_mode" in A.POLICY_LOSSES.defaults(n)])
@pytest.mark.parametrize("mode", A.LOSS_AGG_MODES)
def test_every_loss_accepts_every_aggregation_mode(name: str, mode: str) -> None:
    loss, _ = _call(A.policy_loss(name, loss_agg_mode=mode), _generic_inputs())
    assert torch.isfinite(loss)


def test_norm_constant_reaches_seq_mean_token_sum_norm() -> None:
    lp = _t([[-1.0, -2.0], [-3.0, 99.0]])
    mask = torch.tensor([[True, True], [True, False]])
    # sum of -lp over valid tokens = 6; divided by the padded length 2, or by a fixed constant 12 (Dr. GRPO)
    assert A.policy_loss("sft", loss_agg_mode="seq-mean-token-sum-norm")(logprobs=lp, mask=mask)[0].item() == 3.0
    fixed = A.policy_loss("sft", loss_agg_mode="seq-mean-token-sum-norm", norm_constant=12.0)
    assert fixed(logprobs=lp, mask=mask)[0].item() == pytest.approx(0.5)


def test_every_aggregating_function_exposes_norm_constant() -> None:
    for registry in (A.POLICY_LOSSES, A.ENTROPY_TERMS, A.VALUE_LOSSES):
        for name in registry.names():
            defaults = registry.defaults(name)
            if "loss_agg_mode" in defaults:
                assert defaults["norm_constant"] is None, name
