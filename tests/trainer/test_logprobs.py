from __future__ import annotations

import pytest
import torch

from trinity.trainer.logprobs import chunked_logprobs, naive_logprobs


def _setup(seed: int = 0) -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(16, 50, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 16, generator=g))
    hidden = torch.randn(3, 11, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (3, 11), generator=g)
    return head, hidden, targets


@pytest.mark.parametrize("chunk", [1, 3, 7, 11, 100])
def test_chunked_logprobs_and_entropy_equal_full_log_softmax(chunk: int) -> None:
    head, hidden, targets = _setup()
    lp, ent = chunked_logprobs(head, hidden, targets, chunk_size=chunk)
    ref_lp, ref_ent = naive_logprobs(head(hidden), targets)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-6, atol=1e-6)


def test_chunked_logprobs_gradients_equal_full_log_softmax() -> None:
    head, hidden, targets = _setup(1)
    weights = torch.randn(3, 11)
    lp, ent = chunked_logprobs(head, hidden, targets, chunk_size=4)
    ((lp * weights).sum() + ent.sum()).backward()
    g_hidden, g_head = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    ref_lp, ref_ent = naive_logprobs(head(hidden), targets)
    ((ref_lp * weights).sum() + ref_ent.sum()).backward()
    torch.testing.assert_close(g_hidden, hidden.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_head, head.weight.grad, rtol=1e-5, atol=1e-6)


def test_temperature_divides_logits() -> None:
    head, hidden, targets = _setup(2)
    lp, _ = chunked_logprobs(head, hidden.detach(), targets, chunk_size=5, temperature=0.5)
    ref_lp, _ = naive_logprobs(head(hidden.detach()) / 0.5, targets)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-6, atol=1e-6)


def test_uniform_logits_give_log_vocab_entropy() -> None:
    # Closed form: zero weights -> uniform over 50 tokens -> log-prob = entropy = log 50.
    head = torch.nn.Linear(4, 50, bias=False)
    torch.nn.init.zeros_(head.weight)
    lp, ent = chunked_logprobs(head, torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), chunk_size=2)
    expected = torch.full((2, 3), torch.log(torch.tensor(50.0)).item())
    torch.testing.assert_close(-lp, expected)
    torch.testing.assert_close(ent, expected)


@pytest.mark.parametrize("chunk", [4, 11, 12])
def test_a_chunk_holds_at_most_chunk_size_positions_over_all_rows(chunk: int) -> None:
    # The logits alive at once are one chunk's: a wide batch of short rows (64 x 16 in the quickstart)
    # must not put every row's positions into each chunk.
    head, hidden, targets = _setup(3)
    seen: list[int] = []

    def counting_head(h: torch.Tensor) -> torch.Tensor:
        seen.append(h.shape[:-1].numel())
        return head(h)

    lp, _ = chunked_logprobs(counting_head, hidden, targets, chunk_size=chunk)
    lp.sum().backward()  # the recomputed chunks in backward too
    assert seen and max(seen) <= chunk
    torch.testing.assert_close(lp, naive_logprobs(head(hidden), targets)[0], rtol=1e-6, atol=1e-6)
