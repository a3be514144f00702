"""Per-token log-probs and entropy of response tokens, computed in sequence chunks.

A full `[batch, seq, vocab]` float32 log-softmax is the largest tensor of an RL step (49k vocab x 1k
tokens x 4 bytes = 200 MB per row, or per 64 rows of 16 tokens). Here the lm_head and log-softmax run on
`chunk_size` response positions at a time, counted over all rows together, and under autograd, when
there are several chunks, each is recomputed in backward (activation checkpointing), so only one
chunk's logits are alive at once in either direction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trinity.config import ExplorerConfig

Head = Callable[[torch.Tensor], torch.Tensor]


def _chunk_logprobs(
    head: Head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden `[b, c, h]`, targets `[b, c]` -> (log-prob of target `[b, c]`, entropy `[b, c]`)."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = F.log_softmax(logits, dim=-1)
    token_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return token_logp, torch.zeros_like(token_logp)
    if with_entropy == "detached":
        # A metric only: no graph through the [.., vocab] product, so backward skips it.
        with torch.no_grad():
            return token_logp, -(logp.exp() * logp).sum(-1)
    return token_logp, -(logp.exp() * logp).sum(-1)


def sampling_temperature(explorer: ExplorerConfig) -> float:
    """The temperature the rollouts were sampled at, which their log-probs are recomputed under (0, greedy: 1)."""
    return explorer.temperature or 1.0


def chunked_logprobs(
    head: Head,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int = 256,
    temperature: float = 1.0,
    with_entropy: bool | str = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of `targets` and the entropy of the predictive distribution, chunk by chunk.

    head: maps hidden states `[..., hidden]` to logits `[..., vocab]` (the model's lm_head);
    hidden: `[batch, resp, hidden]` hidden states at the positions that predict each target;
    targets: `[batch, resp]` token ids; with_entropy: True, False (zeros) or "detached" (no gradient).
    Returns two float32 tensors `[batch, resp]`.
    """
    if chunk_size <= 0:
        raise ValueError("chunk_size must be positive")
    # Chunks run over every row's positions together: a batch of 64 short responses is one `[64, resp]`
    # block, and chunking each row's positions alone would put all 64 rows' logits in every chunk.
    rows, width = targets.shape
    flat_hidden, flat_targets = hidden.reshape(1, rows * width, -1), targets.reshape(1, rows * width)
    # Recomputing a chunk in backward only saves memory when there are several chunks; a single chunk's
    # logits would be alive at once in backward anyway.
    recompute = torch.is_grad_enabled() and hidden.requires_grad and rows * width > chunk_size
    logps, ents = [], []
    for start in range(0, rows * width, chunk_size):
        h = flat_hidden[:, start : start + chunk_size]
        t = flat_targets[:, start : start + chunk_size]
        if recompute:
            lp, ent = checkpoint(_chunk_logprobs, head, h, t, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(head, h, t, temperature, with_entropy)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps, dim=1).view(rows, width), torch.cat(ents, dim=1).view(rows, width)


def gather_positions(hidden: torch.Tensor, index: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """hidden `[batch, seq, h]`, index `[n, resp]` -> `[n, resp, h]`: positions `index[i]` of row
    `rows[i]` (of row i when `rows` is None, and then n = batch)."""
    if rows is None:
        return hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    flat = rows.unsqueeze(1) * hidden.shape[1] + index
    return hidden.flatten(0, 1)[flat]


def naive_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference implementation: full float32 log-softmax over `[batch, seq, vocab]` logits."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)
