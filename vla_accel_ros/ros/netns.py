"""Two hosts on one machine: a Linux network namespace joined to this one by a veth pair.

``vla-accel sim --inference-mode remote --netns`` runs the inference node inside one, so its DDS
traffic crosses a real network interface. The namespace, the pair and their addresses are made
on entry and removed on exit (also after an error), so nothing is left behind. Needs root (or
CAP_NET_ADMIN) and ``ip`` from iproute2. DDS discovery between the two sides uses unicast peers
(``ROS_STATIC_PEERS``), which needs no multicast route across the pair.
"""

from __future__ import annotations

import shutil
import subprocess
from types import TracebackType

SUBNET = "10.212.{}.{}"  # a private /24 per namespace: 10.212.N.1 here, 10.212.N.2 inside


class NetworkNamespaceError(RuntimeError):
    pass


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetworkNamespaceError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


class NetworkNamespace:
    """``with NetworkNamespace("vla_accel_7") as ns: subprocess.Popen(ns.command([...]))``."""

    def __init__(self, name: str, index: int | None = None) -> None:
        if shutil.which("ip") is None:
            raise NetworkNamespaceError("--netns needs the ip command (iproute2)")
        self.name = name
        self.index = (index if index is not None else sum(map(ord, name))) % 250 + 1
        self.host_if, self.ns_if = f"vh{self.index}", f"vn{self.index}"
        self.host_ip, self.ns_ip = SUBNET.format(self.index, 1), SUBNET.format(self.index, 2)

    def __enter__(self) -> NetworkNamespace:
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("netns", "exec", self.name, "ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if)
            _ip("netns", "exec", self.name, "ip", "link", "set", self.ns_if, "up")
            _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
        except NetworkNamespaceError:
            self.remove()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()

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
