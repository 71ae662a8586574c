"""The placement problem in numbers: what every solver, bound and the scheduler read.

Sets: tasks i in V (a DAG with edges e = (u, v)), devices k in K, a batch of Q
samples split into at most S shards. All costs come from llm_planner.cost and are precomputed
here into arrays: a decoder layer's time is the sum of the kernels it runs (the serving planner's
kernel model, llm_planner.cost.iteration), every other task's its roofline (llm_planner.cost.roofline;
llm_planner.cost.task_pieces decides which), a profile's measured piece where it has one:

    time_pieces[i, k, j] = (fixed_s, per_sample_s)   t(i, k, b) = max_j fixed + slope * b
    supported[i, k]                                   task i may run on device k
    comm_fixed[e, k, l], comm_slope[e, k, l]           c(e, k, l, b) = fixed + slope * b (0 if k == l)
    weight_bytes[i], mem_bytes_per_sample[i]           memory a task holds on its device
    mem_counts[i, k]                                   whether task i's memory counts on device k
    mem_usable[k]                                      the usable memory (spec fraction of mem_bytes)
    mem_capacity[k]                                    what weights and per-sample memory may fill: mem_usable
                                                       less the activation workspace the largest task that k
                                                       can run needs for the whole batch (max_i w_i Q): a
                                                       reservation that holds whatever runs there

Tensor-parallel groups (llm_planner.core.tensor_groups) are devices too: the physical devices come
first (indices 0..num_physical-1, in spec order), then every group offered (max_tp >= 2),
each with its task times on k members (cost.task_pieces.placement_task_pieces), unsupported where
the task does not shard over k. `members[k]` lists the physical devices of device k
((k,) for a physical one). A plan may use a group only while none of its members is used
alone or in another group (exclusivity: solvers, baselines and the verifier keep it).
Memory of a group: its tasks' weights and per-sample bytes whole against
    mem_capacity[G] = k * usable - (k - 1) * R,   R = replicated weights of every task,
which is k times the per-member limit "sum of (W - R_i) / k + R_i <= usable" with R_i
summed over all tasks, so it only ever errs on the safe side (R is a few MB: norms and
biases); the verifier checks each member's bytes exactly.

Throughput models (how a device's load per batch is counted, see docs/objectives.md):
    "direct":      load(k) = sum of its task times + for every edge cut between k
                   and l, the transfer time, charged to both k and l;
    "host_staged": (imported workload files) an accelerator pays its tasks'
                   times, plus hop cost once for each of its tasks whose output
                   leaves it, plus hop cost once for each outside task whose output
                   enters it; a CPU pays only its task times.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from llm_planner.core.plan import PlanInputs
from llm_planner.core.spec import ClusterSpec, DeviceSpec
from llm_planner.core.tensor_groups import tensor_groups
from llm_planner.cost import measured, task_pieces
from llm_planner.cost import roofline as cost
from llm_planner.cost.measured import Profile
from llm_planner.graph.decoder_graph import ID_BYTES
from llm_planner.graph.ir import Edge, TaskGraph

# Transfer costs are two [edges, K, K] tables over the placement devices K (devices and
# tensor-parallel groups); planning holds about 45 bytes per entry at its peak (the tables and
# the solvers' temporaries): 100,000,000 entries are about 4.5 GB (docs/inputs.md).
MAX_TRANSFER_ENTRIES = 100_000_000

OBJECTIVES = ("latency", "throughput")
# The decode loop's hand-off per sequence: the sampled token id (int64).
TOKEN_BYTES = float(ID_BYTES)


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
    mem_capacity: np.ndarray = field(repr=False)  # [K] mem_usable less the workspace reservation
    is_cpu: np.ndarray = field(repr=False)  # [K] bool
    hop_s_per_sample: np.ndarray = field(repr=False)  # [N] host-staged output cost of task i
    inputs: PlanInputs | None = None  # what the problem was built from, copied into plans
    mem_usable: np.ndarray | None = field(default=None, repr=False)  # [K]; None: mem_capacity (no workspace reserved)
    members: tuple[tuple[int, ...], ...] = ()  # [K] physical devices of each device; () = every device is physical
    max_tp: int = 1  # largest tensor-parallel degree offered
    # The decode loop's token hand-off (docs/objectives.md): (lm_head, embed) task indices of a decoder
    # in decode phase, and the [K, K] cost of moving the sampled ids from lm_head's device to embed's.
    token_loop: tuple[int, int] | None = None
    token_fixed: np.ndarray | None = field(default=None, repr=False)  # [K, K]
    token_slope: np.ndarray | None = field(default=None, repr=False)  # [K, K] per sample

    def token_time(self, assign, batch: int) -> float:
        """The decode step's token hand-off for a shard of `batch` samples placed by `assign`: the
        sampled ids from lm_head's device back to embed's, charged once per step (0 when the two
        share a device, the shard is empty or the graph has no decode loop)."""
        if self.token_loop is None or batch <= 0:
            return 0.0
        k, l = int(assign[self.token_loop[0]]), int(assign[self.token_loop[1]])
        if k == l:
            return 0.0
        return float(self.token_fixed[k, l] + self.token_slope[k, l] * batch)

    @property
    def usable(self) -> np.ndarray:
        """[K] the usable memory: weights, per-sample memory and the workspace of what runs fit in it."""
        return self.mem_capacity if self.mem_usable is None else self.mem_usable

    @property
    def num_physical(self) -> int:
        """Physical devices: the first num_physical indices."""
        return sum(1 for m in self.device_members if len(m) == 1)

    @property
    def device_members(self) -> tuple[tuple[int, ...], ...]:
        return self.members or tuple((k,) for k in range(len(self.devices)))

    @property
    def has_groups(self) -> bool:
        return any(len(m) > 1 for m in self.members)

    def degree(self, k: int) -> int:
        return len(self.device_members[k])

    def conflicts(self, used: set[int] | list[int]) -> list[tuple[int, int]]:
        """Pairs of used devices that share a physical device (a group and its member, two
        overlapping groups): what exclusivity forbids."""
        owner: dict[int, int] = {}
        out = []
        for k in sorted(set(int(k) for k in used)):
            for d in self.device_members[k]:
                if d in owner:
                    out.append((owner[d], k))
                else:
                    owner[d] = k
        return sorted(set(out))

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

    def task_memory_bytes(self, batch: int, batches: int = 1) -> np.ndarray:
        """[N] what each task holds on its device for a shard of `batch` samples with `batches` batches
        in flight: its weights and its per-sample memory (the one memory-need formula of the solvers,
        bounds and baselines; verify re-derives its own)."""
        return self.weight_bytes + self.mem_bytes_per_sample * batch * batches

    def memory_need(self, batch: int, batches: int = 1) -> np.ndarray:
        """[N, K] task_memory_bytes where task i's memory counts on device k (mem_counts), else 0."""
        return np.where(self.mem_counts, self.task_memory_bytes(batch, batches)[:, None], 0.0)

    def device_memory_used(self, shard_sizes: list[int], assignments: list[list[int]], batches: int = 1) -> np.ndarray:
        """Bytes used on each device: weights once per device, per-sample memory per shard and per
        batch in flight (`batches`: a throughput plan's steady state, problem.fit.steady_state_memory)."""
        used = np.zeros(self.num_devices)
        held = np.zeros((self.num_tasks, self.num_devices), dtype=bool)
        tasks = np.arange(self.num_tasks)
        for b, assign in zip(shard_sizes, assignments):
            if b <= 0:
                continue
            dev = np.asarray(assign, dtype=int)
            counts = self.mem_counts[tasks, dev]
            np.add.at(used, dev[counts], self.mem_bytes_per_sample[tasks[counts]] * b * batches)
            held[tasks[counts], dev[counts]] = True
        return used + self.weight_bytes @ held


