"""The trackers service's own Prometheus metrics, served on its `/metrics` endpoint beside the process metrics."""

from __future__ import annotations

from prometheus_client import Counter

TRACKER_POINTS = Counter("trinity_trackers_points_total", "Metric points written, by tracker", ["tracker"])
TRACKER_FAILURES = Counter(
    "trinity_trackers_failures_total", "Trackers dropped from a run after an error, by tracker", ["tracker"]
)
