"""The trainer's own Prometheus metrics, served on the service's `/metrics` endpoint beside the process metrics."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter, Gauge, Histogram

_SECONDS = (0.1, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320)

STEPS = Counter("trinity_trainer_steps_total", "Train steps committed")
STEP_SECONDS = Histogram("trinity_trainer_step_seconds", "Wall time of one train step", buckets=_SECONDS)
TOKENS_PER_SECOND = Gauge("trinity_trainer_tokens_per_second", "Tokens trained per second in the last step")
LOSS = Gauge("trinity_trainer_loss", "Total loss of the last step")
GRAD_NORM = Gauge("trinity_trainer_grad_norm", "Gradient norm of the last step (before clipping)")
SYNC_SECONDS = Histogram("trinity_trainer_sync_seconds", "Seconds to publish one weight version", buckets=_SECONDS)
SYNC_BYTES = Counter("trinity_trainer_sync_bytes_total", "Bytes of weights published to the explorers")
CHECKPOINT_SECONDS = Histogram("trinity_trainer_checkpoint_seconds", "Seconds to write a checkpoint", buckets=_SECONDS)
PUBLISHED_VERSION = Gauge("trinity_trainer_published_version", "Weight version last published to the explorers")
# The train-vs-rollout probe of the last step (docs/trainer.md): trainer against sampler log-probs of sampled tokens.
LOGPROB_DIFF = Gauge(
    "trinity_trainer_rollout_logprob_diff", "|trainer - sampler| log-prob of the last step's sampled tokens", ["stat"]
)
K3_KL = Gauge("trinity_trainer_rollout_k3_kl", "k3 estimate of KL(sampler || trainer) over the last step's tokens")
RATIO_OUTSIDE = Gauge(
    "trinity_trainer_rollout_ratio_outside_share", "Share of the last step's tokens whose ratio left the band"
)
VERSION_LAG = Gauge("trinity_trainer_version_lag", "Trainer version minus the oldest sampler version of the last batch")
STALENESS = Gauge("trinity_trainer_staleness", "Train steps between the last batch's sampler versions and it", ["stat"])

_GAUGES = (
    (TOKENS_PER_SECOND, "tokens_per_s"),
    (LOSS, "loss/total"),
    (GRAD_NORM, "grad_norm"),
    (LOGPROB_DIFF.labels("mean"), "consistency/logprob_diff_mean"),
    (LOGPROB_DIFF.labels("max"), "consistency/logprob_diff_max"),
    (K3_KL, "consistency/k3_kl"),
    (RATIO_OUTSIDE, "consistency/ratio_outside_share"),
    (VERSION_LAG, "consistency/version_lag_max"),
    (STALENESS.labels("mean"), "staleness/mean"),
    (STALENESS.labels("max"), "staleness/max"),
)


def record_step(metrics: Mapping[str, float]) -> None:
    """Export one committed step from the metrics dict the step reports as its `train` event."""
    STEPS.inc()
    STEP_SECONDS.observe(metrics.get("seconds", metrics.get("step_seconds", 0.0)))
    for gauge, key in _GAUGES:
        if key in metrics:
            gauge.set(metrics[key])
    if "sync_seconds" in metrics:
        SYNC_SECONDS.observe(metrics["sync_seconds"])
        SYNC_BYTES.inc(metrics.get("sync_bytes", 0.0))
        if "model_version" in metrics:
            PUBLISHED_VERSION.set(metrics["model_version"])