def build_problem(
    graph: TaskGraph,
    cluster: ClusterSpec,
    *,
    objective: str = "latency",
    batch_size: int = 1,
    max_shards: int | None = None,
    dtype: str = "fp16",
    inputs: PlanInputs | None = None,
    max_tp: int = 1,
    profile: Profile | None = None,
) -> PlacementProblem:
    """Precompute every cost of `graph` on `cluster` into a PlacementProblem: the measured piece of a task on
    a device and the measured link of a device pair where `profile` has them (llm_planner.cost.measured), the
    kernel model (decoder layers), the roofline (other tasks) and the spec's links elsewhere."""
    if objective not in OBJECTIVES:
        raise ProblemError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if batch_size < 1:
        raise ProblemError(f"batch size must be >= 1, got {batch_size}")
    if isinstance(max_tp, bool) or not isinstance(max_tp, int) or max_tp < 1:
        raise ProblemError(f"max tensor-parallel degree (--max-tp) must be an integer >= 1, got {max_tp!r}")
    physical = cluster.devices()
    groups = [g for g in tensor_groups(cluster, max_tp) if any(t.shards_over(g.degree) for t in graph.tasks)]
    devices = physical + tuple(groups)
    by_name = {d.name: k for k, d in enumerate(physical)}
    members = tuple((k,) for k in range(len(physical))) + tuple(tuple(by_name[m] for m in g.members) for g in groups)
    num_k, num_n = len(devices), graph.num_tasks
    _check_transfer_entries(len(graph.edges), len(physical), len(groups))
    shards = len(physical) if max_shards is None else max_shards
    if shards < 1:
        raise ProblemError(f"max shards must be >= 1, got {shards}")
    kinds = [cluster.kind(d.kind) for d in devices]
    index = {t.name: i for i, t in enumerate(graph.tasks)}
    pieces, supported = _task_pieces(graph, cluster, devices, kinds, dtype, profile)
    usable = _capacities(graph, devices, kinds)

    edge_src = np.array([index[e.src] for e in graph.edges], dtype=int)
    edge_dst = np.array([index[e.dst] for e in graph.edges], dtype=int)
    token_loop = _token_loop(graph)
    reps = [physical[m[0]] for m in members]
    comm_fixed, comm_slope = _transfer_costs(graph.edges, cluster, devices, reps, kinds, profile)
    token = _transfer_costs(_token_edge(graph, token_loop), cluster, devices, reps, kinds, None)
    token = (token[0][0], token[1][0]) if token_loop else (None, None)

    mem_counts = np.array(
        [[(not t.mem_device_types) or kind.type in t.mem_device_types for kind in kinds] for t in graph.tasks],
        dtype=bool,
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
        mem_capacity=usable - _workspace(graph, supported, batch_size) * np.array([d.degree for d in devices]),
        mem_usable=usable,
        is_cpu=np.array([k.type == "cpu" for k in kinds], dtype=bool),
        hop_s_per_sample=hop,
        inputs=inputs,
        members=members,
        max_tp=max_tp,
        token_loop=token_loop,
        token_fixed=token[0],
        token_slope=token[1],
    )


