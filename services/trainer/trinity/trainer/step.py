"""One train step, the same for every backend: prepare the batch once -> for each update (mini-batch) -> for each of
this rank's micro-batches `micro_loss` -> backward -> clip and step -> commit.

A backend (`StepBackend`) supplies only what differs: its forward passes, how a micro-batch's loss reaches backward
(the PyTorch backend calls `micro_loss` itself; Megatron's pipeline schedule calls it on the last stage), its
optimizer and its ranks. So both train with the same loss terms and the same micro-batch scaling.

Scaling: every loss term of a micro-batch is its own aggregate weighted by the micro-batch's share of the
mini-batch under that term's aggregation mode (`loss_share`), so the backward passes of the micro-batches sum to
the gradient of the whole mini-batch's loss. Rows: a rollout or SFT sample is one row; a preference sample two
adjacent rows (chosen, rejected).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

import torch

from trinity.algorithm_table import ROW_INPUT_SOURCES, RowInput
from trinity.algorithms import PAIR_MEAN, agg_loss, apply_kl_penalty, loss_share, masked_mean, outcome_token_rewards
from trinity.config import RunConfig
from trinity.trainer.algorithm import AlgorithmParts, agg_mode
from trinity.trainer.batch import (
    Sample,
    TokenBatch,
    Tokenizer,
    TokenSequence,
    collate,
    filter_experiences,
    plan_updates,
    row_inputs,
    to_samples,
)
from trinity.trainer.checkpoint import TrainState
from trinity.trainer.consistency import VERSION_LAG_MAX, ProbeSums
from trinity.trainer.kl_control import KLCoefficient
from trinity.trainer.timeline import FORWARD_BACKWARD_KEY, OPTIMIZER_KEY, PREPARE_KEY
from trinity.v1 import common_pb2

ForwardModel = Literal["policy", "reference", "critic", "teacher"]
OldLogprobSource = Literal["sampler", "policy", "own"]
# (micro-batch sample indices, its rows collated, policy log-probs and entropies [rows, resp], critic values or None)
MicroLoss = Callable[[list[int], TokenBatch, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


class StepBackend(Protocol):
    """What a backend offers the step: its state, forward passes, the backward of micro-batches, the optimizer."""

    config: RunConfig
    algorithm: AlgorithmParts
    kl: KLCoefficient
    state: TrainState
    consumed: set[str]
    tokenizer: Tokenizer
    max_seq_len: int
    generator: torch.Generator

    @property
    def pad_id(self) -> int: ...

    def forward_rows(self, rows: list[TokenSequence], model: ForwardModel) -> torch.Tensor:
        """No grad, every rank the same: `[rows, max_resp]` log-probs under the policy, the frozen reference or the
        frozen teacher, or the critic's values."""
        ...

    def backward(self, samples: list[Sample], mini: list[int], loss: MicroLoss, with_entropy: bool | str) -> None:
        """For each of this rank's micro-batches of `mini`: the forward pass, `loss`, its backward."""
        ...

    def current_lr(self) -> float:
        """The learning rate the next optimizer update takes (the schedule's, a steered base included)."""
        ...

    def clip_and_step(self) -> float:
        """Clip the accumulated gradients, step the optimizer and the schedule; the gradient norm before clipping."""
        ...

    def merge_metrics(self, sums: dict[str, float], weights: dict[str, float]) -> dict[str, float]:
        """Weighted means of every rank's micro-batch metrics, as one process over the batch would report them."""
        ...


@dataclass
class PreparedBatch:
    """What every micro-batch of a step reads, computed once per step: `[rows, resp]` tensors unless noted."""

    rows: list[TokenSequence]
    row_index: list[list[int]]  # the rows of each sample
    mask: torch.Tensor
    lengths: torch.Tensor  # [rows]
    expert: torch.Tensor  # [rows] bool: demonstration rows
    old: torch.Tensor | None = None  # PPO's old log-probs of every row not in `own_old`
    own_old: set[int] = field(default_factory=set)  # rows whose old log-probs are their update's own, detached
    ref: torch.Tensor | None = None
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    sampler: torch.Tensor | None = None  # the sampler's log-probs (rows without them zero), for the probe
    probe_rows: set[int] = field(default_factory=set)  # rows the consistency probe reads in the first update
    band: tuple[float, float] = (0.8, 1.25)  # the probe's ratio band

    def rows_of(self, samples: list[int]) -> list[int]:
        return [r for i in samples for r in self.row_index[i]]


