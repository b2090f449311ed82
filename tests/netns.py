"""Hosts on one machine: Linux network namespaces on a private bridge, for the scale-out test.

Each host is a namespace `ap-so-<pid>-<role>` with its own loopback and one
interface (`eth0`, 10.213.N.k/24) on a bridge that lives in a namespace of its
own (`ap-so-<pid>-net`); the test process reaches them through one veth
(`apso<pid>`, 10.213.N.1). Nothing else on the machine is touched, and no
traffic leaves it. `ip netns exec` separates the network only: processes still
share the file system, which is why the test gives each host a checkout of its own.

Cleanup kills every process in each namespace and deletes them; namespaces left
by a test process that died (its pid is in their name) are removed the next time.
"""

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "ap-so-"
_OWNED = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run as root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def pids(netns: str) -> list[int]:
    out = _ip("netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split()]


def kill_all(netns: str) -> list[int]:
    """SIGKILL every process in the namespace at once (a host losing power)."""
    found = pids(netns)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found


def _remove(netns: str) -> None:
    for _ in range(50):
        if not kill_all(netns):
            break
        time.sleep(0.1)
    _ip("netns", "del", netns, check=False)


def remove_stale() -> None:
    """Namespaces of ours whose test process is gone."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _OWNED.match(name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            _remove(name)
            _ip("link", "del", f"apso{match.group(1)}", check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.213.0.0/16 that no interface or route of this machine uses."""
    taken = _ip("-4", "route", "show", "table", "all", check=False).stdout
    taken += _ip("-4", "addr", "show", check=False).stdout
    start = os.getpid() % 200 + 20
    for third in [*range(start, 250), *range(20, start)]:
        net = ipaddress.IPv4Network(f"10.213.{third}.0/24")
        if f"10.213.{third}." not in taken:
            return net
    raise RuntimeError("no free /24 in 10.213.0.0/16")


@dataclass
class Host:
    role: str
    netns: str
    address: str


@dataclass
class Network:
    """The hosts, made by `up()` and removed by `down()` (idempotent)."""

    roles: Sequence[str]
    tag: str = field(default_factory=lambda: str(os.getpid()))
    hosts: dict[str, Host] = field(default_factory=dict)
    driver_address: str = ""

    @property
    def bridge_ns(self) -> str:
        return f"{PREFIX}{self.tag}-net"

    @property
    def driver_link(self) -> str:
        return f"apso{self.tag}"[:15]

    def up(self) -> None:
        remove_stale()
        subnet = _free_subnet()
        addresses = [str(a) for a in subnet.hosts()]
        self.driver_address = addresses[0]
        _ip("netns", "add", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "dev", "br0", "up")
        for index, role in enumerate(self.roles, start=1):
            host = Host(role, f"{PREFIX}{self.tag}-{role}", addresses[index])
            _ip("netns", "add", host.netns)
            self.hosts[role] = host
            port = f"v-{role}"[:15]
            _ip("link", "add", "eth0", "netns", host.netns, "type", "veth", "peer", "name", port, "netns", self.bridge_ns)  # fmt: skip
            _ip(
                "-n", host.netns, "addr", "add", f"{host.address}/{subnet.prefixlen}", "dev", "eth0"
            )
            _ip("-n", host.netns, "link", "set", "dev", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "dev", "lo", "up")
            _ip("-n", self.bridge_ns, "link", "set", "dev", port, "master", "br0", "up")
        _ip("link", "add", self.driver_link, "type", "veth", "peer", "name", "v-driver", "netns", self.bridge_ns)  # fmt: skip
        _ip("addr", "add", f"{self.driver_address}/{subnet.prefixlen}", "dev", self.driver_link)
        _ip("link", "set", "dev", self.driver_link, "up")
        _ip("-n", self.bridge_ns, "link", "set", "dev", "v-driver", "master", "br0", "up")

    def down(self) -> None:
        for host in self.hosts.values():
            _remove(host.netns)
        _ip("link", "del", self.driver_link, check=False)
        _remove(self.bridge_ns)
        self.hosts.clear()

    def __getitem__(self, role: str) -> Host:
        return self.hosts[role]

    def command(self, role: str, argv: Sequence[str]) -> list[str]:
        """`argv` run on the host `role`."""
        return ["ip", "netns", "exec", self.hosts[role].netns, *argv]


@contextlib.contextmanager
def network(roles: Sequence[str]) -> Iterator[Network]:
    net = Network(roles)
    try:
        net.up()
        yield net
    finally:
        net.down()