def _token_loop(graph: TaskGraph) -> tuple[int, int] | None:
    """(lm_head, embed) of a decoder graph in decode phase (meta phase "decode", tasks of roles
    lm_head and embed): each step's sampled token goes from the one to the other."""
    if graph.meta_dict().get("phase") != "decode":
        return None
    roles = {t.label("role"): i for i, t in enumerate(graph.tasks)}
    return (roles["lm_head"], roles["embed"]) if "lm_head" in roles and "embed" in roles else None


def _token_edge(graph: TaskGraph, loop: tuple[int, int] | None) -> tuple[Edge, ...]:
    """The token's edge lm_head -> embed, for _transfer_costs (none without a loop)."""
    if loop is None:
        return ()
    return (Edge(src=graph.tasks[loop[0]].name, dst=graph.tasks[loop[1]].name, bytes_per_sample=TOKEN_BYTES),)


def _check_transfer_entries(num_edges: int, num_physical: int, num_groups: int) -> None:
    """ProblemError, with the numbers, when the transfer tables would pass MAX_TRANSFER_ENTRIES."""
    num_k = num_physical + num_groups
    entries = num_edges * num_k * num_k
    if entries > MAX_TRANSFER_ENTRIES:
        hint = f"; --max-tp 1 offers no groups ({num_edges * num_physical**2:,} entries)" if num_groups else ""
        raise ProblemError(
            f"{num_edges:,} edges x {num_k:,}^2 placement devices ({num_physical:,} devices, {num_groups:,} "
            f"tensor-parallel groups) = {entries:,} transfer costs; the limit is {MAX_TRANSFER_ENTRIES:,} "
            f"(docs/inputs.md){hint}"
        )


def _transfer_costs(
    edges, cluster: ClusterSpec, devices, reps: list, kinds: list, profile: Profile | None
) -> tuple[np.ndarray, np.ndarray]:
    """(comm_fixed, comm_slope) [E, K, K]: cost.transfer_tables over the profile's measured link of a pair
    of `devices` where it has their class, else the spec's link between their physical devices `reps`
    (a group's links are its first member's). The token hand-off is built with no profile: it keeps the
    spec's links, as it did when a profile was applied after the build."""

    def link(k: int, l: int):
        if k == l:
            return None
        found = None if profile is None else measured.link(cluster, profile, devices[k], devices[l])
        return found or cluster.link(reps[k], reps[l])

    links = [[link(k, l) for l in range(len(devices))] for k in range(len(devices))]
    return cost.transfer_tables(edges, links, kinds)


