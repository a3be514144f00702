"""The project's own test hosts: network namespaces of this machine joined by a Linux bridge.

Each host is a namespace with its loopback up and one veth (`eth0` inside) on a private /24 (10.231.N.0/24),
plugged into a bridge that also carries an address in the root namespace, so the test process itself can dial
the hosts. The namespaces have no default route and the machine does not forward, so traffic stays on the
bridge and on each host's loopback. Names carry the creating pid: runs side by side do not collide, and a run
that was killed is recognised (its pid is gone) and its leftovers removed by the next one.

Commands run on a host through `ip netns exec` (which execs the command: the pid is the command's own), with
the death signal tied to the starting thread; `close()` kills every process by pid, then removes the veths, the
namespaces and the bridge, whatever state a failed test left them in.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trinity.runtime.redis_server import die_with_parent

PREFIX = "trinity-"
SUBNET = "10.231"
BRIDGE_HOST = 254  # the bridge's own address in each /24: the root namespace's way onto the test network
IFNAME = "eth0"  # every host's veth end has this name: GLOO_SOCKET_IFNAME is the same everywhere
_STOP_SECONDS = 20.0


class NetnsUnavailable(RuntimeError):
    """This machine cannot make test hosts (not root, no `ip`, no namespaces); the message says which."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done


def unavailable_reason() -> str | None:
    """Why test hosts cannot be made here, or None when they can (creating one still may fail: see `up`)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run the multi-host tests as root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) not found on PATH; install iproute2"
    return None


@dataclass
class NetnsHost:
    """One namespace: `address` is its eth0 address on the test network."""

    label: str
    netns: str
    address: str
    veth: str  # the root-namespace end, plugged into the bridge
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def popen(self, command: Sequence[str], *, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start `command` on this host, output appended to `log`; `HostNetwork.close()` stops it (if the caller
        has not)."""
        argv = die_with_parent(["ip", "netns", "exec", self.netns, *command])
        with log.open("ab") as sink:
            process = subprocess.Popen(
                argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT
            )
        self.processes.append(process)
        return process

    def run(self, command: Sequence[str], *, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *command], capture_output=True, text=True, timeout=timeout
        )

    def veth_bytes(self) -> int:
        """Bytes this host sent plus received over its veth (counted at the bridge end): proof of real traffic."""
        stats = Path("/sys/class/net") / self.veth / "statistics"
        return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())


def stop_processes(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to all at once (they drain side by side), SIGKILL to what is left after `_STOP_SECONDS`."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_SECONDS
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=_STOP_SECONDS)


@dataclass
class HostNetwork:
    """Start with `HostNetwork.up(["a", "b"])` (labels); `close()` tears everything down, idempotently."""

    bridge: str
    subnet: str  # "10.231.N"
    hosts: dict[str, NetnsHost] = field(default_factory=dict)

    @property
    def bridge_address(self) -> str:
        return f"{self.subnet}.{BRIDGE_HOST}"

    @classmethod
    def up(cls, labels: Sequence[str]) -> HostNetwork:
        if not labels or len(set(labels)) != len(labels) or len(labels) >= BRIDGE_HOST:
            raise ValueError(f"labels: distinct host names, 1 to {BRIDGE_HOST - 1} of them (got {list(labels)})")
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsUnavailable(reason)
        remove_stale()
        pid, subnet = os.getpid(), _free_subnet()
        # Named after the pid (whose death marks them stale) and the subnet number (unique among live networks,
        # so one test may make several); interface names have at most 15 characters.
        network = cls(bridge=f"tb{pid}-{subnet.rsplit('.', 1)[1]}", subnet=subnet)
        try:
            try:
                _ip("link", "add", network.bridge, "type", "bridge")
            except RuntimeError as err:
                raise NetnsUnavailable(f"cannot create a bridge here: {err}") from None
            _forwarding(network.bridge, "-I")
            _ip("addr", "add", f"{network.bridge_address}/24", "dev", network.bridge)
            _ip("link", "set", network.bridge, "up")
            for index, label in enumerate(labels):
                network._add_host(index, label, pid)
        except BaseException:
            network.close()
            raise
        return network

    def _add_host(self, index: int, label: str, pid: int) -> None:
        number = self.subnet.rsplit(".", 1)[1]
        netns, veth = f"{PREFIX}{pid}-{number}-{label}", f"tv{number}x{index}"
        host = NetnsHost(label, netns, f"{self.subnet}.{index + 1}", veth)
        try:
            _ip("netns", "add", host.netns)
        except RuntimeError as err:
            raise NetnsUnavailable(f"cannot create a network namespace here: {err}") from None
        self.hosts[label] = host  # from here on close() removes it
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", IFNAME, "netns", host.netns)
        _ip("link", "set", host.veth, "master", self.bridge)
        _ip("link", "set", host.veth, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", IFNAME)
        _ip("-n", host.netns, "link", "set", IFNAME, "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")

    def close(self) -> None:
        stop_processes([p for host in self.hosts.values() for p in host.processes])
        for host in self.hosts.values():
            # Deleting the veth first is synchronous; a namespace's devices otherwise go some time after it.
            _ip("link", "del", host.veth, check=False)
            _ip("netns", "del", host.netns, check=False)
        self.hosts.clear()
        _ip("link", "del", self.bridge, check=False)
        _forwarding(self.bridge, "-D")

    def __enter__(self) -> HostNetwork:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _forwarding(bridge: str, action: str) -> None:
    """Insert (`-I`) or delete (`-D`) an iptables rule that forwards frames between the bridge's own ports.

    Needed where br_netfilter sends bridged frames through iptables and FORWARD's policy is DROP, as a Docker
    engine (the container tests) leaves a machine: traffic between the test hosts would be dropped silently."""
    calls = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if shutil.which("iptables") is None or not calls.exists() or calls.read_text().strip() != "1":
        return
    rule = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
    subprocess.run(["iptables", "-w", action, *rule], capture_output=True, text=True, check=action == "-I")


def _free_subnet() -> str:
    """A 10.231.N prefix no interface of the root namespace uses (N from the pid, then onwards)."""
    used = set(re.findall(rf"{re.escape(SUBNET)}\.(\d+)\.", _ip("-4", "addr", "show").stdout))
    start = os.getpid() % 250
    for offset in range(250):
        candidate = str((start + offset) % 250 + 1)
        if candidate not in used:
            return f"{SUBNET}.{candidate}"
    raise NetnsUnavailable(f"every {SUBNET}.N.0/24 is in use on this machine")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> None:
    """Remove the namespaces and bridges of test runs whose process is gone (killed before its teardown)."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = re.fullmatch(rf"{re.escape(PREFIX)}(\d+)-.+", name)
        if match and not _alive(int(match.group(1))):
            _ip("netns", "del", name, check=False)
    for match in re.finditer(r"^\d+: (tb(\d+)-\d+)[:@]", _ip("-o", "link", "show", check=False).stdout, re.MULTILINE):
        if not _alive(int(match.group(2))):
            _ip("link", "del", match.group(1), check=False)
            _forwarding(match.group(1), "-D")