def train_step(b: StepBackend, experiences: Sequence[common_pb2.Experience]) -> dict[str, float]:
    """One step on `experiences`: one optimizer update per mini-batch of `plan_updates`; the step's metrics."""
    start = time.perf_counter()
    trainer, state = b.config.trainer, b.state
    kept, metrics = filter_experiences(experiences, b.consumed, state.step, b.config.synchronizer.max_staleness)
    if not kept:
        return {**metrics, "skipped": 1.0, "step": float(state.step)}
    samples = to_samples(kept, b.tokenizer, max_seq_len=b.max_seq_len)
    staleness = [state.step - s.model_version for s in samples]
    metrics.update({"staleness/mean": sum(staleness) / len(staleness), "staleness/max": float(max(staleness))})
    sampled = [s.model_version for s in samples if not s.expert]
    if sampled:  # the weights the rollouts came from against the trainer's, before this step's update
        metrics[VERSION_LAG_MAX] = float(state.model_version - min(sampled))
    metrics["kl_coef"] = b.kl.value
    alg = b.kl.apply(b.algorithm)
    updates = plan_updates(len(samples), trainer.mini_batch_size, trainer.ppo_epochs, b.generator)
    batch = prepare(b, alg, samples, updates)
    metrics.update(batch.metrics)
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    norms = []
    lr = b.current_lr()
    clock = [_settled()]  # the step's timeline: prepared, then after each backward and each optimizer step
    for mini in updates:
        loss = partial(micro_loss, batch, alg, mini=mini, step=state.step, sums=sums, weights=weights)
        b.backward(samples, mini, loss, entropy_mode(alg))
        batch.probe_rows.clear()  # later updates run on updated weights
        clock.append(_settled())
        norms.append(b.clip_and_step())
        clock.append(_settled())
    metrics.update(b.merge_metrics(sums, weights))
    metrics[PREPARE_KEY] = clock[0] - start
    metrics[FORWARD_BACKWARD_KEY] = sum(clock[i + 1] - clock[i] for i in range(0, len(clock) - 1, 2))
    metrics[OPTIMIZER_KEY] = sum(clock[i + 1] - clock[i] for i in range(1, len(clock) - 1, 2))
    metrics.update({"grad_norm": sum(norms) / len(norms), "lr": lr, "updates": float(len(norms))})
    b.kl.update(metrics, len(samples))
    state.step += 1
    state.model_version += 1
    state.kl_coef = b.kl.value
    new_ids = [s.id for s in samples if s.id]
    state.consumed_ids.extend(new_ids)
    b.consumed.update(new_ids)
    seconds = time.perf_counter() - start
    tokens = sum(seq.length for s in samples for seq in s.sequences) * trainer.ppo_epochs
    metrics.update(
        {
            "step": float(state.step),
            "model_version": float(state.model_version),
            "samples": float(len(samples)),
            "tokens": float(tokens),
            "tokens_per_s": tokens / seconds,
            "step_seconds": seconds,
        }
    )
    return metrics


def _settled() -> float:
    """The time once the device has run what was queued (so that each part of the step is timed with its own
    kernels; the optimizer step waits for them anyway)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def entropy_mode(alg: AlgorithmParts) -> bool | str:
    """Entropies with a graph when an entropy term weighs them, else values only (a metric)."""
    return True if alg.entropy is not None and alg.entropy.params.get("entropy_coef", 1) else "detached"


def first_update_only(updates: Sequence[Sequence[int]]) -> list[int]:
    """The samples of a step's first update that no later update of the step trains again."""
    if not updates:
        return []
    later = {i for update in updates[1:] for i in update}
    return [i for i in updates[0] if i not in later]


def old_logprob_source(
    alg: AlgorithmParts, sampler_has_all: bool, recompute: bool, first_only: list[int]
) -> OldLogprobSource:
    """Where PPO's old log-probs come from: `"sampler"` (the explorer's, every row has them and the config trusts
    them), `"policy"` (a pass of the policy before the step's first update) or `"own"` (that pass for every row
    but those only the first update trains: they take that update's own log-probs, detached, for free). `"own"` is
    out when something reads them before the update: a KL penalty in the rewards, or the advantage."""
    if sampler_has_all and not recompute:
        return "sampler"
    read_before = alg.kl_penalty is not None or (alg.advantage is not None and "old_logprobs" in alg.advantage.inputs)
    return "policy" if read_before or not first_only else "own"


