"""Log-probs and entropy of target tokens from vocab-parallel logits (each TP rank holds a vocab slice).

The all-reduces are Megatron's `reduce_from_tensor_model_parallel_region` (sum forward, identity
backward): every TP rank computes the same loss from the reduced values, so the gradient of a rank's
partial sum is the gradient of the total. With TP=1 the reductions are no-ops and this is an ordinary
float32 log-softmax.
"""

from __future__ import annotations

import torch


def vocab_parallel_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits `[batch, resp, vocab/tp]` (this rank's slice), targets `[batch, resp]` global ids ->
    (log-prob of each target `[batch, resp]`, entropy `[batch, resp]`), float32, identical on all TP ranks."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as tp_sum

    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    local_vocab = z.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * local_vocab
    zmax = z.detach().amax(-1)
    if ps.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(
            zmax, op=torch.distributed.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group()
        )
    z = z - zmax.unsqueeze(-1)
    e = z.exp()
    sum_e = tp_sum(e.sum(-1))
    lse = sum_e.log()
    local_t = targets - start
    owned = (local_t >= 0) & (local_t < local_vocab)
    z_t = z.gather(-1, local_t.clamp(0, local_vocab - 1).unsqueeze(-1)).squeeze(-1) * owned
    logp = tp_sum(z_t) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    entropy = lse - tp_sum((e * z).sum(-1)) / sum_e
    return logp, entropy
