"""Random small placement problems for the property tests of the verifier, bounds and baselines.

Clusters are made in code (parse_cluster) with 2-4 devices of 1-3 kinds on one
or two nodes; graphs are random DAGs of 1-12 tasks with random costs, bytes,
weights, device-type limits and colocation groups. `explicit=True` gives
graphs with explicit per-kind times and host-staged edges (the imported
workload form, so the "host_staged" throughput model).
"""

from __future__ import annotations

from hypothesis import strategies as st

from llm_planner.core.spec import parse_cluster
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.problem import PlacementProblem, build_problem

TYPES = ("cpu", "gpu", "accelerator")


def make_cluster(kinds: list[dict], node_devices: list[dict[str, int]], *, bw: float = 10e9, latency_s: float = 5e-6):
    """A cluster of the given kinds (dicts of DeviceKindSpec fields) and nodes (kind -> count)."""
    data = {
        "name": "test-cluster",
        "device_kinds": kinds,
        "nodes": [{"name": f"node{j}", "devices": devs} for j, devs in enumerate(node_devices)],
        "links": {"intra_node_default": {"bw_bytes_per_s": bw, "latency_s": latency_s}},
    }
    if len(node_devices) > 1:
        data["links"]["inter_node"] = {"bw_bytes_per_s": bw / 4, "latency_s": latency_s * 4}
    return parse_cluster(data)


def kind(
    name: str,
    type_: str,
    *,
    flops: float,
    mem_bytes: float | str,
    mem_bw: float,
    overhead_s: float = 0.0,
    usable: float = 1.0,
) -> dict:
    """A device kind; its whole memory usable unless `usable` says otherwise (the instances state
    the budget a plan has, not a GPU's size), its peaks reached in full (the hand-solved instances'
    times are FLOPs / flops and bytes / mem_bw, not the type's default efficiencies)."""
    return {
        "name": name,
        "type": type_,
        "peak_flops": {"fp16": flops},
        "mem_bytes": mem_bytes,
        "mem_bw_bytes_per_s": mem_bw,
        "compute_efficiency": 1.0,
        "mem_efficiency": 1.0,
        "overhead_s": overhead_s,
        "usable_mem_fraction": usable,
    }


@st.composite
def clusters(draw, max_devices: int = 4):
    num_kinds = draw(st.integers(1, min(3, max_devices)))
    kinds = []
    for j in range(num_kinds):
        type_ = draw(st.sampled_from(TYPES))
        mem = "unlimited" if type_ == "cpu" and draw(st.booleans()) else draw(st.floats(2e9, 6e10))
        kinds.append(
            kind(
                f"k{j}",
                type_,
                flops=draw(st.floats(1e12, 2e14)),
                mem_bytes=mem,
                mem_bw=draw(st.floats(5e10, 2e12)),
                overhead_s=draw(st.sampled_from([0.0, 1e-5, 3e-5])),
            )
        )
    num_devices = draw(st.integers(max(2, num_kinds), max_devices))
    owners = list(range(num_kinds)) + [draw(st.integers(0, num_kinds - 1)) for _ in range(num_devices - num_kinds)]
    num_nodes = draw(st.integers(1, 2)) if num_devices >= 2 else 1
    nodes: list[dict[str, int]] = [{} for _ in range(num_nodes)]
    for d, j in enumerate(owners):
        node = nodes[d % num_nodes]
        node[f"k{j}"] = node.get(f"k{j}", 0) + 1
    bw = draw(st.floats(1e9, 1e11))
    return make_cluster(kinds, [n for n in nodes if n], bw=bw, latency_s=draw(st.sampled_from([0.0, 5e-6, 2e-5])))


@st.composite
def graphs(draw, cluster, *, min_tasks: int = 1, max_tasks: int = 12, explicit: bool | None = None):
    n = draw(st.integers(min_tasks, max_tasks))
    if explicit is None:
        explicit = draw(st.booleans())
    kind_names = [k.name for k in cluster.device_kinds if any(d.kind == k.name for d in cluster.devices())]
    types_present = sorted({cluster.kind(k).type for k in kind_names})
    groups = draw(st.lists(st.sampled_from(["", "", "", "g0", "g1"]), min_size=n, max_size=n))
    limit_types = draw(st.booleans()) and not any(groups)  # device-type limits, not mixed with colocation
    tasks = []
    for i in range(n):
        kw = {
            "name": f"t{i}",
            "weight_bytes": draw(st.floats(0, 4e9)),
            "mem_bytes_per_sample": draw(st.floats(0, 2e8)),
            "colocate_group": groups[i],
        }
        if explicit:
            kw["time_s_by_kind"] = tuple((k, draw(st.floats(1e-4, 1e-1))) for k in kind_names)
        else:
            kw["flops_per_sample"] = draw(st.floats(0, 5e11))
            kw["bytes_per_sample"] = draw(st.floats(0, 1e9))
        if limit_types and draw(st.integers(0, 3)) == 0:
            kw["device_types"] = (draw(st.sampled_from(types_present)),)
        if draw(st.integers(0, 4)) == 0:
            kw["mem_device_types"] = tuple(t for t in TYPES if t != "cpu")
        tasks.append(Task(**kw))
    edges = []
    for j in range(1, n):
        preds = draw(st.lists(st.integers(0, j - 1), max_size=3, unique=True))
        for i in preds:
            hop = draw(st.floats(1e-4, 2e-2)) if explicit else 0.0
            edges.append(Edge(src=f"t{i}", dst=f"t{j}", bytes_per_sample=draw(st.floats(0, 5e8)), hop_s_per_sample=hop))
    return TaskGraph(name="random", tasks=tuple(tasks), edges=tuple(edges)).validate()


@st.composite
def problems(draw, *, max_tasks: int = 12, max_devices: int = 4, max_batch: int = 8, objective: str | None = None):
    """A PlacementProblem on a random cluster and DAG, latency or throughput, batch 1-max_batch."""
    cluster = draw(clusters(max_devices=max_devices))
    graph = draw(graphs(cluster, max_tasks=max_tasks))
    objective = objective or draw(st.sampled_from(["latency", "throughput"]))
    batch = draw(st.integers(1, max_batch))
    shards = draw(st.integers(1, len(cluster.devices())))
    return build_problem(graph, cluster, objective=objective, batch_size=batch, max_shards=shards)


def random_assignment(draw, problem: PlacementProblem) -> tuple[list[int], list[list[int]]]:
    """Random shard sizes and a random supported assignment per shard that keeps colocation groups together."""
    num = draw(st.integers(1, problem.max_shards))
    cuts = (
        sorted(draw(st.lists(st.integers(1, problem.batch_size - 1), min_size=num - 1, max_size=num - 1, unique=True)))
        if num > 1
        else []
    )
    bounds = [0, *cuts, problem.batch_size]
    sizes = [bounds[j + 1] - bounds[j] for j in range(len(bounds) - 1)]
    assigns = []
    for _ in sizes:
        a = [
            draw(st.sampled_from([k for k in range(problem.num_devices) if problem.supported[i, k]]))
            for i in range(problem.num_tasks)
        ]
        for group in problem.colocate_groups():
            common = [k for k in range(problem.num_devices) if problem.supported[group, k].all()]
            k = draw(st.sampled_from(common))
            for i in group:
                a[i] = k
        assigns.append(a)
    return sizes, assigns
