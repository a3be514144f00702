"""The test hosts themselves: real traffic between namespaces over the bridge, nothing beyond it, and a
teardown that leaves nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multihost.netns import IFNAME, HostNetwork, remove_stale, unavailable_reason

GLOO_RANK = Path(__file__).with_name("gloo_rank.py")
ELEMENTS = 1 << 20  # 4 MiB of float32: far more than any chatter of the rendezvous


def _netns_names() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def test_a_gloo_group_all_reduces_across_two_hosts(network, tmp_path):
    net = network(["a", "b"])
    a, b = net.hosts["a"], net.hosts["b"]
    before = {host.label: host.veth_bytes() for host in (a, b)}
    env = {**os.environ, "GLOO_SOCKET_IFNAME": IFNAME, "MASTER_ADDR": a.address, "MASTER_PORT": "29500"}
    env["WORLD_SIZE"] = "2"
    ranks = [
        host.popen([sys.executable, str(GLOO_RANK), str(ELEMENTS)], env={**env, "RANK": str(rank)}, log=log)
        for rank, (host, log) in enumerate([(a, tmp_path / "rank0.log"), (b, tmp_path / "rank1.log")])
    ]
    for rank, process in enumerate(ranks):
        assert process.wait(timeout=120) == 0, (tmp_path / f"rank{rank}.log").read_text()
    results = [json.loads((tmp_path / f"rank{rank}.log").read_text().splitlines()[-1]) for rank in (0, 1)]
    assert [(r["rank"], r["min"], r["max"]) for r in results] == [(0, 3.0, 3.0), (1, 3.0, 3.0)]
    # Each rank sent and received its half of the tensor twice (reduce-scatter, all-gather) over its veth.
    for host in (a, b):
        assert host.veth_bytes() - before[host.label] >= ELEMENTS * 4, f"{host.label}: too little traffic on its veth"


def test_a_host_reaches_the_others_but_not_the_root_namespace_loopback(network):
    net = network(["a", "b"])
    with socket.socket() as listener:  # on the root namespace's loopback: no host may see it
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)"
        refused = net.hosts["a"].run([sys.executable, "-c", probe, "127.0.0.1", str(port)])
        assert refused.returncode != 0 and "ConnectionRefusedError" in refused.stderr
    routes = net.hosts["a"].run(["ip", "route"]).stdout
    assert "default" not in routes and f"{net.subnet}.0/24" in routes
    reached = net.hosts["a"].run([sys.executable, "-c", probe, net.hosts["b"].address, "9"])
    assert "ConnectionRefusedError" in reached.stderr  # b answered (nothing listens on port 9): it is reachable


def test_close_stops_processes_and_removes_namespaces_and_bridge(network, tmp_path):
    net = network(["a", "b"])
    sleeper = net.hosts["b"].popen(["sleep", "600"], env=os.environ, log=tmp_path / "sleep.log")
    names = {host.netns for host in net.hosts.values()}
    assert names <= _netns_names() and _link_exists(net.bridge)
    net.close()
    assert sleeper.returncode is not None
    assert not names & _netns_names()
    assert not _link_exists(net.bridge)
    net.close()  # twice is harmless: fixtures close whatever a test left open


def test_one_test_may_make_two_networks_side_by_side(network):
    first, second = network(["a"]), network(["a"])
    assert first.subnet != second.subnet and first.bridge != second.bridge
    assert first.hosts["a"].netns != second.hosts["a"].netns
    assert {first.hosts["a"].netns, second.hosts["a"].netns} <= _netns_names()


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_leftovers_of_a_killed_run_are_removed():
    dead = subprocess.Popen(["true"])
    dead.wait()
    netns, bridge = f"trinity-{dead.pid}-9-x", f"tb{dead.pid}-9"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    try:
        remove_stale()
        assert netns not in _netns_names()
        assert not _link_exists(bridge)
    finally:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@pytest.mark.parametrize("labels", [[], ["a", "a"]])
def test_the_network_is_refused_for_bad_labels(labels):
    with pytest.raises(ValueError, match="labels: distinct host names"):
        HostNetwork.up(labels)
