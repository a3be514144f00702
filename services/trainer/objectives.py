"""Per-micro-batch objectives of the three data kinds: RL rollouts, SFT demonstrations, DPO pairs.

Each builder prepares what the whole batch needs once (advantages, reference log-probs) and returns
`objective(micro, mini) -> (scaled_loss, metrics, weight)`. `scaled_loss` is the micro-batch loss times
its share of the mini-batch, so that summing `backward()` over the micro-batches yields exactly the
gradient of the mini-batch loss computed in one pass (for every aggregation mode, see `_share`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from trinity.algorithms.aggregation import agg_loss, masked_mean, masked_sum
from trinity.trainer.batch import Sample, TokenBatch, collate

if TYPE_CHECKING:
    from trinity.trainer.torch_backend import MicroObjective, TorchBackend


def _share(mode: str, mb_mask: torch.Tensor, mini_mask: torch.Tensor, fixed_norm: bool) -> float:
    """Fraction of the mini-batch loss that a micro-batch's own aggregated loss stands for.

    token-mean: its share of the valid tokens; seq-mean-*: its share of the non-empty rows;
    seq-mean-token-sum-norm divides by the padded length (unless a constant is fixed), so the micro loss
    is rescaled from its own padded length to the mini-batch's.
    """
    if mode == "token-mean":
        return float(mb_mask.sum()) / max(float(mini_mask.sum()), 1.0)
    if mode == "seq-mean-token-sum-norm":
        return 1.0 if fixed_norm else mb_mask.shape[1] / mini_mask.shape[1]
    return float(mb_mask.any(-1).sum()) / max(float(mini_mask.any(-1).sum()), 1.0)


def rollout(backend: TorchBackend, samples: list[Sample]) -> tuple[MicroObjective, dict[str, float]]:
    alg = backend.algorithm
    settings = backend.settings
    assert alg.advantage is not None and alg.policy_loss is not None
    full = collate([s.chosen for s in samples], backend.pad_id)
    # Widths must match what collate gives each micro-batch: pad by response *length*, not by mask.
    lengths = torch.tensor([len(s.chosen.response) for s in samples])
    mask = full.mask

    missing_old = any(s.chosen.old_logprobs is None for s in samples)
    if missing_old or settings.recompute_old_logprobs:
        old = backend._forward_only(samples, lambda mb: backend.token_logprobs(backend.policy, mb)[0])
    else:
        old = full.old_logprobs
    ref = backend.reference_logprobs(samples) if backend.reference is not None else None
    critic = backend.critic
    values = (
        backend._forward_only(samples, lambda mb: critic(mb.input_ids, mb.attention_mask, mb.response_index))
        if critic is not None
        else None
    )
    inputs: dict[str, Any] = {
        "rewards": torch.tensor([s.reward for s in samples], dtype=torch.float32),
        "mask": mask,
        "group_ids": torch.tensor([s.group for s in samples], dtype=torch.int64),
    }
    optional = {
        "values": values,
        "token_rewards": full.token_rewards,
        "old_logprobs": old,
        "ref_logprobs": ref,
        "teacher_logprobs": full.teacher_logprobs,
    }
    inputs.update({k: v for k, v in optional.items() if v is not None})
    advantages, returns = alg.advantage(**inputs)
    advantages = advantages.detach()

    mode = alg.loss_agg_mode
    params = getattr(alg.policy_loss, "params", {}) or {}
    fixed_norm = params.get("norm_constant") is not None

    def width(rows: list[int]) -> int:
        return max(int(lengths[rows].max()), 1)

    def objective(micro: list[int], mini: list[int]) -> tuple[torch.Tensor, dict[str, float], float]:
        mb = collate([samples[i].chosen for i in micro], backend.pad_id)
        w_mb = mb.mask.shape[1]

        def sl(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[micro, :w_mb]

        logp, entropy = backend.token_logprobs(backend.policy, mb, with_entropy=True)
        loss, m = alg.policy_loss(
            logprobs=logp,
            old_logprobs=sl(old),
            advantages=sl(advantages),
            mask=mb.mask,
            ref_logprobs=sl(ref),
            step=backend.step,
        )
        metrics = {k: float(v) for k, v in m.items()}
        metrics["loss/policy"] = float(loss.detach())
        total = loss
        if alg.entropy_coef:
            total = total - alg.entropy_coef * agg_loss(entropy, mb.mask, mode)
        metrics["entropy"] = float(masked_mean(entropy.detach(), mb.mask))
        if ref is not None and alg.kl is not None:
            kl = alg.kl(logp, sl(ref))
            metrics["kl"] = float(masked_mean(kl.detach(), mb.mask))
            if alg.kl_coef:
                kl_loss = agg_loss(kl, mb.mask, mode)
                total = total + alg.kl_coef * kl_loss
                metrics["loss/kl"] = float(kl_loss.detach())
        if critic is not None and returns is not None:
            v_new = critic(mb.input_ids, mb.attention_mask, mb.response_index)
            v_old, ret = sl(values), sl(returns)
            assert v_old is not None and ret is not None
            vf = (v_new - ret) ** 2
            if settings.value_clip is not None:
                v_clip = v_old + (v_new - v_old).clamp(-settings.value_clip, settings.value_clip)
                vf = torch.maximum(vf, (v_clip - ret) ** 2)
            value_loss = 0.5 * agg_loss(vf, mb.mask, mode)
            total = total + settings.value_loss_coef * value_loss
            metrics["loss/value"] = float(value_loss.detach())
            metrics["value/mean"] = float(masked_mean(v_new.detach(), mb.mask))
        metrics["loss/total"] = float(total.detach())
        mini_mask = mask[mini, : width(mini)]
        share = _share(mode, mb.mask, mini_mask, fixed_norm)
        return total * share, metrics, share

    resp_mask = mask.float()
    prep = {
        "reward/mean": float(inputs["rewards"].mean()),
        "reward/std": float(inputs["rewards"].std()) if len(samples) > 1 else 0.0,
        "advantage/mean": float(masked_mean(advantages, mask)),
        "response_length/mean": float(lengths.float().mean()),
        "action_tokens": float(resp_mask.sum()),
    }
    return objective, prep


def sft(backend: TorchBackend, samples: list[Sample]) -> tuple[MicroObjective, dict[str, float]]:
    """Token-mean negative log-likelihood of the action-masked response tokens."""
    counts = torch.tensor([sum(s.chosen.action_mask) for s in samples], dtype=torch.float32)

    def objective(micro: list[int], mini: list[int]) -> tuple[torch.Tensor, dict[str, float], float]:
        mb = collate([samples[i].chosen for i in micro], backend.pad_id)
        logp, _ = backend.token_logprobs(backend.policy, mb)
        n_mini = max(float(counts[mini].sum()), 1.0)
        nll_sum = -masked_sum(logp, mb.mask)
        share = float(mb.mask.sum()) / n_mini
        micro_loss = float(nll_sum.detach()) / max(float(mb.mask.sum()), 1.0)
        return nll_sum / n_mini, {"loss/sft": micro_loss, "loss/total": micro_loss}, share

    return objective, {"action_tokens": float(counts.sum())}


def _pair_batch(samples: list[Sample], micro: list[int], pad_id: int) -> TokenBatch:
    """Chosen rows first, then the rejected rows in the same order: `[2 * pairs, ...]`."""
    seqs = [samples[i].chosen for i in micro]
    seqs += [samples[i].rejected for i in micro]  # type: ignore[misc]
    return collate(seqs, pad_id)


def dpo(backend: TorchBackend, samples: list[Sample]) -> tuple[MicroObjective, dict[str, float]]:
    """Direct preference optimisation: -log sigmoid(beta * (chosen log-ratio - rejected log-ratio))."""
    beta = backend.settings.dpo_beta
    reference = backend.reference
    assert reference is not None, "DPO needs the reference policy"

    def objective(micro: list[int], mini: list[int]) -> tuple[torch.Tensor, dict[str, float], float]:
        mb = _pair_batch(samples, micro, backend.pad_id)
        n = len(micro)
        with torch.no_grad(), reference.active() as ref_model:
            ref_logp, _ = backend.token_logprobs(ref_model, mb)
        logp, _ = backend.token_logprobs(backend.policy, mb)
        seq_logratio = masked_sum(logp - ref_logp, mb.mask, dim=-1)  # [2n]
        margin = beta * (seq_logratio[:n] - seq_logratio[n:])
        loss = -F.logsigmoid(margin).mean()
        share = n / len(mini)
        metrics = {
            "loss/dpo": float(loss.detach()),
            "loss/total": float(loss.detach()),
            "dpo/margin": float(margin.detach().mean()),
            "dpo/accuracy": float((margin.detach() > 0).float().mean()),
            "dpo/chosen_reward": float(beta * seq_logratio[:n].detach().mean()),
            "dpo/rejected_reward": float(beta * seq_logratio[n:].detach().mean()),
        }
        return loss * share, metrics, share

    return objective, {"pairs": float(len(samples))}
