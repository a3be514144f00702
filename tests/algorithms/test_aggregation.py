import math

import pytest
import torch

from trinity import algorithms as A

# loss = [[1, 2, 3], [4, 5, 6]], valid tokens: row0 {1, 2}, row1 {4}
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False], [True, False, False]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-mean", 2.75),  # (mean(1, 2) + mean(4)) / 2 = (1.5 + 4) / 2
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 3),  # (3 + 4) / seq=3
    ],
)
def test_each_aggregation_mode_by_hand(mode: str, expected: float) -> None:
    assert A.agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_seq_mean_token_sum_norm_uses_the_given_constant() -> None:
    assert A.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_constant=7.0).item() == pytest.approx(1.0)


@pytest.mark.parametrize("mode", A.LOSS_AGG_MODES)
def test_fully_masked_row_with_nan_contributes_nothing(mode: str) -> None:
    loss = torch.cat([LOSS, torch.full((1, 3), float("nan"), dtype=torch.float64)])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.bool)])
    # seq-mean-token-sum-norm divides by the (unchanged) padded length, the others ignore the empty row
    assert A.agg_loss(loss, mask, mode).item() == pytest.approx(A.agg_loss(LOSS, MASK, mode).item())


@pytest.mark.parametrize("mode", A.LOSS_AGG_MODES)
def test_all_masked_batch_gives_zero_and_finite_gradient(mode: str) -> None:
    loss = torch.ones(2, 3, requires_grad=True)
    out = A.agg_loss(loss, torch.zeros(2, 3, dtype=torch.bool), mode)
    out.backward()
    assert out.item() == 0.0
    assert torch.equal(loss.grad, torch.zeros(2, 3))


def test_unknown_mode_lists_known_modes() -> None:
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        A.agg_loss(LOSS, MASK, "sum")


def test_masked_mean_and_sum_per_row() -> None:
    assert A.masked_sum(LOSS, MASK, dim=-1).tolist() == [3.0, 4.0]
    assert A.masked_mean(LOSS, MASK, dim=-1).tolist() == [1.5, 4.0]
    # an empty row has mean 0, not NaN
    assert A.masked_mean(LOSS, torch.zeros_like(MASK), dim=-1).tolist() == [0.0, 0.0]


def test_masked_whiten_by_hand() -> None:
    # valid values 1, 2, 3: mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> (x - 2) / 1
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    out = A.masked_whiten(values, mask)
    assert out[0].tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0], abs=1e-6)
    assert A.masked_var(values, mask).item() == pytest.approx(1.0)
    assert A.masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 3)


def test_masked_whiten_of_constant_or_single_value_is_zero() -> None:
    assert A.masked_whiten(torch.full((1, 3), 5.0), torch.ones(1, 3, dtype=torch.bool)).tolist() == [[0.0] * 3]
    single = A.masked_whiten(torch.tensor([[5.0, 9.0]]), torch.tensor([[True, False]]))
    assert not math.isnan(single.sum().item())
    assert single.tolist() == [[0.0, 0.0]]
