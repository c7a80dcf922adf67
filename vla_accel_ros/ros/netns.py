"""Two hosts on one machine: a Linux network namespace joined to this one by a veth pair.

``vla-accel sim --inference-mode remote --netns`` runs the inference node inside one, so its DDS
traffic crosses a real network interface. The namespace, the pair and their addresses are made
on entry and removed on exit (also after an error), so nothing is left behind. Needs root (or
CAP_NET_ADMIN) and ``ip`` from iproute2. DDS discovery between the two sides uses unicast peers
(``ROS_STATIC_PEERS``), which needs no multicast route across the pair.

:class:`NamespaceNetwork` is several hosts on one bridge, none of them this namespace:
``vla-accel fleet-bench --server ray --netns`` puts a Ray head, a Ray worker and the robots on it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from types import TracebackType
from typing import TypeVar

SUBNET = "10.212.{}.{}"  # a private /24 per namespace: 10.212.N.1 here, 10.212.N.2 inside


class NetworkNamespaceError(RuntimeError):
    pass


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetworkNamespaceError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


_Made = TypeVar("_Made", bound="_MadeWithIp")


class _MadeWithIp(ABC):
    """Links and namespaces made by :meth:`_make` on entering, removed by :meth:`remove` on exit and
    after a failed make."""

    @abstractmethod
    def _make(self) -> None: ...

    @abstractmethod
    def remove(self) -> None: ...

    def __enter__(self: _Made) -> _Made:
        try:
            self._make()
        except NetworkNamespaceError:
            self.remove()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()


class NetworkNamespace(_MadeWithIp):
    """``with NetworkNamespace("vla_accel_7") as ns: subprocess.Popen(ns.command([...]))``."""

    def __init__(self, name: str, index: int | None = None) -> None:
        if shutil.which("ip") is None:
            raise NetworkNamespaceError("--netns needs the ip command (iproute2)")
        self.name = name
        self.index = (index if index is not None else sum(map(ord, name))) % 250 + 1
        self.host_if, self.ns_if = f"vh{self.index}", f"vn{self.index}"
        self.host_ip, self.ns_ip = SUBNET.format(self.index, 1), SUBNET.format(self.index, 2)

    def _make(self) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _ip("link", "set", self.ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("netns", "exec", self.name, "ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if)
        _ip("netns", "exec", self.name, "ip", "link", "set", self.ns_if, "up")
        _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")

    def remove(self) -> None:
        """Delete the namespace (its end of the pair goes with it) and this end, if present."""
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", self.host_if], capture_output=True, check=False)

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def peers_env(self, inside: bool = False) -> dict[str, str]:
        """The environment that lets DDS on one side find the other (the other side's address)."""
        return {"ROS_STATIC_PEERS": self.host_ip if inside else self.ns_ip, "ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET"}


LAN_SUBNET = "10.213.0.{}"  # a NamespaceNetwork's hosts: .1, .2, ... (addresses inside its namespaces only)
STOP_GRACE_S = 10.0


class NamespaceNetwork(_MadeWithIp):
    """Several hosts on one machine: a network namespace per host, all on one /24 through a bridge
    that sits in a namespace of its own (the switch), so this namespace gets no link, address or
    route. ``with NamespaceNetwork("vla_ray_7", ("head", "worker")) as lan:
    subprocess.Popen(lan.command("head", [...]))``; ``lan.addresses["worker"]`` is that host's address.

    On exit (also after an error) every process still running in its namespaces is stopped by its
    id (SIGTERM, then SIGKILL after ``STOP_GRACE_S``), and the namespaces are deleted, their links
    with them. Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip`` from iproute2.
    """

    def __init__(self, prefix: str, hosts: tuple[str, ...]) -> None:
        if shutil.which("ip") is None:
            raise NetworkNamespaceError("--netns needs the ip command (iproute2)")
        if not hosts or len(set(hosts)) != len(hosts) or len(hosts) > 250:
            raise NetworkNamespaceError(f"a namespace network needs 1-250 distinct host names, got {hosts}")
        self.switch = f"{prefix}_lan"
        self.namespaces = {host: f"{prefix}_{host}" for host in hosts}
        self.addresses = {host: LAN_SUBNET.format(i + 1) for i, host in enumerate(hosts)}

    def _make(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (host, namespace) in enumerate(self.namespaces.items()):
            port = f"port{i}"
            _ip("netns", "add", namespace)
            _ip("link", "add", "eth0", "netns", namespace, "type", "veth", "peer", "name", port, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", namespace, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")

    def command(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run on ``host`` (inside its namespace)."""
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def pids(self) -> list[int]:
        """The processes running in the network's namespaces now."""
        found: list[int] = []
        for namespace in [*self.namespaces.values(), self.switch]:
            listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False)
            found += [int(p) for p in listed.stdout.split()] if listed.returncode == 0 else []
        return found

    def stop_processes(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to every process in the namespaces, SIGKILL to those left after ``grace_s``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)

    def remove(self) -> None:
        """Stop the processes inside, then delete every namespace (the links go with them)."""
        self.stop_processes()
        for namespace in [*self.namespaces.values(), self.switch]:
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)
