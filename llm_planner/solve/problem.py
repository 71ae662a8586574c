"""The placement problem in numbers: what every solver, bound and the scheduler read.

Sets: tasks i in V (a DAG with edges e = (u, v)), devices k in K, a batch of Q
samples split into at most S shards. All costs come from llm_planner.cost and are
precomputed here into arrays:

    time_pieces[i, k, j] = (fixed_s, per_sample_s)   t(i, k, b) = max_j fixed + slope * b
    supported[i, k]                                   task i may run on device k
    comm_fixed[e, k, l], comm_slope[e, k, l]           c(e, k, l, b) = fixed + slope * b (0 if k == l)
    weight_bytes[i], mem_bytes_per_sample[i]           memory a task holds on its device
    mem_counts[i, k]                                   whether task i's memory counts on device k
    mem_capacity[k]

Throughput models (how a device's load per batch is counted, see docs/objectives.md):
    "direct":      load(k) = sum of its task times + for every edge cut between k
                   and l, the transfer time, charged to both k and l;
    "host_staged": (imported workload files) an accelerator pays its tasks'
                   times, plus hop cost once for each of its tasks whose output
                   leaves it, plus hop cost once for each outside task whose output
                   enters it; a CPU pays only its task times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llm_planner import cost
from llm_planner.graph.ir import TaskGraph
from llm_planner.plan import PlanInputs
from llm_planner.spec import ClusterSpec, DeviceSpec

OBJECTIVES = ("latency", "throughput")


class ProblemError(ValueError):
    """An instance that cannot be posed (no device can run a task, bad batch)."""


@dataclass(frozen=True, kw_only=True)
class PlacementProblem:
    graph: TaskGraph
    cluster: ClusterSpec
    devices: tuple[DeviceSpec, ...]
    objective: str
    batch_size: int
    max_shards: int
    dtype: str
    throughput_model: str
    time_pieces: np.ndarray = field(repr=False)  # [N, K, P, 2]
    supported: np.ndarray = field(repr=False)  # [N, K] bool
    edge_src: np.ndarray = field(repr=False)  # [E] task index
    edge_dst: np.ndarray = field(repr=False)  # [E]
    comm_fixed: np.ndarray = field(repr=False)  # [E, K, K]
    comm_slope: np.ndarray = field(repr=False)  # [E, K, K]
    weight_bytes: np.ndarray = field(repr=False)  # [N]
    mem_bytes_per_sample: np.ndarray = field(repr=False)  # [N]
    mem_counts: np.ndarray = field(repr=False)  # [N, K] bool
    mem_capacity: np.ndarray = field(repr=False)  # [K]
    is_cpu: np.ndarray = field(repr=False)  # [K] bool
    hop_s_per_sample: np.ndarray = field(repr=False)  # [N] host-staged output cost of task i
    inputs: PlanInputs | None = None  # what the problem was built from, copied into plans

    @property
    def num_tasks(self) -> int:
        return self.graph.num_tasks

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_edges(self) -> int:
        return len(self.edge_src)

    @property
    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def task_time(self, i: int, k: int, batch: int) -> float:
        """t(i, k, b); +inf where task i cannot run on device k."""
        if not self.supported[i, k]:
            return float("inf")
        if batch <= 0:
            return 0.0
        pieces = self.time_pieces[i, k]
        return float(np.max(pieces[:, 0] + pieces[:, 1] * batch))

    def transfer_time(self, e: int, k: int, l: int, batch: int) -> float:
        """c(e, k, l, b): 0 when k == l or b == 0."""
        if k == l or batch <= 0:
            return 0.0
        return float(self.comm_fixed[e, k, l] + self.comm_slope[e, k, l] * batch)

    def in_edges(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.num_tasks)]
        for e, v in enumerate(self.edge_dst):
            out[int(v)].append(e)
        return out

    def out_edges(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.num_tasks)]
        for e, u in enumerate(self.edge_src):
            out[int(u)].append(e)
        return out

    def colocate_groups(self) -> list[list[int]]:
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(self.graph.tasks):
            if t.colocate_group:
                groups.setdefault(t.colocate_group, []).append(i)
        return [g for g in groups.values() if len(g) > 1]

    def device_memory_used(self, shard_sizes: list[int], assignments: list[list[int]]) -> np.ndarray:
        """Bytes used on each device: weights once per device, per-sample memory per shard."""
        used = np.zeros(self.num_devices)
        for k in range(self.num_devices):
            held = set()
            for b, assign in zip(shard_sizes, assignments):
                if b <= 0:
                    continue
                for i, dev in enumerate(assign):
                    if dev == k and self.mem_counts[i, k]:
                        held.add(i)
                        used[k] += self.mem_bytes_per_sample[i] * b
            used[k] += sum(self.weight_bytes[i] for i in held)
        return used


def build_problem(
    graph: TaskGraph,
    cluster: ClusterSpec,
    *,
    objective: str = "latency",
    batch_size: int = 1,
    max_shards: int | None = None,
    dtype: str = "fp16",
    inputs: PlanInputs | None = None,
) -> PlacementProblem:
    """Precompute every cost of `graph` on `cluster` into a PlacementProblem."""
    if objective not in OBJECTIVES:
        raise ProblemError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if batch_size < 1:
        raise ProblemError(f"batch size must be >= 1, got {batch_size}")
    devices = cluster.devices()
    num_k, num_n = len(devices), graph.num_tasks
    shards = num_k if max_shards is None else max_shards
    if shards < 1:
        raise ProblemError(f"max shards must be >= 1, got {shards}")
    kinds = [cluster.kind(d.kind) for d in devices]
    index = {t.name: i for i, t in enumerate(graph.tasks)}

    pieces = np.zeros((num_n, num_k, 2, 2))
    supported = np.zeros((num_n, num_k), dtype=bool)
    for i, task in enumerate(graph.tasks):
        for k, kind in enumerate(kinds):
            if not cost.task_supported(task, kind):
                continue
            try:
                p = cost.task_time_pieces(task, kind, dtype)
            except cost.CostError as exc:
                raise ProblemError(str(exc)) from None
            supported[i, k] = True
            pieces[i, k, :] = p[0]  # pad with the first piece so every row has 2
            pieces[i, k, : len(p)] = p
        if not supported[i].any():
            raise ProblemError(f"no device of cluster {cluster.name!r} can run task {task.name!r}")

    num_e = len(graph.edges)
    edge_src = np.array([index[e.src] for e in graph.edges], dtype=int)
    edge_dst = np.array([index[e.dst] for e in graph.edges], dtype=int)
    latency = np.zeros((num_k, num_k))
    inv_bw = np.zeros((num_k, num_k))
    hops = np.zeros((num_k, num_k))
    for k, a in enumerate(devices):
        for l, b in enumerate(devices):
            link = cluster.link(a, b)
            if link is not None:
                latency[k, l] = link.latency_s
                inv_bw[k, l] = 1.0 / link.bw_bytes_per_s
                hops[k, l] = cost.transfer_hops(kinds[k], kinds[l])
    # Vectorised form of cost.transfer_pieces over every edge and device pair.
    edge_bytes = np.array([e.bytes_per_sample for e in graph.edges], dtype=float).reshape(num_e, 1, 1)
    edge_hop = np.array([e.hop_s_per_sample for e in graph.edges], dtype=float).reshape(num_e, 1, 1)
    comm_fixed = np.broadcast_to(latency, (num_e, num_k, num_k)).copy()
    comm_slope = edge_bytes * inv_bw[None] + edge_hop * hops[None]

    mem_counts = np.array(
        [[(not t.mem_device_types) or kind.type in t.mem_device_types for kind in kinds] for t in graph.tasks], dtype=bool
    ).reshape(num_n, num_k)
    hop = np.zeros(num_n)
    for e in graph.edges:
        hop[index[e.src]] = max(hop[index[e.src]], e.hop_s_per_sample)
    return PlacementProblem(
        graph=graph,
        cluster=cluster,
        devices=devices,
        objective=objective,
        batch_size=batch_size,
        max_shards=min(shards, batch_size),
        dtype=dtype,
        throughput_model="host_staged" if any(e.hop_s_per_sample for e in graph.edges) else "direct",
        time_pieces=pieces,
        supported=supported,
        edge_src=edge_src,
        edge_dst=edge_dst,
        comm_fixed=comm_fixed,
        comm_slope=comm_slope,
        weight_bytes=np.array([t.weight_bytes for t in graph.tasks], dtype=float),
        mem_bytes_per_sample=np.array([t.mem_bytes_per_sample for t in graph.tasks], dtype=float),
        mem_counts=mem_counts,
        mem_capacity=np.array([k.mem_bytes for k in kinds], dtype=float),
        is_cpu=np.array([k.type == "cpu" for k in kinds], dtype=bool),
        hop_s_per_sample=hop,
        inputs=inputs,
    )