def _task_pieces(
    graph: TaskGraph, cluster: ClusterSpec, devices, kinds, dtype: str, profile: Profile | None
) -> tuple[np.ndarray, np.ndarray]:
    """time_pieces [N, K, P, 2] and supported [N, K]: the profile's measured piece where it has one, else
    cost.task_pieces's (a decoder layer's kernel sum, other tasks' roofline), each row padded to the most
    pieces P with its first piece; ProblemError for a task no device runs."""
    found: dict[tuple[int, int], tuple] = {}
    single = cluster.device_map()
    try:
        decoder = task_pieces.decoder_load(graph, dtype)
    except cost.CostError as exc:
        raise ProblemError(str(exc)) from None
    for i, task in enumerate(graph.tasks):
        key = measured.task_key(graph, task) if profile is not None else None
        runs = False
        for k, (device, kind) in enumerate(zip(devices, kinds)):
            if not cost.task_supported(task, kind) or not task.shards_over(device.degree):
                continue
            p = measured.task_pieces(cluster, profile, key, task, device) if profile is not None else None
            link = cluster.link(single[device.members[0]], single[device.members[1]]) if device.members else None
            try:
                p = p or task_pieces.placement_task_pieces(task, kind, device.degree, link, dtype, decoder)
            except cost.CostError as exc:
                raise ProblemError(str(exc)) from None
            found[(i, k)], runs = p, True
        if not runs:
            raise ProblemError(
                f"no device of cluster {cluster.name!r} can run task {task.name!r} (tasks[{i}]): "
                f"{_why_unsupported(task, cluster)}"
            )
    width = max((len(p) for p in found.values()), default=1)
    pieces = np.zeros((graph.num_tasks, len(devices), width, 2))
    supported = np.zeros((graph.num_tasks, len(devices)), dtype=bool)
    for (i, k), p in found.items():
        supported[i, k] = True
        pieces[i, k, :] = p[0]  # pad with the first piece so every row has `width`
        pieces[i, k, : len(p)] = p
    return pieces, supported


def _why_unsupported(task, cluster: ClusterSpec) -> str:
    """Which field of the task rules out every device kind of the cluster."""
    types = sorted({k.type for k in cluster.device_kinds})
    if task.device_types and not set(task.device_types) & set(types):
        return f"its device_types {list(task.device_types)} name none of the cluster's device types {types}"
    names = [k.name for k in cluster.device_kinds if not task.device_types or k.type in task.device_types]
    return (
        f"its time_s_by_kind names {[n for n, _ in task.time_s_by_kind]}, "
        f"none of the cluster's device kinds {names} it may run on"
    )


def _capacities(graph: TaskGraph, devices, kinds) -> np.ndarray:
    """Usable memory of each device; a group's is k times its members' less the replicated weights
    they each hold (module docstring)."""
    replicated = sum(t.tp_replicated_weight_bytes for t in graph.tasks)
    return np.array(
        [d.degree * kind.usable_mem_bytes - (d.degree - 1) * replicated for d, kind in zip(devices, kinds)], dtype=float
    )


def _workspace(graph: TaskGraph, supported: np.ndarray, batch: int) -> np.ndarray:
    """[K] the largest activation workspace, for the whole batch, of a task each device can run
    (on a group, each member is reserved all of it: the sublayer's input and output are whole there)."""
    per_sample = np.array([t.workspace_bytes_per_sample for t in graph.tasks], dtype=float)
    return np.max(np.where(supported, per_sample[:, None] * batch, 0.0), axis=0, initial=0.0)


def restrict_devices(problem: PlacementProblem, keep: list[int]) -> PlacementProblem:
    """The problem on the devices `keep` only (indices into problem.devices, in order): every
    array sliced, device names unchanged, so a plan of the result is a plan of the problem.
    The kept devices share no physical device, so each is a unit of its own there (members
    empty): no exclusivity is left to keep."""
    keep = list(keep)
    if problem.conflicts(keep):
        raise ValueError("restrict_devices needs devices that share no physical device")
    ix = np.array(keep, dtype=int)
    return replace(
        problem,
        devices=tuple(problem.devices[k] for k in keep),
        time_pieces=problem.time_pieces[:, ix],
        supported=problem.supported[:, ix],
        comm_fixed=problem.comm_fixed[:, ix][:, :, ix],
        comm_slope=problem.comm_slope[:, ix][:, :, ix],
        mem_counts=problem.mem_counts[:, ix],
        mem_capacity=problem.mem_capacity[ix],
        is_cpu=problem.is_cpu[ix],
        members=(),
        mem_usable=None if problem.mem_usable is None else problem.mem_usable[ix],
        max_shards=min(problem.max_shards, problem.batch_size),
        token_fixed=None if problem.token_fixed is None else problem.token_fixed[ix][:, ix],
        token_slope=None if problem.token_slope is None else problem.token_slope[ix][:, ix],
    )
