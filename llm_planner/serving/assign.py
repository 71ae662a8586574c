"""Concrete devices for a fleet: every copy of every pattern gets its blocks of each class.

Blocks are placed largest first: a whole-server block takes the next free servers of its
class; a block inside a server takes the first server with room, at the lowest free offset.
Sizes inside a server are powers of two dividing the server's count (or the count itself),
so each block starts at a multiple of its size and every tensor-parallel group inside it is
an aligned group (llm_planner.core.tensor_groups). llm_planner.serving.classes says why this never fails
when the counts fit.
"""

from __future__ import annotations

from llm_planner.core.spec import ClusterSpec
from llm_planner.serving.classes import ServerClass
from llm_planner.serving.fleet import FleetChoice

Stage = tuple[str, ...]  # device names of one stage (one device, or a group's members)


class AssignError(ValueError):
    """Counts that do not fit their classes (a bug, or a hand-edited plan)."""


def class_servers(cluster: ClusterSpec, sc: ServerClass) -> list[list[str]]:
    """Device names of the class, server by server, in spec order."""
    servers: dict[str, list[str]] = {}
    for d in cluster.devices():
        if d.node_template == sc.template and d.kind == sc.kind.name:
            servers.setdefault(d.node, []).append(d.name)
    return list(servers.values())


def assign_devices(
    cluster: ClusterSpec, classes: dict[str, ServerClass], fleet: FleetChoice
) -> list[list[list[Stage]]]:
    """For each chosen pattern, for each copy, the device names of each stage in pipeline order."""
    requests = []  # (size, class, pattern index, copy, segment index)
    for p, (pattern, count) in enumerate(fleet.chosen):
        for copy in range(count):
            for j, seg in enumerate(pattern.layout):
                requests.append((seg.devices, seg.class_name, p, copy, j))
    blocks = {}
    free = {name: _Free(class_servers(cluster, sc), sc.per_server) for name, sc in classes.items()}
    for size, name, p, copy, j in sorted(requests, key=lambda r: -r[0]):
        blocks[(p, copy, j)] = free[name].take(size)
    out = []
    for p, (pattern, count) in enumerate(fleet.chosen):
        copies = []
        for copy in range(count):
            stages: list[Stage] = []
            for j, seg in enumerate(pattern.layout):
                devs = blocks[(p, copy, j)]
                stages += [tuple(devs[i * seg.degree : (i + 1) * seg.degree]) for i in range(seg.stages)]
            copies.append(stages)
        out.append(copies)
    return out


class _Free:
    def __init__(self, servers: list[list[str]], per_server: int):
        self.servers, self.per_server = servers, per_server
        self.used = [0] * len(servers)  # devices taken from the front of each server

    def take(self, size: int) -> list[str]:
        if size >= self.per_server:
            need = size // self.per_server
            run = [i for i, u in enumerate(self.used) if u == 0][:need]
            if len(run) < need:
                raise AssignError(f"no {need} free whole servers left")
            for i in run:
                self.used[i] = self.per_server
            return [d for i in run for d in self.servers[i]]
        for i, u in enumerate(self.used):
            if u + size <= self.per_server:
                self.used[i] = u + size
                return self.servers[i][u : u + size]
        raise AssignError(f"no room for a block of {size} devices")
