"""Advantage estimators: ``(rewards, mask, group_ids, ...) -> (advantages [batch, seq], returns or None)``.

Call convention (keyword tensors; an estimator ignores inputs it does not use):

- ``rewards [batch]``: one scalar reward per row (sequence-level outcome reward),
- ``mask [batch, seq]``: boolean, true on the response tokens being trained,
- ``group_ids [batch]`` int64: rows sampled for the same task share an id (GRPO's group),
- where needed: ``values``, ``token_rewards``, ``old_logprobs``, ``teacher_logprobs`` (``[batch, seq]``),
  for GiGPO ``episode_ids``, ``step_group_ids``, ``step_rewards``, for multi-step GRPO ``episode_ids``
  and for ReMax ``reward_baselines`` (``[batch]``).

Advantages are zero on masked positions and carry no gradient. ``returns`` (the critic's regression
target) is given by estimators where it means something (GAE, REINFORCE++), otherwise ``None``.

Groups of one sample follow verl/Trinity-RFT: the baseline is 0 and the scale 1, so the advantage is the
raw reward (there is no other sample to compare with); GiGPO anchor groups of one get step advantage 0.
"""

from __future__ import annotations

import math

import torch

from .aggregation import as_bool_mask, masked_whiten
from .registry import register_advantage

AdvantageOutput = tuple[torch.Tensor, torch.Tensor | None]


# ----------------------------------------------------------------------------------------------- helpers
def _check_rows(rewards: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor | None = None) -> None:
    if mask.dim() != 2:
        raise ValueError(f"mask must be [batch, seq], got shape {tuple(mask.shape)}")
    if rewards.shape != mask.shape[:1]:
        raise ValueError(f"rewards must be [batch]={mask.shape[0]}, got shape {tuple(rewards.shape)}")
    if group_ids is not None and group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids must be [batch]={mask.shape[0]}, got shape {tuple(group_ids.shape)}")


def broadcast_to_tokens(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[batch]`` row scores -> ``[batch, seq]``, zero on masked positions."""
    return torch.where(as_bool_mask(mask), scores.unsqueeze(-1), 0.0)


def group_stats(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row statistics of the row's group: ``(mean, unbiased std, count)``, each ``[batch]``.

    Groups of one have std 0 (not NaN).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    values = values.float()
    count = values.new_zeros(n_groups).scatter_add_(0, inverse, torch.ones_like(values))
    mean = values.new_zeros(n_groups).scatter_add_(0, inverse, values) / count
    dev = values - mean[inverse]
    var = values.new_zeros(n_groups).scatter_add_(0, inverse, dev.square()) / (count - 1).clamp(min=1)
    return mean[inverse], var.sqrt()[inverse], count[inverse]


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each row's scalar reward on its last valid token: ``[batch] -> [batch, seq]``."""
    mask = as_bool_mask(mask)
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=-1).values
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards[rows].float()
    return out


