"""Hosts on one machine: a network namespace per host, each with its own address on a bridge.

The bridge lives in a namespace of its own (the "switch"); the runner (the control node, as in
Jepsen) has an address on it too. A host is partitioned by taking its switch port down: its
packets are dropped silently, as on a real network, and its TCP connections hang until it heals
(``tc netem`` and iptables are not available on these machines; a blackhole route would fail
writes at once instead of dropping them). Every namespace and every process in one is removed by
:meth:`Network.teardown`, whatever state a trial left.
"""

import os
import signal
import subprocess
import time
from collections.abc import Sequence

from testkit.system_tools import require


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("ip")["ip"], *args], check=check, capture_output=True, text=True, timeout=30
    )


class Network:
    """``Network(tag, {"db": 2, ...}, subnet="10.77.5")``: host ``db`` gets ``10.77.5.2``, and
    so on; the control node (this process) ``.1``. Two harnesses running at once need two
    subnets: the control node's address lives in the machine's own namespace."""

    def __init__(self, tag: str, hosts: dict[str, int], subnet: str) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("the cluster harness makes network namespaces: run it as root")
        self.tag = tag
        self.subnet = subnet
        self.control_address = f"{subnet}.1"
        self.hosts = {name: f"{subnet}.{number}" for name, number in hosts.items()}
        self.switch = f"{tag}-switch"
        self.control_link = f"{tag}c"
        self.partitioned: set[str] = set()

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def address(self, host: str) -> str:
        return self.hosts[host]

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def create(self) -> None:
        self.teardown()  # a namespace of an earlier run that died with this tag
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        _ip("link", "add", self.control_link, "type", "veth", "peer", "name", "ctl")
        _ip("link", "set", "ctl", "netns", self.switch)
        self._attach("ctl")
        _ip("addr", "add", f"{self.control_address}/24", "dev", self.control_link)
        _ip("link", "set", self.control_link, "up")
        for host, address in self.hosts.items():
            ns = self.namespace(host)
            _ip("netns", "add", ns)
            temporary = f"{self.tag}t"
            _ip("link", "add", temporary, "type", "veth", "peer", "name", f"p-{host}")
            _ip("link", "set", f"p-{host}", "netns", self.switch)
            self._attach(f"p-{host}")
            _ip("link", "set", temporary, "netns", ns)
            _ip("-n", ns, "link", "set", temporary, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def _attach(self, port: str) -> None:
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")

    def partition(self, host: str) -> None:
        """Cut ``host`` off from every other host (and the control node)."""
        _ip("-n", self.switch, "link", "set", f"p-{host}", "down")
        self.partitioned.add(host)

    def heal(self, host: str | None = None) -> None:
        for name in [host] if host else sorted(self.partitioned):
            _ip("-n", self.switch, "link", "set", f"p-{name}", "up")
            self.partitioned.discard(name)

    def pids(self, host: str) -> list[int]:
        found = _ip("netns", "pids", self.namespace(host), check=False).stdout.split()
        return [int(pid) for pid in found if pid.isdigit()]

    def kill_all(self, host: str) -> None:
        for _ in range(50):
            pids = self.pids(host)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def teardown(self) -> None:
        existing = set(_ip("netns", "list", check=False).stdout.split())
        for host in self.hosts:
            if self.namespace(host) in existing:
                self.kill_all(host)
                _ip("netns", "del", self.namespace(host), check=False)
        if self.switch in existing:
            _ip("netns", "del", self.switch, check=False)
        _ip("link", "del", self.control_link, check=False)
        self.partitioned.clear()
