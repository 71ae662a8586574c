"""Timing the links and collectives of a cluster under MPI, with the runtime's own calls:
ping-pong between one pair of ranks per link class (llm_planner.runtime.comm point-to-point
transfers) and all-reduce within the first group of each degree of each class of identical
devices (llm_planner.runtime.comm.GroupComm). Used by llm_planner.launch.profile_run."""

from __future__ import annotations

import statistics
import time

from llm_planner.core.spec import ClusterSpec, DeviceSpec
from llm_planner.cost.measured import all_reduce_key, link_class
from llm_planner.runtime.profile_rank import group_degrees_of


def link_pairs(cluster: ClusterSpec, order: list[DeviceSpec]) -> list[tuple[str, int, int]]:
    """(link class, rank a, rank b): the first pair of ranks of each link class."""
    pairs: dict[str, tuple[int, int]] = {}
    for a in range(len(order)):
        for b in range(a + 1, len(order)):
            name = link_class(cluster, order[a], order[b])
            if name is not None:
                pairs.setdefault(name, (a, b))
    return [(name, a, b) for name, (a, b) in pairs.items()]


def ping_pong(comm, peer: int, first: bool, sizes: tuple[int, ...], repetitions: int) -> list[float]:
    """Median one-way time per message size: half a round trip, with the runtime's isend / probe / recv_into."""
    import torch

    medians = []
    for size in sizes:
        buf, out = torch.zeros(size, dtype=torch.uint8), torch.empty(size, dtype=torch.uint8)
        times = []
        for rep in range(repetitions + 1):  # the first round trip warms the path up
            start = time.perf_counter()
            if first:
                comm.isend(buf, peer, 0)
                comm.wait_sends()
            comm.probe_any()
            comm.recv_into(out, peer, 0)
            if not first:
                comm.isend(buf, peer, 0)
                comm.wait_sends()
            if rep:
                times.append((time.perf_counter() - start) / 2)
        medians.append(statistics.median(times))
    return medians


def collective_groups(cluster: ClusterSpec, order: list[DeviceSpec]) -> list[tuple[str, tuple[int, ...]]]:
    """(profile key, ranks): the first group of each degree of each class of identical devices of a node."""
    out, seen = [], set()
    for _r, device in enumerate(order):
        if (device.node, device.kind) in seen:
            continue
        seen.add((device.node, device.kind))
        ranks = [q for q, d in enumerate(order) if d.node == device.node and d.kind == device.kind]
        for k in group_degrees_of(cluster, device):
            name = link_class(cluster, order[ranks[0]], order[ranks[1]])
            if name is not None:
                out.append((all_reduce_key(name, k), tuple(ranks[:k])))
    return out


def time_all_reduce(group, sizes: tuple[int, ...], repetitions: int) -> list[float]:
    """Median seconds of one all-reduce of n bytes (float32) among the group, back to back, per size."""
    import torch

    medians = []
    for size in sizes:
        t = torch.zeros(max(1, size // 4), dtype=torch.float32)
        times = []
        for rep in range(repetitions + 1):  # the first call warms the path up
            start = time.perf_counter()
            group.all_reduce_(t)
            if rep:
                times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return medians
