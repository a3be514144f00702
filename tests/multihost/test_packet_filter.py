"""The packet filters of the network-fault tests on real test hosts: a partition is silence both ways (no refusal,
no reset) until it heals, isolation cuts the root namespace off too, and a detour takes a host's connections to a
service to another address."""

from __future__ import annotations

import socket
import sys

import pytest

from tests.multihost import packet_filter
from tests.multihost.netns import NetnsHost
from tests.multihost.packet_filter import detour, partitioned

pytestmark = pytest.mark.skipif(
    packet_filter.unavailable_reason() is not None, reason=str(packet_filter.unavailable_reason())
)

CLOSED_PORT = 9  # nothing listens there: a reachable host refuses at once, a cut-off one stays silent
PROBE = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5)\n"
    "    print('connected')\n"
    "except ConnectionRefusedError:\n"
    "    print('refused')\n"
    "except TimeoutError:\n"
    "    print('silent')\n"
)


def _dial(host: NetnsHost, address: str, port: int = CLOSED_PORT) -> str:
    return host.run([sys.executable, "-c", PROBE, address, str(port)]).stdout.strip()


def _dial_from_root(address: str) -> str:
    try:
        socket.create_connection((address, CLOSED_PORT), timeout=1.5).close()
        return "connected"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "silent"


def test_a_partition_is_silence_both_ways_until_it_heals(network):
    net = network(["a", "b", "c"])
    a, b, c = (net.hosts[label] for label in ("a", "b", "c"))
    with partitioned([a], [b]):
        assert (_dial(a, b.address), _dial(b, a.address)) == ("silent", "silent")
        assert (_dial(a, c.address), _dial(c, a.address)) == ("refused", "refused")  # only a | b is cut
    assert (_dial(a, b.address), _dial(b, a.address)) == ("refused", "refused")


def test_an_isolated_host_is_cut_off_from_the_root_namespace_too(network):
    net = network(["a", "b"])
    a, b = net.hosts["a"], net.hosts["b"]
    with partitioned([a], [b], isolate=True):
        assert (_dial(b, a.address), _dial_from_root(a.address)) == ("silent", "silent")
    assert (_dial(b, a.address), _dial_from_root(a.address)) == ("refused", "refused")


def test_a_detour_takes_a_hosts_connections_to_another_address(network):
    net = network(["a", "b"])
    a, b = net.hosts["a"], net.hosts["b"]
    with socket.create_server((net.bridge_address, 0)) as listener:  # in the root namespace, on the bridge
        detour(a, {(b.address, CLOSED_PORT): (net.bridge_address, listener.getsockname()[1])})
        assert _dial(a, b.address) == "connected"
        assert _dial(b, b.address) == "refused"  # only `a`'s connections are rewritten


@pytest.mark.parametrize("sides", [([], ["x"]), (["x"], ["x"])])
def test_a_partition_needs_two_disjoint_sets_of_hosts(network, sides):
    net = network(["x"])
    hosts = {"x": net.hosts["x"]}
    with pytest.raises(ValueError, match="two disjoint"), partitioned(*([hosts[h] for h in s] for s in sides)):
        pass
