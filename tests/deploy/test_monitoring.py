"""deploy/monitoring: Prometheus scrapes every Trinity service of the compose stack at its metrics port, and
every query of the Grafana dashboard names metrics the services really export (their own registries)."""

from __future__ import annotations

import importlib
import json
import re

import yaml
from prometheus_client import REGISTRY

from tests.deploy.compose import BASE, ROOT, mounts, resolved

MONITORING = ROOT / "deploy" / "monitoring"
SERVICE_METRICS = [
    "trinity.gateway.metrics",
    "trinity.buffer.metrics",
    "trinity.trainer.metrics",
    "trinity.explorer.metrics",
    "trinity.trackers.metrics",
]


def _exported_names() -> set[str]:
    """Every series name the services' metric modules define, with the suffixes Prometheus sees."""
    for module in SERVICE_METRICS:
        importlib.import_module(module)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = {"trinity_gateway_runs"}  # a gauge collected from Redis at scrape time (RunsByState)
    for family in REGISTRY.collect():
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


def test_prometheus_scrapes_every_trinity_service_at_its_metrics_port():
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    services = resolved(BASE)["services"]
    targets = {}
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            targets[job["job_name"]] = static["targets"]
        for dns in job.get("dns_sd_configs", []):
            targets[job["job_name"]] = [f"{name}:{dns['port']}" for name in dns["names"]]
    for name in ("gateway", "buffer", "trainer", "explorer", "trackers"):
        assert targets[name] == [f"{name}:{services[name]['environment']['TRINITY_METRICS_PORT']}"], name


def test_every_dashboard_query_names_exported_metrics_and_every_service_is_shown():
    dashboard = json.loads((MONITORING / "grafana" / "dashboards" / "trinity.json").read_text())
    exported = _exported_names()
    shown = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            names = set(re.findall(r"\b(trinity_[a-z0-9_]+)", expr))
            assert names, f"panel {panel['title']!r} queries no Trinity metric: {expr}"
            missing = names - exported
            assert not missing, f"panel {panel['title']!r} queries metrics no service exports: {missing}"
            shown |= {n.split("_")[1] for n in names}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert shown == {"gateway", "buffer", "trainer", "explorer"}


def test_the_monitoring_profile_mounts_the_checked_files():
    services = resolved(BASE)["services"]
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["monitoring"]
    prometheus = {m.target: m.source for m in mounts(services["prometheus"])}
    assert prometheus["/etc/prometheus/prometheus.yml"] == str(MONITORING / "prometheus.yml")
    grafana = {m.target: m.source for m in mounts(services["grafana"])}
    assert grafana["/var/lib/grafana/dashboards"] == str(MONITORING / "grafana" / "dashboards")
    assert grafana["/etc/grafana/provisioning"] == str(MONITORING / "grafana" / "provisioning")
