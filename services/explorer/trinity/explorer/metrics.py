"""The explorer's own Prometheus metrics, served on the service's `/metrics` endpoint beside the process metrics."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter, Gauge

ROLLOUT_STEPS = Counter("trinity_explorer_rollout_steps_total", "Explore steps put to the buffer")
EXPERIENCES = Counter("trinity_explorer_experiences_total", "Experiences produced")
ROLLOUT_TOKENS_PER_SECOND = Gauge(
    "trinity_explorer_rollout_tokens_per_second", "Response tokens per second of the last explore step"
)
REWARD_MEAN = Gauge("trinity_explorer_reward_mean", "Mean reward of the last explore step")
WEIGHT_VERSION = Gauge("trinity_explorer_weight_version", "Weight version the engine serves")
DIGEST_MATCH = Gauge(
    "trinity_explorer_weights_digest_match", "1 when the last weights loaded have the digest the trainer published"
)
STALENESS = Gauge("trinity_explorer_staleness", "Explore steps between the served weights and the step being sampled")
JUDGE_FALLBACKS = Counter(
    "trinity_explorer_judge_fallbacks_total", "Responses given the fallback reward because the judge failed"
)
DROPPED_ROLLOUTS = Counter(
    "trinity_explorer_dropped_rollouts_total",
    "Rollouts dropped after their last attempt failed, by reason (timeout, error:<ExceptionType>)",
    ["reason"],
)
ROLLOUT_RETRIES = Counter("trinity_explorer_rollout_retries_total", "Failed rollout attempts run again")
LEASES_LOST = Counter(
    "trinity_explorer_leases_lost_total", "Task leases found held elsewhere (or ended) while their rollouts ran"
)
ENGINE_QUEUE = Gauge("trinity_explorer_engine_queue", "Samples submitted to the engine and not yet returned")


def record_rollout(metrics: Mapping[str, float], experiences: int, step: int, version: int) -> None:
    """Export one explore step from the metrics dict it reports as its `explore` event."""
    ROLLOUT_STEPS.inc()
    EXPERIENCES.inc(experiences)
    ROLLOUT_TOKENS_PER_SECOND.set(metrics["tokens_per_second"])
    REWARD_MEAN.set(metrics["reward_mean"])
    STALENESS.set(max(step - version, 0))
