"""The gateway's own Prometheus metrics, served on the service's `/metrics` endpoint beside the process metrics."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from trinity.v1 import gateway_pb2

if TYPE_CHECKING:  # the run store records events here: a runtime import would be circular
    from trinity.gateway.runs import RunStore

EVENTS = Counter("trinity_gateway_events_total", "Run events recorded, by kind", ["kind"])
SYNC_GROUPS_FORMED = Counter("trinity_gateway_sync_groups_formed_total", "Weight-sync generations that became ready")


class RunsByState(Collector):
    """`trinity_gateway_runs{state=...}`, read from Redis at scrape time: right after a gateway restart too."""

    def __init__(self, runs: RunStore) -> None:
        self.runs = runs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("trinity_gateway_runs", "Runs by state", labels=["state"])
        counts = Tally(int(run.state) for run in self.runs.all())
        for name, value in gateway_pb2.RunState.items():
            if value != gateway_pb2.RUN_STATE_UNSPECIFIED:
                family.add_metric([name.removeprefix("RUN_STATE_").lower()], counts[value])
        yield family


def export_runs(runs: RunStore) -> None:
    REGISTRY.register(RunsByState(runs))