def discounted_cumsum(token_values: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Reward-to-go ``G_t = r_t + gamma * G_{t'}`` over valid tokens (``t'`` the next valid token)."""
    mask = as_bool_mask(mask)
    out = torch.zeros_like(token_values, dtype=torch.float32)
    running = torch.zeros(token_values.shape[0], dtype=torch.float32, device=token_values.device)
    for t in reversed(range(token_values.shape[-1])):
        running = torch.where(mask[:, t], token_values[:, t].float() + gamma * running, running)
        out[:, t] = torch.where(mask[:, t], running, torch.zeros_like(running))
    return out


def _baselined(rewards: torch.Tensor, group_ids: torch.Tensor, epsilon: float, std_normalize: bool) -> torch.Tensor:
    mean, std, count = group_stats(rewards, group_ids)
    single = count < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    scale = torch.where(single, torch.ones_like(std), std) if std_normalize else torch.ones_like(std)
    return (rewards.float() - mean) / (scale + epsilon) if std_normalize else rewards.float() - mean


# ------------------------------------------------------------------------------- group-relative outcome
@register_advantage("grpo")
@torch.no_grad()
def grpo(
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    epsilon: float,
    std_normalize: bool,
) -> AdvantageOutput:
    """GRPO: ``(r_i - mean_g) / (std_g + epsilon)`` with the unbiased group std.

    ``std_normalize=False`` gives Dr. GRPO (mean-centering only).

    All-equal rewards give exactly 0 (the numerator is 0 and the denominator ``epsilon``).
    """
    _check_rows(rewards, mask, group_ids)
    return broadcast_to_tokens(_baselined(rewards, group_ids, epsilon, std_normalize), mask), None


@register_advantage("rec")
@torch.no_grad()
def rec(
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    epsilon: float,
    std_normalize: bool,
) -> AdvantageOutput:
    """REC (group-relative REINFORCE family): ``r_i - mean_g``, optionally divided by the group std."""
    _check_rows(rewards, mask, group_ids)
    return broadcast_to_tokens(_baselined(rewards, group_ids, epsilon, std_normalize), mask), None


@register_advantage("rloo")
@torch.no_grad()
def rloo(*, rewards: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor) -> AdvantageOutput:
    """RLOO: ``r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_g)`` (a group of one keeps its reward)."""
    _check_rows(rewards, mask, group_ids)
    mean, _std, count = group_stats(rewards, group_ids)
    loo = count / (count - 1).clamp(min=1) * (rewards.float() - mean)
    scores = torch.where(count < 2, rewards.float(), loo)
    return broadcast_to_tokens(scores, mask), None


@register_advantage("reinforce")
@torch.no_grad()
def reinforce(*, rewards: torch.Tensor, mask: torch.Tensor) -> AdvantageOutput:
    """Plain REINFORCE: the reward itself, no baseline (TOPR's default)."""
    _check_rows(rewards, mask)
    return broadcast_to_tokens(rewards.float(), mask), None


@register_advantage("asymre")
@torch.no_grad()
def asymre(
    *, rewards: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor, baseline_shift: float
) -> AdvantageOutput:
    """AsymRE: ``r_i - (mean_g + baseline_shift)``; a negative shift favours positive samples.

    A group of one has baseline 0 (the shift applies only to real group baselines, as Trinity-RFT).
    """
    _check_rows(rewards, mask, group_ids)
    mean, _std, count = group_stats(rewards, group_ids)
    baseline = torch.where(count < 2, torch.zeros_like(mean), mean + baseline_shift)
    return broadcast_to_tokens(rewards.float() - baseline, mask), None


@register_advantage("opmd")
@torch.no_grad()
def opmd(
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    opmd_baseline: str,
    tau: float,
) -> AdvantageOutput:
    """OPMD: ``r_i - b_g``; ``b_g`` is the group mean or ``tau * log mean_j exp(r_j / tau)`` (logavgexp)."""
    _check_rows(rewards, mask, group_ids)
    r = rewards.float()
    mean, _std, count = group_stats(r, group_ids)
    if opmd_baseline == "mean":
        baseline = mean
    elif opmd_baseline == "logavgexp":
        # log-mean-exp per group, shifted by the group max for stability.
        _, inverse = torch.unique(group_ids, return_inverse=True)
        n = int(inverse.max().item()) + 1
        gmax = r.new_full((n,), -torch.inf).scatter_reduce_(0, inverse, r / tau, "amax")
        sums = r.new_zeros(n).scatter_add_(0, inverse, torch.exp(r / tau - gmax[inverse]))
        baseline = tau * (gmax[inverse] + torch.log(sums[inverse] / count))
    else:
        raise ValueError(f"opmd_baseline must be 'mean' or 'logavgexp', got {opmd_baseline!r}")
    baseline = torch.where(count < 2, torch.zeros_like(baseline), baseline)
    return broadcast_to_tokens(r - baseline, mask), None


@register_advantage("remax")
@torch.no_grad()
def remax(
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    reward_baselines: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
) -> AdvantageOutput:
    """ReMax (Li et al. 2023): reward-to-go minus the reward of a greedy response to the same prompt.

    ``A_t = G_t - b`` with ``G_t`` the undiscounted reward-to-go (the outcome reward for a scalar reward)
    and ``b`` the row's ``reward_baselines [batch]``: the greedy decoding's reward, which the explorer
    produces. Returns ``(advantages, G)``.
    """
    _check_rows(rewards, mask)
    if reward_baselines is None:
        raise ValueError("remax needs reward_baselines [batch]: the reward of a greedy response to each task")
    if reward_baselines.shape != rewards.shape:
        raise ValueError(f"reward_baselines must be [batch]={mask.shape[0]}, got {tuple(reward_baselines.shape)}")
    per_token = outcome_token_rewards(rewards, mask) if token_rewards is None else token_rewards
    returns = discounted_cumsum(per_token, mask, 1.0)
    return returns - broadcast_to_tokens(reward_baselines.float(), mask), returns


# -------------------------------------------------------------------------------------- token-level
@register_advantage("reinforceplusplus")
@torch.no_grad()
def reinforce_plus_plus(
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    token_rewards: torch.Tensor | None = None,
) -> AdvantageOutput:
    """REINFORCE++: discounted reward-to-go, whitened over all valid tokens of the batch.

    ``token_rewards [batch, seq]`` defaults to the scalar reward on each row's last valid token.
    Returns ``(whitened returns, returns)``.
    """
    _check_rows(rewards, mask)
    per_token = outcome_token_rewards(rewards, mask) if token_rewards is None else token_rewards
    returns = discounted_cumsum(per_token, mask, gamma)
    return masked_whiten(returns, mask), returns


@register_advantage("gae")
@register_advantage("ppo")
@torch.no_grad()
def gae(
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    values: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool,
    token_rewards: torch.Tensor | None = None,
) -> AdvantageOutput:
    """Generalized Advantage Estimation with a critic (PPO).

    ``delta_t = r_t + gamma * V_{t'} - V_t`` and ``A_t = delta_t + gamma * lam * A_{t'}``, where ``t'`` is the
    next *valid* token (masked positions inside a row, e.g. tool output, are skipped) and the value after
    the last valid token is 0. ``returns = A + V`` (before whitening); advantages are whitened over the batch.

    Args:
        values: ``[batch, seq]`` critic values of the rollout (the old critic).
        token_rewards: ``[batch, seq]``; defaults to ``rewards`` on each row's last valid token.
    """
    _check_rows(rewards, mask)
    m = as_bool_mask(mask)
    r = outcome_token_rewards(rewards, m) if token_rewards is None else token_rewards.float()
    v = torch.where(m, values.float(), 0.0)
    adv = torch.zeros_like(v)
    next_value = v.new_zeros(v.shape[0])
    last_gae = v.new_zeros(v.shape[0])
    for t in reversed(range(v.shape[-1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        candidate = delta + gamma * lam * last_gae
        next_value = torch.where(m[:, t], v[:, t], next_value)
        last_gae = torch.where(m[:, t], candidate, last_gae)
        adv[:, t] = torch.where(m[:, t], last_gae, torch.zeros_like(last_gae))
    returns = torch.where(m, adv + v, torch.zeros_like(adv))
    advantages = masked_whiten(adv, m) if whiten else adv
    return advantages, returns


@register_advantage("on_policy_distill")
@torch.no_grad()
def on_policy_distill(
    *,
    mask: torch.Tensor,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    kl_coef: float,
    reward_to_go: bool,
    gamma: float,
) -> AdvantageOutput:
    """On-policy distillation: per-token ``kl_coef * (log p_teacher - log p_student_old)``.

    That is the negative per-token reverse-KL sample ``log(pi_old / pi_teacher)`` on the student's own tokens.
    With ``reward_to_go=True`` each token gets the discounted sum of the later per-token terms (the
    sequence-level reverse KL as a return), since an early token changes the states of all later ones.
    """
    per_token = torch.where(as_bool_mask(mask), kl_coef * (teacher_logprobs.float() - old_logprobs.float()), 0.0)
    return (discounted_cumsum(per_token, mask, gamma) if reward_to_go else per_token), None


@register_advantage("jsd")
@torch.no_grad()
def jsd(
    *,
    mask: torch.Tensor,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    lambda_coef: float,
    kl_coef: float,
) -> AdvantageOutput:
    """Jensen-Shannon distillation: advantage ``-kl_coef * JSD_t`` on the sampled token.

    With teacher ``P``, student ``Q`` probabilities of the sampled token and ``M = l P + (1 - l) Q``
    (``l = lambda_coef``): ``JSD_t = l * P (log P - log M) + (1 - l) * Q (log Q - log M)``.
    ``l`` at 0 or 1 makes the mixture one of the two distributions, and the divergence is 0.
    """
    if not 0.0 < lambda_coef < 1.0:
        return torch.zeros(mask.shape, device=mask.device), None
    log_p, log_q = teacher_logprobs.float(), old_logprobs.float()
    log_m = torch.logsumexp(torch.stack([log_p + math.log(lambda_coef), log_q + math.log(1 - lambda_coef)]), dim=0)
    divergence = lambda_coef * log_p.exp() * (log_p - log_m) + (1 - lambda_coef) * log_q.exp() * (log_q - log_m)
    return torch.where(as_bool_mask(mask), -kl_coef * divergence, 0.0), None


# ---------------------------------------------------------------------------------------- multi-step
def _normalize_in_groups(values: torch.Tensor, group_ids: torch.Tensor, fnorm: str, epsilon: float) -> torch.Tensor:
    mean, std, count = group_stats(values, group_ids)
    single = count < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    denom = torch.where(single, torch.ones_like(std), std) if fnorm == "std" else torch.ones_like(std)
    return (values.float() - mean) / (denom + epsilon)


def _episode_rows(
    episode_ids: torch.Tensor | None, batch: int, device: torch.device, pick: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(episode index of each row [batch], one row per episode [episodes])``; ``pick`` is ``amin`` for each
    episode's first row or ``amax`` for its last. No ``episode_ids`` makes every row its own episode."""
    if episode_ids is None:
        episode_ids = torch.arange(batch, device=device)
    if episode_ids.shape != (batch,):
        raise ValueError(f"episode_ids must be [batch]={batch}, got shape {tuple(episode_ids.shape)}")
    _, inverse = torch.unique(episode_ids, return_inverse=True)
    n_eps = int(inverse.max().item()) + 1 if batch else 0
    start = batch if pick == "amin" else -1
    rows = torch.full((n_eps,), start, dtype=torch.long, device=device).scatter_reduce_(
        0, inverse, torch.arange(batch, device=device), pick
    )
    return inverse, rows


_STD_LEVELS = ("group", "batch", "none")


@register_advantage("step_wise_grpo")
@torch.no_grad()
def step_wise_grpo(
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    epsilon: float,
    enable_step_norm: bool,
    std_cal_level: str,
    episode_ids: torch.Tensor | None = None,
) -> AdvantageOutput:
    """Multi-step GRPO: GRPO over whole episodes, the episode's score broadcast to each of its steps.

    Each row is one step (one model turn); ``episode_ids [batch]`` says which rows form one episode, and
    the reward of an episode's last row (in batch order) is its return. The returns are normalized in
    their task group (``group_ids``): ``(R - mean_g) / (std + epsilon)`` with ``std`` the unbiased std of
    the group (``group``), of every episode in the batch (``batch``), or no division (``none``). A group
    of one episode has mean 0 and std 1. ``enable_step_norm`` divides an episode's score by its number of
    steps, so long episodes do not weigh more. Groups whose returns are all equal get 0; dropping them is
    the Buffer's ``reward_std_filter``.
    """
    _check_rows(rewards, mask, group_ids)
    if std_cal_level not in _STD_LEVELS:
        raise ValueError(f"step_wise_grpo std_cal_level must be one of {_STD_LEVELS}, got {std_cal_level!r}")
    ep_inverse, last_row = _episode_rows(episode_ids, rewards.shape[0], rewards.device, "amax")
    returns, groups = rewards[last_row].float(), group_ids[last_row]
    if std_cal_level == "group":
        scores = _normalize_in_groups(returns, groups, "std", epsilon)
    else:
        centred = _normalize_in_groups(returns, groups, "none", 0.0)
        batch_std = returns.std() if returns.numel() > 1 else returns.new_ones(())
        scores = centred / (batch_std + epsilon) if std_cal_level == "batch" else centred
    if enable_step_norm:
        steps = torch.zeros_like(scores).scatter_add_(0, ep_inverse, torch.ones_like(rewards, dtype=scores.dtype))
        scores = scores / steps
    return broadcast_to_tokens(scores[ep_inverse], mask), None


@register_advantage("gigpo")
@torch.no_grad()
def gigpo(
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    omega: float,
    fnorm: str,
    epsilon: float,
    episode_ids: torch.Tensor | None = None,
    step_group_ids: torch.Tensor | None = None,
    step_rewards: torch.Tensor | None = None,
) -> AdvantageOutput:
    """GiGPO (group-in-group) advantages for multi-step episodes: ``A = A_E + omega * A_S``.

    Each row is one step (one model turn) of an episode.

    - Episode level ``A_E``: each episode's return (``rewards`` of its rows, counted once per episode)
      is normalized within its task group (``group_ids``).
    - Step level ``A_S``: each step's return-to-go (``step_rewards``) is normalized within its anchor-state
      group (``step_group_ids``: steps taken from the same environment state share an id; ``< 0`` = none).
      Anchor groups of one give 0.

    Normalization is ``(x - mean) / (denom + epsilon)`` with ``denom`` the group std for ``fnorm="std"`` and 1
    for ``fnorm="none"`` (GiGPO's default, mean-centering only).

    Args:
        episode_ids: ``[batch]`` int64, rows of one episode share it; default: every row is its own episode.
        step_group_ids: ``[batch]`` int64 anchor-state ids; default: no step-level term.
        step_rewards: ``[batch]`` discounted return from this step on; default: ``rewards`` (which equals it
            for a terminal-only reward and ``gamma = 1``).
    """
    _check_rows(rewards, mask, group_ids)
    if fnorm not in ("std", "none"):
        raise ValueError(f"gigpo fnorm must be 'std' or 'none', got {fnorm!r}")
    batch, device = rewards.shape[0], rewards.device
    ep_inverse, first_row = _episode_rows(episode_ids, batch, device, "amin")
    episode_adv = _normalize_in_groups(rewards[first_row], group_ids[first_row], fnorm, epsilon)[ep_inverse]

    step_adv = torch.zeros(batch, device=device)
    if step_group_ids is not None:
        returns_to_go = (rewards if step_rewards is None else step_rewards).float()
        anchored = step_group_ids >= 0
        if anchored.any():
            ids = step_group_ids[anchored]
            _mean, _std, count = group_stats(returns_to_go[anchored], ids)
            scores = _normalize_in_groups(returns_to_go[anchored], ids, fnorm, epsilon)
            step_adv[anchored] = torch.where(count < 2, torch.zeros_like(scores), scores)
    return broadcast_to_tokens(episode_adv + omega * step_adv, mask), None
