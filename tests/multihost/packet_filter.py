"""Packet filters on the test hosts (nftables inside their namespaces): partitions and detours.

A partition drops, on each side's input, every packet from the other side: nothing is refused, nothing is reset,
the senders see silence and their TCP retransmits, as behind a dead switch port. (Dropping on output would not be
silent: the kernel fails the sender's own `send` with EPERM.) Healing deletes the rules; established connections
then carry on where TCP's back-off lets them. The rules live in the namespaces only, so the root namespace's own
filters are never touched, and they go with the namespaces at `HostNetwork.close()` whatever happened.

A detour rewrites, in one host's output, connections to a service's address and port so that they reach a fault
proxy's instead (DNAT): the service keeps dialing the address it was given, its link goes through the proxy.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from tests.multihost.netns import IFNAME, NetnsHost

PARTITION_TABLE = "trinity_partition"
DETOUR_TABLE = "trinity_detour"

Address = tuple[str, int]


def unavailable_reason() -> str | None:
    """Why packet filters cannot be set here, or None (a kernel without nf_tables still fails at `nft`)."""
    if shutil.which("nft") is None:
        return "`nft` (nftables) not found on PATH; install nftables"
    return None


def nft(host: NetnsHost, script: str) -> None:
    """Apply an nft script inside `host`'s namespace, atomically (all of it or none)."""
    done = subprocess.run(
        ["ip", "netns", "exec", host.netns, "nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        raise RuntimeError(f"nft on {host.label}: {done.stderr.strip() or f'exit code {done.returncode}'}\n{script}")


def _drop_from(host: NetnsHost, sources: Sequence[str] | None) -> str:
    """The table that drops `host`'s input from `sources` (None: everything that arrives over its eth0)."""
    match = f'iifname "{IFNAME}"' + (f" ip saddr {{ {', '.join(sources)} }}" if sources is not None else "")
    return (
        f"table inet {PARTITION_TABLE} {{\n"
        f"  chain input {{ type filter hook input priority -10; policy accept; {match} drop; }}\n"
        "}\n"
    )


def _remove(host: NetnsHost, table: str) -> None:
    # `check` off: the namespace may be gone already (its rules with it).
    subprocess.run(
        ["ip", "netns", "exec", host.netns, "nft", "delete", "table", table], capture_output=True, timeout=30
    )


@contextmanager
def partitioned(side: Sequence[NetnsHost], other: Sequence[NetnsHost], *, isolate: bool = False) -> Iterator[None]:
    """While the block runs, no packet passes between the hosts of `side` and those of `other`; healed at its end.

    `isolate`: `side` also hears nothing from anywhere else over the bridge (the root namespace included), the way
    a host whose only link died hears nothing; `other` should then be every other host of the network."""
    if not side or not other or {h.netns for h in side} & {h.netns for h in other}:
        raise ValueError("a partition needs two disjoint, non-empty sets of hosts")
    installed: list[NetnsHost] = []
    try:
        for host in side:
            nft(host, _drop_from(host, None if isolate else [h.address for h in other]))
            installed.append(host)
        for host in other:
            nft(host, _drop_from(host, [h.address for h in side]))
            installed.append(host)
        yield
    finally:
        for host in installed:
            _remove(host, f"inet {PARTITION_TABLE}")


def detour(host: NetnsHost, routes: Mapping[Address, Address]) -> None:
    """From now on, connections that `host` opens to each key (address, port) go to its value instead (a proxy's
    address and port). Replaces `host`'s earlier detours."""
    rules = "".join(f"    ip daddr {a} tcp dport {p} dnat to {to}:{q};\n" for (a, p), (to, q) in routes.items())
    _remove(host, f"ip {DETOUR_TABLE}")
    nft(
        host,
        f"table ip {DETOUR_TABLE} {{\n  chain output {{\n    type nat hook output priority -100; policy accept;\n"
        f"{rules}  }}\n}}\n",
    )