def prepare(b: StepBackend, alg: AlgorithmParts, samples: list[Sample], updates: list[list[int]]) -> PreparedBatch:
    """Old and reference log-probs, values, advantages and the batch metrics, once per step."""
    rows = [seq for s in samples for seq in s.sequences]
    starts = torch.tensor([len(s.sequences) for s in samples]).cumsum(0).tolist()
    row_index = [list(range(end - len(s.sequences), end)) for s, end in zip(samples, starts, strict=True)]
    full = collate(rows, b.pad_id)
    lengths = torch.tensor([len(r.response) for r in rows])
    expert = torch.tensor([s.expert for s in samples for _ in s.sequences])
    batch = PreparedBatch(rows, row_index, full.mask, lengths, expert)
    batch.metrics = {"action_tokens": float(full.mask.sum()), "response_length/mean": float(lengths.float().mean())}
    batch.ref = b.forward_rows(rows, "reference") if alg.needs_reference else None
    if alg.data_kind != "rollout":
        return batch
    sampler = full.old_logprobs if all(r.old_logprobs is not None for r in rows) else None
    first_only = batch.rows_of(first_update_only(updates))
    source = old_logprob_source(alg, sampler is not None, b.config.trainer.recompute_old_logprobs, first_only)
    if source == "sampler":
        batch.old = sampler
    else:
        batch.own_old = set(first_only) if source == "own" else set()
        batch.old = _policy_logprobs(b, rows, batch.own_old, full.mask.shape[1])
    _plan_probe(b, batch, full, source, updates)
    if alg.needs_critic:
        batch.values = b.forward_rows(rows, "critic")
    teacher: torch.Tensor | None = None
    if alg.needs_teacher:
        have = all(r.teacher_logprobs is not None for r in rows)
        teacher = (
            full.teacher_logprobs if have and full.teacher_logprobs is not None else b.forward_rows(rows, "teacher")
        )
        policy_now = batch.old if not batch.own_old else sampler
        if policy_now is not None:
            batch.metrics["teacher_kl"] = float(masked_mean(policy_now - teacher, full.mask))  # KL(policy || teacher)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    token_rewards = full.token_rewards
    if alg.kl_penalty is not None and batch.ref is not None and batch.old is not None:
        base = token_rewards if token_rewards is not None else outcome_token_rewards(rewards, full.mask)
        token_rewards, pen = apply_kl_penalty(
            token_rewards=base, logprobs=batch.old, ref_logprobs=batch.ref, mask=full.mask,
            coef=alg.kl_penalty_coef, estimator=alg.kl_penalty,
        )  # fmt: skip
        batch.metrics["kl_penalty"] = pen["kl"]
    available: dict[str, Any] = {
        "rewards": rewards,
        "mask": full.mask,
        "group_ids": torch.tensor([s.group for s in samples], dtype=torch.int64),
        "values": batch.values,
        "token_rewards": token_rewards,
        "old_logprobs": None if batch.own_old else batch.old,
        "ref_logprobs": batch.ref,
        RowInput.TEACHER_LOGPROBS: teacher,
        **{str(name): value for name, value in row_inputs(samples).items()},
    }
    missing = [r for r in sorted(alg.requires) if r != RowInput.EXPERT_MASK and available.get(r) is None]
    if missing:
        sources = "; ".join(f"{r.value} (from {ROW_INPUT_SOURCES[r]})" for r in missing)
        raise ValueError(f"the algorithm needs per-row {sources}, which this batch lacks")
    batch.metrics["reward/mean"] = float(rewards.mean())
    batch.metrics["reward/std"] = float(rewards.std()) if len(samples) > 1 else 0.0
    if alg.advantage is not None:  # RAFT trains on its filtered rollouts by SFT, without advantages
        advantages, batch.returns = alg.advantage(**alg.advantage.given(available))
        batch.advantages = advantages.detach()
        batch.metrics["advantage/mean"] = float(masked_mean(batch.advantages, full.mask))
        episodes = available[RowInput.EPISODE_IDS]
        if episodes is not None:
            batch.metrics["advantage/within_episode_std"] = _within_episode_std(batch.advantages, full.mask, episodes)
    return batch


def _plan_probe(
    b: StepBackend, batch: PreparedBatch, full: TokenBatch, source: OldLogprobSource, updates: list[list[int]]
) -> None:
    """The consistency probe compares the sampler's log-probs with the trainer's under the weights of before the
    step's first update, without a pass of its own: from the old log-probs when the policy computed them for every
    row (`"policy"`), else in the first update's micro-batches (`micro_loss`), whose forward runs on those weights."""
    probed = [r for r, row in enumerate(batch.rows) if row.old_logprobs is not None and not bool(batch.expert[r])]
    if not probed or full.old_logprobs is None:
        return
    batch.sampler, batch.band = full.old_logprobs, b.config.monitor.consistency.ratio_band
    if source == "policy" and batch.old is not None:
        sums = ProbeSums.of(batch.old[probed], batch.sampler[probed], batch.mask[probed], batch.band)
        batch.metrics.update(sums.metrics())
    elif updates:
        batch.probe_rows = set(probed) & set(batch.rows_of(updates[0]))


