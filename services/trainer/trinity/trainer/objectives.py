"""The per-micro-batch objective of a train step, for all three data kinds.

`build_objective` prepares what the whole batch needs once (old/reference log-probs, values,
advantages) and returns `objective(micro, mini) -> (scaled_loss, metrics, weight)`. Every loss term is
scaled by the micro-batch's share of the mini-batch *under that term's own aggregation* (`share`), so
summing `backward()` over micro-batches gives exactly the gradient of the mini-batch loss in one pass.

The objective computes no forward pass itself: it asks the backend through `PolicyForward`, which the
PyTorch backend (`torch_backend.TorchBackend`) and the Megatron engine (`megatron.engine.MegatronForward`)
both implement, so the two train with the same loss terms and the same micro-batch scaling.

Rows: a rollout or SFT sample is one row; a preference sample is two adjacent rows (chosen, rejected),
the layout the library's `dpo` loss expects.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import torch

from trinity.algorithms import agg_loss, apply_kl_penalty, masked_mean, outcome_token_rewards
from trinity.trainer.algorithm import AlgorithmParts, agg_mode
from trinity.trainer.batch import REWARD_BASELINE, Sample, TokenBatch, TokenSequence, collate

MicroObjective = Callable[[list[int], list[int]], tuple[torch.Tensor, dict[str, float], float]]
PAIR_MEAN = "pair-mean"  # DPO: the mean over (chosen, rejected) pairs
ForwardModel = Literal["policy", "reference", "critic", "teacher"]


class PolicyForward(Protocol):
    """The forward passes the objective asks a backend for; the backend owns the models."""

    @property
    def pad_id(self) -> int:
        """The token that pads rows."""
        ...

    @property
    def pack_budget(self) -> int | None:
        """Row budget of shared-prompt rows (`collate`) for the objective's micro-batches; None = one row each."""
        ...

    def logprobs(self, batch: TokenBatch, *, with_entropy: bool | str = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy log-probs and entropies `[rows, resp]` of `batch`'s response tokens, with grad.

        `with_entropy`: False (zeros), True, or "detached" (values without a graph)."""
        ...

    def forward_rows(self, rows: list[TokenSequence], model: ForwardModel) -> torch.Tensor:
        """No grad, over all `rows` in token-budget micro-batches: `[rows, max_resp]` log-probs under the
        policy, the frozen reference or the frozen teacher, or the critic's values."""
        ...


class CriticTerm(NamedTuple):
    """PPO's value model in the loss: `values(batch)` `[rows, resp]` with grad, weighted by `coef`."""

    values: Callable[[TokenBatch], torch.Tensor]
    coef: float


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


def _advantage_reads(alg: AlgorithmParts, name: str) -> bool:
    """Whether the algorithm's advantage function takes the per-row input `name` (by its signature)."""
    if alg.advantage is None:
        return False
    return name in inspect.signature(getattr(alg.advantage, "fn", alg.advantage)).parameters


INPUT_SOURCES = {
    "episode_ids": "Experience.episode_id, written by multi-step workflows",
    "reward_baselines": f"Experience.reward_components[{REWARD_BASELINE!r}], the greedy sample's reward",
}


def _row_inputs(samples: list[Sample]) -> dict[str, torch.Tensor | None]:
    """Per-row advantage inputs that only some rollouts carry: episode ids (multi-step workflows; a row
    without one is an episode of its own) and ReMax's greedy reward baselines (all rows or none)."""
    episodes = None
    if any(s.episode is not None for s in samples):
        known = 1 + max(s.episode for s in samples if s.episode is not None)
        own = iter(range(known, known + len(samples)))
        episodes = torch.tensor([s.episode if s.episode is not None else next(own) for s in samples])
    baselines = [s.reward_baseline for s in samples]
    have_all = all(b is not None for b in baselines)
    return {
        "episode_ids": episodes,
        "reward_baselines": torch.tensor(baselines, dtype=torch.float32) if have_all else None,
    }


def _teacher_logprobs(forward: PolicyForward, rows: list[TokenSequence], full: TokenBatch) -> torch.Tensor:
    if full.teacher_logprobs is not None and all(r.teacher_logprobs is not None for r in rows):
        return full.teacher_logprobs
    return forward.forward_rows(rows, "teacher")


def first_update_only(updates: Sequence[Sequence[int]]) -> list[int]:
    """The samples of a step's first update that no later update of the step trains again."""
    if not updates:
        return []
    later = {i for update in updates[1:] for i in update}
    return [i for i in updates[0] if i not in later]


def _policy_logprobs(
    forward: PolicyForward, rows: list[TokenSequence], own: set[int], width: int
) -> torch.Tensor | None:
    """The policy's log-probs of every row not in `own` (`[rows, width]`, those rows left zero); None when every
    row is in `own`."""
    rest = [r for r in range(len(rows)) if r not in own]
    if not rest:
        return None
    computed = forward.forward_rows([rows[r] for r in rest], "policy")
    if not own:
        return computed
    old = torch.zeros((len(rows), width), dtype=computed.dtype, device=computed.device)
    old[rest, : computed.shape[1]] = computed
    return old


def build_objective(
    forward: PolicyForward,
    alg: AlgorithmParts,
    samples: list[Sample],
    *,
    step: int,
    recompute_old_logprobs: bool = False,
    updates: Sequence[Sequence[int]] = (),
    critic: CriticTerm | None = None,
) -> tuple[MicroObjective, dict[str, float]]:
    """The objective of one train step on `samples` (the policy's `step`-th update), and its batch metrics.

    Old log-probs are the sampler's unless a row lacks them or `recompute_old_logprobs` is set; then
    the policy's own, before the step's first update. `updates` is the step's plan (`plan_updates`): the samples
    that only its first update trains take those from that update's own forward pass, detached, so a step of one
    update needs no extra pass and one of N mini-batches a pass over the other N-1 only. Teacher
    log-probs (distillation) are the experiences' own when every row has them, else one teacher pass here: once
    per experience, since a step trains each experience once and its epochs reuse what is prepared here.
    """
    rows, row_index = _rows_of(samples)
    full = collate(rows, forward.pad_id)
    mask = full.mask
    expert_rows = torch.tensor([s.expert for s, idx in zip(samples, row_index, strict=True) for _ in idx])
    lengths = torch.tensor([len(r.response) for r in rows])
    prep: dict[str, float] = {
        "action_tokens": float(mask.sum()),
        "response_length/mean": float(lengths.float().mean()),
    }

    def rows_for(idx: list[int]) -> list[int]:
        return [r for i in idx for r in row_index[i]]

    ref = forward.forward_rows(rows, "reference") if alg.needs_reference else None
    old: torch.Tensor | None = None  # the old log-probs of every row not in `own_old`
    own_old: set[int] = set()  # rows whose old log-probs are their update's own, detached
    sampler = full.old_logprobs if all(r.old_logprobs is not None for r in rows) else None
    values = returns = advantages = None
    if alg.data_kind == "rollout":
        if sampler is None or recompute_old_logprobs:
            # Needed before the update: in a reward's KL penalty, or as an advantage input.
            needed_now = alg.kl_penalty is not None or _advantage_reads(alg, "old_logprobs")
            own_old = set() if needed_now else set(rows_for(first_update_only(updates)))
            old = _policy_logprobs(forward, rows, own_old, mask.shape[1])
        else:
            old = sampler
        if critic is not None:
            values = forward.forward_rows(rows, "critic")
        teacher = _teacher_logprobs(forward, rows, full) if alg.needs_teacher else None
        policy_now = old if old is not None and not own_old else sampler
        if teacher is not None and policy_now is not None:
            prep["teacher_kl"] = float(masked_mean(policy_now - teacher, mask))  # sampled KL(policy || teacher)
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
            "old_logprobs": None if own_old else old,
            "ref_logprobs": ref,
            "teacher_logprobs": teacher,
        }
        optional.update(_row_inputs(samples))
        inputs.update({k: v for k, v in optional.items() if v is not None})
        missing = [name for name in alg.required_inputs if name not in inputs]
        if missing:
            sources = ", ".join(f"{name} (from {INPUT_SOURCES.get(name, 'the experiences')})" for name in missing)
            raise ValueError(f"the algorithm's advantage needs per-row {sources}, which this batch lacks")
        prep.update(
            {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(samples) > 1 else 0.0}
        )
        if alg.advantage is not None:  # RAFT trains on its filtered rollouts by SFT, without advantages
            advantages, returns = alg.advantage(**inputs)
            advantages = advantages.detach()
            prep["advantage/mean"] = float(masked_mean(advantages, mask))

    entropy_params = getattr(alg.entropy, "params", None) or {}
    entropy_mode: bool | str = True if alg.entropy is not None and entropy_params.get("entropy_coef", 1) else "detached"
    policy_mode = PAIR_MEAN if alg.data_kind == "preference" else alg.loss_agg_mode
    fixed_norm = (getattr(alg.policy_loss, "params", None) or {}).get("norm_constant") is not None

    def objective(micro: list[int], mini: list[int]) -> tuple[torch.Tensor, dict[str, float], float]:
        mb_rows, mini_rows = rows_for(micro), rows_for(mini)
        mb = collate([rows[r] for r in mb_rows], forward.pad_id, forward.pack_budget)
        width = mb.mask.shape[1]
        mini_mask = mask[mini_rows, : max(int(lengths[mini_rows].max()), 1)]

        logp, entropy = forward.logprobs(mb, with_entropy=entropy_mode)
        device = logp.device  # the backend's (a rank's GPU): the loss terms are computed there
        mb = mb.to(device)

        def sl(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[mb_rows, :width].to(device)

        def part(mode: str) -> float:
            return share(mode, mb.mask, mini_mask, fixed_norm)

        loss, m = alg.policy_loss(
            logprobs=logp,
            # a micro-batch lies inside one update, so its rows are all in `own_old` or none is
            old_logprobs=logp.detach() if mb_rows[0] in own_old else sl(old),
            advantages=sl(advantages) if advantages is not None else torch.zeros_like(logp),
            mask=mb.mask,
            ref_logprobs=sl(ref),
            expert_mask=expert_rows[mb_rows].to(device),
            step=step,
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
            v_new = critic.values(mb)
            v_loss, vm = alg.value_loss(values=v_new, old_values=sl(values), returns=sl(returns), mask=mb.mask)
            total = total + critic.coef * v_loss * part(agg_mode(alg.value_loss))
            metrics.update({k: float(v) for k, v in vm.items()})
            metrics["value/mean"] = float(masked_mean(v_new.detach(), mb.mask))
        metrics["loss/total"] = float(total.detach()) / w if w else 0.0
        return total, metrics, w

    return objective, prep
