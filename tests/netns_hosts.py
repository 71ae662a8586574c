"""Servers made of Linux network namespaces, for launches that cross real host boundaries.

`make_hosts(n, bw_bytes_per_s, latency_s)` makes n namespaces ("servers"), each with its own
address on a veth link to a switch namespace (a bridge), and shapes every server's outgoing
traffic as the cluster spec's inter_node link: `tc netem` (delay and rate) where the kernel has
it, else `tc tbf` (rate only; the link then has the veth's own latency, tens of microseconds,
and `Hosts.latency_s` says what was applied). A launcher script enters a server's namespace
instead of ssh'ing to it, so mpiexec's own bootstrap (Hydra: `-launcher ssh -launcher-exec`)
starts the proxies and ranks there. `unavailable()` says why namespaces cannot be made here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.213.{}.{}"  # private addresses that nothing else on a test machine uses
LAUNCHER = """#!/bin/sh
# Hydra's "ssh" with -launcher-exec: called as `SCRIPT [ssh options] HOST COMMAND...`;
# enters HOST's network namespace instead (HOST is a test server's address), with the
# server's own host name (MPI takes processes on one host name for one node: shared memory).
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
case "$host" in
{cases}
  *) echo "netns launcher: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && exec $*"
"""


@dataclass(frozen=True, kw_only=True)
class Hosts:
    namespaces: tuple[str, ...]  # one per server
    addresses: tuple[str, ...]  # the servers' addresses (their hostnames in the cluster spec)
    devices: tuple[str, ...]  # each server's veth (its link to the switch)
    switch: str  # the namespace of the bridge
    launcher: Path  # the -launcher-exec script
    latency_s: float  # the one-way delay applied (0.0 without netem)
    shaper: str  # "netem" or "tbf"

    def exec(self, i: int, *command: str) -> list[str]:
        """`command` run on server i (its network namespace and its own host name)."""
        ns = self.namespaces[i]
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", f'hostname {ns} && exec "$@"', "-", *command]

    def mpiexec_env(self, i: int) -> dict[str, str]:
        """What mpiexec needs, started on server i, to start ranks on the others through their namespaces."""
        return {
            "HYDRA_LAUNCHER": "ssh",
            "HYDRA_LAUNCHER_EXEC": str(self.launcher),
            "HYDRA_IFACE": self.devices[i],
            # UCX (mpich's network layer) sees one machine and would pass messages through shared memory, which
            # namespaces do not separate; real servers share none: TCP, as between servers without InfiniBand
            "UCX_TLS": "tcp,self",
        }

    def pids(self) -> list[int]:
        """Every process in any of the servers' namespaces."""
        out = []
        for ns in self.namespaces:
            done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
            out += [int(p) for p in done.stdout.split()]
        return out

    def link(self, i: int, up: bool) -> None:
        """Take server i's link down (or bring it back up)."""
        _ip(self.namespaces[i], "link", "set", self.devices[i], "up" if up else "down")


def unavailable() -> str | None:
    """Why namespaces cannot be made on this machine; None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (CI runs as root; run the suite as root to include these tests)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (install iproute2)"
    probe = f"llmp-probe-{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


def has_netem() -> bool:
    """Whether the kernel has the netem queueing discipline (delay); probed on a throwaway namespace."""
    probe = f"llmp-netem-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", probe], check=True)
    try:
        _ip(probe, "link", "set", "lo", "up")
        done = subprocess.run(
            ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True,
            check=False,
        )
        return done.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", probe], check=False)


def _ip(ns: str, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "ip", *args], check=True, capture_output=True, text=True)


def _shape(ns: str, dev: str, bw_bytes_per_s: float, latency_s: float, netem: bool) -> None:
    rate = f"{int(bw_bytes_per_s * 8)}bit"
    if netem:
        qdisc = ["netem", "delay", f"{latency_s * 1e6:.0f}us", "rate", rate, "limit", "100000"]
    else:  # a bucket of two packets (no burst passes at line rate) and a queue deep enough that nothing is dropped
        qdisc = ["tbf", "rate", rate, "burst", "3028", "limit", "64mb"]
    cmd = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *qdisc]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def make_hosts(n: int, bw_bytes_per_s: float, latency_s: float, workdir: Path) -> Iterator[Hosts]:
    """n servers behind one switch, each link shaped; on exit every process in them is killed and they are removed."""
    tag = f"{os.getpid() % 100000}"
    net = os.getpid() % 250 + 1
    switch = f"llmp{tag}-sw"
    names = tuple(f"llmp{tag}-h{i}" for i in range(n))
    addresses = tuple(SUBNET.format(net, i + 1) for i in range(n))
    devices = tuple(f"h{i}" for i in range(n))
    netem = has_netem()
    made: list[str] = []
    try:
        for ns in (switch, *names):
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
            made.append(ns)
            _ip(ns, "link", "set", "lo", "up")
        _ip(switch, "link", "add", "br0", "type", "bridge")
        _ip(switch, "link", "set", "br0", "up")
        for i, ns in enumerate(names):
            # made in the switch, one end moved into the server's namespace
            _ip(switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", devices[i])
            _ip(switch, "link", "set", devices[i], "netns", ns)
            _ip(switch, "link", "set", f"p{i}", "master", "br0")
            _ip(switch, "link", "set", f"p{i}", "up")
            _ip(ns, "addr", "add", f"{addresses[i]}/24", "dev", devices[i])
            _ip(ns, "link", "set", devices[i], "up")
            _shape(ns, devices[i], bw_bytes_per_s, latency_s, netem)
        cases = "\n".join(f"  {a}) ns={ns} ;;" for a, ns in zip(addresses, names))
        launcher = workdir / "netns-launcher.sh"
        launcher.write_text(LAUNCHER.format(cases=cases))
        launcher.chmod(0o755)
        yield Hosts(
            namespaces=names,
            addresses=addresses,
            devices=devices,
            switch=switch,
            launcher=launcher,
            latency_s=latency_s if netem else 0.0,
            shaper="netem" if netem else "tbf",
        )
    finally:
        _remove(made)


def _remove(namespaces: list[str]) -> None:
    """Kill what runs in the namespaces (the tests must leave nothing; this is the last resort), then remove them."""
    for ns in namespaces:
        done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
        for pid in done.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    time.sleep(0.1)
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