def _within_episode_std(advantages: torch.Tensor, mask: torch.Tensor, episodes: torch.Tensor) -> float:
    """Mean over multi-step episodes of the std of their steps' advantages: 0 when every step of an episode gets
    the episode's score (multi-step GRPO), above 0 when a step-level term tells the steps apart (GiGPO)."""
    per_row = masked_mean(advantages, mask, dim=-1)
    stds = [per_row[episodes == e].std(unbiased=False) for e in episodes.unique() if int((episodes == e).sum()) > 1]
    return float(torch.stack(stds).mean()) if stds else 0.0


def _policy_logprobs(b: StepBackend, rows: list[TokenSequence], own: set[int], width: int) -> torch.Tensor | None:
    """The policy's log-probs of every row not in `own` (`[rows, width]`, those rows zero); None if all are."""
    rest = [r for r in range(len(rows)) if r not in own]
    if not rest:
        return None
    computed = b.forward_rows([rows[r] for r in rest], "policy")
    if not own:
        return computed
    old = torch.zeros((len(rows), width), dtype=computed.dtype, device=computed.device)
    old[rest, : computed.shape[1]] = computed
    return old


def micro_loss(
    batch: PreparedBatch,
    alg: AlgorithmParts,
    micro: list[int],
    mb: TokenBatch,
    logp: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor | None,
    *,
    mini: list[int],
    step: int,
    sums: dict[str, float],
    weights: dict[str, float],
) -> torch.Tensor:
    """The loss of one micro-batch (sample indices `micro` of the update's `mini`), weighted by its share of the
    mini-batch; its metrics are added to `sums`/`weights`. `logp`, `entropy`, `values`: `[rows, resp]` with grad."""
    mb_rows, mini_rows = batch.rows_of(micro), batch.rows_of(mini)
    width, device = mb.mask.shape[1], logp.device  # the backend's device (a rank's GPU): the terms are computed there
    mb = mb.to(device)
    mini_mask = batch.mask[mini_rows, : max(int(batch.lengths[mini_rows].max()), 1)]

    def rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[mb_rows, :width].to(device)

    def share(mode: str, fn: Any = None) -> float:
        return loss_share(mode, mb.mask, mini_mask, fn.params.get("norm_constant") if fn is not None else None)

    # a micro-batch lies inside one update, so its rows are all in `own_old` or none is
    old = logp.detach() if mb_rows[0] in batch.own_old else rows(batch.old)
    available = {
        "logprobs": logp,
        "old_logprobs": old,
        "advantages": rows(batch.advantages),
        "mask": mb.mask,
        "ref_logprobs": rows(batch.ref),
        RowInput.EXPERT_MASK: batch.expert[mb_rows].to(device),
        "step": step,
        "entropies": entropy,
    }
    if batch.probe_rows and batch.sampler is not None:  # the first update's forward: the weights the step began with
        probe = [i for i, r in enumerate(mb_rows) if r in batch.probe_rows]
        if probe:
            sampled = batch.sampler[[mb_rows[i] for i in probe], :width].to(device)
            ProbeSums.of(logp[probe], sampled, mb.mask[probe], batch.band).add_to(sums, weights)
    loss, m = alg.policy_loss(**alg.policy_loss.given(available))
    metrics = {k: float(v) for k, v in m.items()}
    metrics["entropy"] = float(masked_mean(entropy.detach(), mb.mask))
    w = share(PAIR_MEAN if alg.data_kind == "preference" else alg.loss_agg_mode, alg.policy_loss)
    total = loss * w
    if alg.entropy is not None:
        e_loss, em = alg.entropy(**alg.entropy.given(available))
        total = total + e_loss * share(agg_mode(alg.entropy), alg.entropy)
        metrics.update({f"entropy_term/{k}": float(v) for k, v in em.items()})
    ref = available["ref_logprobs"]
    if ref is not None and alg.kl is not None:
        per_token = alg.kl(logp, ref)
        metrics["kl"] = float(masked_mean(per_token.detach(), mb.mask))
        if alg.kl_coef:
            kl_loss = alg.kl_coef * agg_loss(per_token, mb.mask, alg.loss_agg_mode)
            total = total + kl_loss * share(alg.loss_agg_mode)
            metrics["kl_loss"] = float(kl_loss.detach())
    if values is not None and alg.value_loss is not None:
        inputs = {"values": values, "old_values": rows(batch.values), "returns": rows(batch.returns), "mask": mb.mask}
        v_loss, vm = alg.value_loss(**alg.value_loss.given(inputs))
        total = total + alg.value_loss_coef * v_loss * share(agg_mode(alg.value_loss), alg.value_loss)
        metrics.update({k: float(v) for k, v in vm.items()})
        metrics["value/mean"] = float(masked_mean(values.detach(), mb.mask))
    metrics["loss/total"] = float(total.detach()) / w if w else 0.0
    for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + v * w
        weights[k] = weights.get(k, 0.0) + w
    return total
