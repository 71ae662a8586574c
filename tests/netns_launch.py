"""`launch` across the servers of tests/netns_hosts.py: their cluster spec, the launcher started on server 0,
a fault applied mid-run, and the check that nothing is left in any namespace. Shared by the placement
(tests/test_multihost.py) and serving (tests/test_serve_multihost.py) multi-host tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from netns_hosts import Hosts, make_hosts

BW_BYTES_PER_S = 0.5e6  # the inter_node link: slow enough that the network is most of a decode step
LATENCY_S = 1e-3  # applied with netem; without it (tbf) the spec says the veth's own, about 0.05 ms
VETH_LATENCY_S = 50e-6  # what the spec says the link's latency is where tbf shapes it (no delay applied)
CPU_KIND = {
    "name": "cpu-core",
    "type": "cpu",
    "peak_flops": {"fp32": "96 GFLOP/s"},
    "mem_bytes": "4 GiB",
    "mem_bw_bytes_per_s": "10 GB/s",
    "compute_efficiency": 0.3,
    "mem_efficiency": 0.8,
    "overhead_s": "400 us",
    "tensor_parallel": True,  # opted in: a test runs a tensor-parallel group of two cores on server 0
}  # localhost-cpu.yaml's core


def cluster_spec(path: Path, addresses: tuple[str, ...], latency_s: float, cores: tuple[int, ...] = ()) -> Path:
    """One server per address, with cores[i] single-core devices (1 by default); the network between them as shaped."""
    nodes = [
        {"name": f"server{i}", "hostname": a, "slots": n, "devices": {"cpu-core": n}}
        for i, (a, n) in enumerate(zip(addresses, cores or (1,) * len(addresses)))
    ]
    spec = {
        "name": "netns-servers",
        "device_kinds": [CPU_KIND],
        "nodes": nodes,
        "links": {
            "intra_node_default": {"bw_bytes_per_s": "5 GB/s", "latency_s": "20 us"},
            "inter_node": {"bw_bytes_per_s": BW_BYTES_PER_S, "latency_s": latency_s},
        },
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def spec_latency_s(hosts: Hosts) -> float:
    """The inter-node latency a spec of these servers states: what netem applied, else the veth's own."""
    return hosts.latency_s if hosts.shaper == "netem" else VETH_LATENCY_S


@contextlib.contextmanager
def two_servers(tmp: Path) -> Iterator[tuple[Hosts, Path]]:
    """Two servers and their cluster spec (one core each); on exit, no process may be left in them."""
    with make_hosts(2, BW_BYTES_PER_S, LATENCY_S, tmp) as hosts:
        yield hosts, cluster_spec(tmp / "cluster.yaml", hosts.addresses, spec_latency_s(hosts))
        assert hosts.pids() == [], "a process outlived the module's runs"


def run_launch(hosts: Hosts, plan: Path, workdir: Path, *args: str, timeout_s: float = 120.0) -> subprocess.Popen:
    """`launch` on server 0 (the head node): Hydra starts each rank on its server through the namespace launcher."""
    env = {**os.environ, **hosts.mpiexec_env(0)}
    command = [sys.executable, "-m", "llm_planner.cli.main", "launch", str(plan), "--workdir", str(workdir)]
    command += ["--report", str(workdir / "run.json"), "--timeout", str(timeout_s), *args]
    return subprocess.Popen(hosts.exec(0, *command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ran_on(workdir: Path, ranks: int) -> list[str]:
    """The host name each rank's pid file records (its server's namespace)."""
    return [(workdir / f"rank{r}.pid").read_text().split()[1] for r in range(ranks)]


def gone(hosts: Hosts, timeout_s: float) -> list[int]:
    """The processes still in the servers' namespaces after up to timeout_s."""
    deadline = time.monotonic() + timeout_s
    while hosts.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    return hosts.pids()


def rank_pid(workdir: Path, rank: int, timeout_s: float = 60.0) -> int:
    path = workdir / f"rank{rank}.pid"
    deadline = time.monotonic() + timeout_s
    while not (path.is_file() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"rank {rank} did not start within {timeout_s} s"
        time.sleep(0.1)
    return int(path.read_text().split()[0])


def wait_for_lines(workdir: Path, lines: tuple[str, ...], timeout_s: float = 120.0) -> None:
    """Until the ranks' stderr (mpiexec.err in the workdir) holds every one of `lines`."""
    path, deadline = workdir / "mpiexec.err", time.monotonic() + timeout_s
    while True:
        text = path.read_text(errors="replace") if path.is_file() else ""
        missing = [line for line in lines if line not in text]
        if not missing:
            return
        assert time.monotonic() < deadline, f"no {missing} in {path} within {timeout_s} s:\n{text[-2000:]}"
        time.sleep(0.1)


def fail_mid_run(
    hosts: Hosts,
    plan: Path,
    workdir: Path,
    fault: Callable[[int], None],
    *,
    args: tuple[str, ...],
    timeout_s: float,
    ready: tuple[str, ...] = (),
    settle_s: float = 4.0,
) -> tuple[str, dict, float]:
    """Start `launch plan args` (a run longer than timeout_s); once rank 1 has started and the ranks' stderr holds
    the `ready` lines, wait settle_s and apply `fault(rank 1's pid)`. The launcher's output (whitespace folded), its
    failure report, and the seconds from the fault to the launcher's exit."""
    proc = run_launch(hosts, plan, workdir, *args, timeout_s=timeout_s)
    pid = rank_pid(workdir, 1)
    wait_for_lines(workdir, ready)
    time.sleep(settle_s)  # building, and the run under way
    assert proc.poll() is None, proc.communicate()
    fault(pid)
    faulted = time.monotonic()
    out, err = proc.communicate(timeout=timeout_s + 60)
    ended_s = time.monotonic() - faulted
    assert proc.returncode == 1, f"{out}\n{err}"
    return " ".join((out + err).split()), json.loads((workdir / "run.json").read_text()), ended_s
