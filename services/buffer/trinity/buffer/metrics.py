"""Prometheus metrics of the Buffer: counters on the hot path, gauges read from Redis at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from trinity.buffer.store import BufferStore

PUT = Counter("trinity_buffer_put_total", "Experiences appended", ["stream"])
DELIVERED = Counter("trinity_buffer_delivered_total", "Experiences delivered to consumers", ["stream"])
ACKED = Counter("trinity_buffer_acked_total", "Experiences acknowledged", ["stream"])
DROPPED = Counter("trinity_buffer_dropped_total", "Experiences dropped, by reason", ["stream", "reason"])
TASKS_LEASED = Counter("trinity_buffer_tasks_leased_total", "Tasks handed out under a lease", ["taskset"])
TASKS_COMPLETED = Counter("trinity_buffer_tasks_completed_total", "Task leases completed", ["taskset"])


GAUGES: tuple[tuple[Literal["length", "pending", "lag", "dead_letters"], str], ...] = (
    ("length", "Entries in the stream"),
    ("pending", "Delivered, not yet acknowledged"),
    ("lag", "Entries not yet delivered to the consumer group"),
    ("dead_letters", "Entries moved to the dead-letter stream"),
)


class StreamGauges(Collector):
    """Length, pending, lag and dead letters per stream, read from Redis when Prometheus scrapes."""

    def __init__(self, store: BufferStore) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            name: GaugeMetricFamily(f"trinity_buffer_stream_{name}", help_text, labels=["stream"])
            for name, help_text in GAUGES
        }
        try:
            for name in self.store.stream_names():
                stats = self.store.stream(name).stats()
                for key, family in families.items():
                    family.add_metric([name], float(stats[key]))
        except Exception:  # noqa: BLE001 - a scrape during a Redis outage reports what it has
            pass
        yield from families.values()


_registered: list[StreamGauges] = []


def register_gauges(store: BufferStore) -> StreamGauges:
    """One collector per process: a second buffer in the same process (tests) replaces the first."""
    while _registered:
        REGISTRY.unregister(_registered.pop())
    collector = StreamGauges(store)
    REGISTRY.register(collector)
    _registered.append(collector)
    return collector
