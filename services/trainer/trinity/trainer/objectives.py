"""The per-micro-batch objective of a train step, for all three data kinds.

`build_objective` prepares what the whole batch needs once (old/reference log-probs, values,
advantages) and returns `objective(micro, mini) -> (scaled_loss, metrics, weight)`. Every loss term is
scaled by the micro-batch's share of the mini-batch *under that term's own aggregation* (`share`), so
summing `backward()` over micro-batches gives exactly the gradient of the mini-batch loss in one pass.

Rows: a rollout or SFT sample is one row; a preference sample is two adjacent rows (chosen, rejected),
the layout the library's `dpo` loss expects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trinity.algorithms import agg_loss, apply_kl_penalty, masked_mean, outcome_token_rewards
from trinity.trainer.algorithm import agg_mode
from trinity.trainer.batch import Sample, TokenBatch, TokenSequence, collate

if TYPE_CHECKING:
    from trinity.trainer.torch_backend import TorchBackend

MicroObjective = Callable[[list[int], list[int]], tuple[torch.Tensor, dict[str, float], float]]
PAIR_MEAN = "pair-mean"  # DPO: the mean over (chosen, rejected) pairs


def share(mode: str, mb_mask: torch.Tensor, mini_mask: torch.Tensor, fixed_norm: bool = False) -> float:
    """Fraction of a mini-batch loss that one micro-batch's own aggregated loss stands for.

    mb_mask `[rows, resp]`, mini_mask `[mini_rows, mini_resp]` (padded as collate pads them).
    token-mean: its share of valid tokens; seq-mean-*: of non-empty rows; pair-mean: of row pairs;
    seq-mean-token-sum-norm divides by the padded length unless a constant is fixed, so the micro loss is
    rescaled from its own padded length to the mini-batch's.
    """
    if mode == "token-mean":
        return float(mb_mask.sum()) / max(float(mini_mask.sum()), 1.0)
    if mode == PAIR_MEAN:
        return mb_mask.shape[0] / mini_mask.shape[0]
    if mode == "seq-mean-token-sum-norm":
        return 1.0 if fixed_norm else mb_mask.shape[1] / mini_mask.shape[1]
    return float(mb_mask.any(-1).sum()) / max(float(mini_mask.any(-1).sum()), 1.0)


def _rows_of(samples: list[Sample]) -> tuple[list[TokenSequence], list[list[int]]]:
    """All rows in order, and the row indices of each sample."""
    rows: list[TokenSequence] = []
    index: list[list[int]] = []
    for s in samples:
        index.append(list(range(len(rows), len(rows) + len(s.sequences))))
        rows.extend(s.sequences)
    return rows, index


def build_objective(backend: TorchBackend, samples: list[Sample]) -> tuple[MicroObjective, dict[str, float]]:
    alg = backend.algorithm
    settings = backend.settings
    rows, row_index = _rows_of(samples)
    full = collate(rows, backend.pad_id)
    mask = full.mask
    expert_rows = torch.tensor([s.expert for s, idx in zip(samples, row_index, strict=True) for _ in idx])
    lengths = torch.tensor([len(r.response) for r in rows])
    prep: dict[str, float] = {
        "action_tokens": float(mask.sum()),
        "response_length/mean": float(lengths.float().mean()),
    }

    def rows_for(idx: list[int]) -> list[int]:
        return [r for i in idx for r in row_index[i]]

    def policy_pass(model: torch.nn.Module) -> Callable[[TokenBatch], torch.Tensor]:
        return lambda mb: backend.token_logprobs(model, mb)[0]

    ref = backend.forward_rows(rows, backend.reference_pass()) if backend.reference is not None else None
    critic = backend.critic
    old: torch.Tensor | None = None
    values = returns = advantages = None
    if alg.data_kind == "rollout":
        if any(r.old_logprobs is None for r in rows) or settings.recompute_old_logprobs:
            old = backend.forward_rows(rows, policy_pass(backend.policy))
        else:
            old = full.old_logprobs
        if critic is not None:
            values = backend.forward_rows(rows, critic)
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        token_rewards = full.token_rewards
        if alg.kl_penalty is not None and ref is not None and old is not None:
            base = token_rewards if token_rewards is not None else outcome_token_rewards(rewards, mask)
            token_rewards, pen = apply_kl_penalty(
                token_rewards=base, logprobs=old, ref_logprobs=ref, mask=mask,
                coef=alg.kl_penalty_coef, estimator=alg.kl_penalty,
            )  # fmt: skip
            prep["kl_penalty"] = pen["kl"]
        inputs: dict[str, Any] = {
            "rewards": rewards,
            "mask": mask,
            "group_ids": torch.tensor([s.group for s in samples], dtype=torch.int64),
        }
        optional = {
            "values": values,
            "token_rewards": token_rewards,
            "old_logprobs": old,
            "ref_logprobs": ref,
            "teacher_logprobs": full.teacher_logprobs,
        }
        inputs.update({k: v for k, v in optional.items() if v is not None})
        assert alg.advantage is not None
        advantages, returns = alg.advantage(**inputs)
        advantages = advantages.detach()
        prep.update(
            {
                "reward/mean": float(rewards.mean()),
                "reward/std": float(rewards.std()) if len(samples) > 1 else 0.0,
                "advantage/mean": float(masked_mean(advantages, mask)),
            }
        )

    entropy_params = getattr(alg.entropy, "params", None) or {}
    entropy_mode: bool | str = True if alg.entropy is not None and entropy_params.get("entropy_coef", 1) else "detached"
    policy_mode = PAIR_MEAN if alg.data_kind == "preference" else alg.loss_agg_mode
    fixed_norm = (getattr(alg.policy_loss, "params", None) or {}).get("norm_constant") is not None

    def objective(micro: list[int], mini: list[int]) -> tuple[torch.Tensor, dict[str, float], float]:
        mb_rows, mini_rows = rows_for(micro), rows_for(mini)
        mb = collate([rows[r] for r in mb_rows], backend.pad_id, backend.pack_budget)
        width = mb.mask.shape[1]
        mini_mask = mask[mini_rows, : max(int(lengths[mini_rows].max()), 1)]

        def sl(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[mb_rows, :width]

        def part(mode: str) -> float:
            return share(mode, mb.mask, mini_mask, fixed_norm)

        logp, entropy = backend.token_logprobs(backend.policy, mb, with_entropy=entropy_mode)
        loss, m = alg.policy_loss(
            logprobs=logp,
            old_logprobs=sl(old) if old is not None else logp.detach(),
            advantages=sl(advantages) if advantages is not None else torch.zeros_like(logp),
            mask=mb.mask,
            ref_logprobs=sl(ref),
            expert_mask=expert_rows[mb_rows],
            step=backend.step,
        )
        metrics = {k: float(v) for k, v in m.items()}
        metrics["entropy"] = float(masked_mean(entropy.detach(), mb.mask))
        w = part(policy_mode)
        total = loss * w
        if alg.entropy is not None:
            e_loss, em = alg.entropy(mask=mb.mask, entropies=entropy)
            total = total + e_loss * part(agg_mode(alg.entropy))
            metrics.update({f"entropy_term/{k}": float(v) for k, v in em.items()})
        if ref is not None and alg.kl is not None:
            per_token = alg.kl(logp, sl(ref))
            metrics["kl"] = float(masked_mean(per_token.detach(), mb.mask))
            if alg.kl_coef:
                kl_loss = alg.kl_coef * agg_loss(per_token, mb.mask, alg.loss_agg_mode)
                total = total + kl_loss * part(alg.loss_agg_mode)
                metrics["kl_loss"] = float(kl_loss.detach())
        if critic is not None and alg.value_loss is not None:
            v_new = critic(mb)
            v_loss, vm = alg.value_loss(values=v_new, old_values=sl(values), returns=sl(returns), mask=mb.mask)
            total = total + settings.value_loss_coef * v_loss * part(agg_mode(alg.value_loss))
            metrics.update({k: float(v) for k, v in vm.items()})
            metrics["value/mean"] = float(masked_mean(v_new.detach(), mb.mask))
        metrics["loss/total"] = float(total.detach()) / w if w else 0.0
        return total, metrics, w

    return objective, prep
