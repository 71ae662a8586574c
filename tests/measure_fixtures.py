"""Synthetic run reports made from the cost model, for the measure and calibrate tests.

A small cluster (a CPU kind, two GPUs of one kind, a spare accelerator no plan
uses; a GPU-GPU link rule and a default link) and a chain graph file whose
tasks are compute-bound (conv), memory-bound by activations (relu) or by
weights (fc) on both kinds. `graph_report` writes what the runtime would
measure if the hardware followed the roofline with the factors of a "true"
cluster: every (shard, task) call timed, one message per tensor and receiving
device, the makespan of the plan's order as the wall time.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from llm_planner.core.plan import Plan, save_plan
from llm_planner.core.spec import ClusterSpec, parse_cluster
from llm_planner.cost import roofline as cost
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.inputs import problem_from_inputs
from llm_planner.placement.problem import build_problem
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.verify import verify_plan

CLUSTER_YAML = """\
# A test cluster: comments like this one must survive calibration.
name: test-box
device_kinds:
  - name: cpu-a   # the host
    type: cpu
    peak_flops: {{fp32: 1 TFLOP/s, fp16: 1 TFLOP/s}}
    mem_bytes: 64 GiB
    mem_bw_bytes_per_s: 100 GB/s
    compute_efficiency: {cpu_ce}
    overhead_s: {cpu_o}
  - name: gpu-b
    type: gpu
    peak_flops: {{fp32: 100 TFLOP/s, fp16: 100 TFLOP/s}}
    mem_bytes: 40 GB
    mem_bw_bytes_per_s: 1000 GB/s
    compute_efficiency: {gpu_ce}
    mem_efficiency: {gpu_me}
    overhead_s: {gpu_o}
  - name: spare
    type: accelerator
    peak_flops: {{fp16: 10 TFLOP/s}}
    mem_bytes: 8 GB
    mem_bw_bytes_per_s: 200 GB/s
    compute_efficiency: 0.5
nodes:
  - name: box
    hostname: localhost
    devices: {{cpu-a: 1, gpu-b: 2, spare: 1}}
links:
  intra_node_default: {{bw_bytes_per_s: {pcie_bw}, latency_s: {pcie_lat}}}
  intra_node:
    - between: [gpu-b, gpu-b]
      bw_bytes_per_s: {nvl_bw}
      latency_s: {nvl_lat}
"""

SPEC = {
    "cpu_ce": 0.8,
    "cpu_o": "1 us",
    "gpu_ce": 0.9,
    "gpu_me": 0.95,
    "gpu_o": "1 us",
    "pcie_bw": "5 GB/s",
    "pcie_lat": "30 us",
    "nvl_bw": "20 GB/s",
    "nvl_lat": "1 us",
}  # what the spec file says (cpu-a mem_efficiency: the cpu type's default)
TRUE = {
    "cpu_ce": 0.35,
    "cpu_o": "50 us",
    "gpu_ce": 0.45,
    "gpu_me": 0.7,
    "gpu_o": "12 us",
    "pcie_bw": "10 GB/s",
    "pcie_lat": "15 us",
    "nvl_bw": "50 GB/s",
    "nvl_lat": "5 us",
}  # what the "hardware" does (cpu-a mem_efficiency: the same default)


def cluster_text(**values) -> str:
    return CLUSTER_YAML.format(**values)


def chain_graph(blocks: int = 4) -> TaskGraph:
    tasks, edges = [], []
    for i in range(blocks):
        tasks += [
            Task(name=f"conv{i}", flops_per_sample=2e8 * (1 + i), bytes_per_sample=1e6, weight_bytes=1e6),
            Task(name=f"relu{i}", flops_per_sample=1e6, bytes_per_sample=8e6 * (1 + i % 2)),
            Task(name=f"fc{i}", flops_per_sample=2e7, bytes_per_sample=1e4, weight_bytes=4e8 / (1 + i)),
        ]
    for j in range(len(tasks) - 1):
        edges.append(Edge(src=tasks[j].name, dst=tasks[j + 1].name, bytes_per_sample=1e4 * (j + 1) ** 2))
    return TaskGraph(name="chain", tasks=tuple(tasks), edges=tuple(edges))


def write_inputs(tmp: Path) -> tuple[Path, Path]:
    """The spec's cluster file and the graph file, in `tmp`."""
    cluster = tmp / "cluster.yaml"
    cluster.write_text(cluster_text(**SPEC))
    graph = tmp / "chain.json"
    graph.write_text(chain_graph().to_json())
    return cluster, graph


def graph_plan(
    tmp: Path,
    cluster: Path,
    graph: Path,
    layouts: list[list[int]],
    sizes: list[int],
    name: str,
    objective: str = "latency",
) -> Path:
    """A plan of the chain on the cluster file: layouts[s][i] = device index of task i in shard s."""
    problem = problem_from_inputs(
        cluster_path=str(cluster),
        graph_path=str(graph),
        batch_size=sum(sizes),
        max_shards=len(sizes),
        objective=objective,
    )
    plan = make_plan(
        problem, sizes, layouts, solver="test", status="heuristic", started_at=time.perf_counter(), lower_bound_s=0.0
    )
    path = tmp / name
    save_plan(plan, path)
    return path


def true_cluster() -> ClusterSpec:
    import yaml

    return parse_cluster(yaml.safe_load(cluster_text(**TRUE)), source="<true>")


def graph_report(plan: Plan, graph: TaskGraph, truth: ClusterSpec, *, noise: float = 0.0, seed: int = 0) -> dict:
    """The run report a graph run of `plan` would write on hardware that follows `truth` (times x (1 + noise *
    N(0, 1)))."""
    rng = np.random.default_rng(seed)
    devices = {d.name: d for d in truth.devices()}
    kinds = {name: truth.kind(d.kind) for name, d in devices.items()}
    tasks = {t.name: t for t in graph.tasks}
    used = plan.devices_used()
    rank = {d: r for r, d in enumerate(used)}
    ranks = [
        {
            "rank": r,
            "device": d,
            "torch_device": "cpu",
            "dtype": "float16",
            "tasks": {},
            "task_calls": {},
            "transfers": [],
        }
        for r, d in enumerate(used)
    ]
    for size, assignment in zip(plan.shard_sizes, plan.shard_assignments):
        for task, device in assignment.items():
            t = cost.estimate_task_time_s(tasks[task], kinds[device], plan.inputs.dtype, size) * (
                1 + noise * rng.standard_normal()
            )
            entry = ranks[rank[device]]
            entry["tasks"][task] = entry["tasks"].get(task, 0.0) + t
            entry["task_calls"][task] = entry["task_calls"].get(task, 0) + 1
    messages: dict[tuple[int, str, str], tuple[str, float]] = {}
    for s, (size, assignment) in enumerate(zip(plan.shard_sizes, plan.shard_assignments)):
        for e in graph.edges:
            a, b = assignment[e.src], assignment[e.dst]
            if a != b:
                messages[(s, e.src, b)] = (a, e.bytes_per_sample * size)
    pairs: dict[tuple[str, str], list[float]] = {}
    for (_, _, b), (a, nbytes) in messages.items():
        link = truth.link(devices[a], devices[b])
        seconds = (link.latency_s + nbytes / link.bw_bytes_per_s) * (1 + noise * rng.standard_normal())
        entry = pairs.setdefault((a, b), [0, 0, 0.0])
        entry[0] += 1
        entry[1] += int(nbytes)
        entry[2] += seconds
    for (a, b), (count, nbytes, seconds) in sorted(pairs.items()):
        ranks[rank[b]]["transfers"].append(
            {"peer": rank[a], "direction": "recv", "count": count, "bytes": nbytes, "seconds": seconds}
        )
        ranks[rank[a]]["transfers"].append(
            {"peer": rank[b], "direction": "send", "count": count, "bytes": nbytes, "seconds": 1e-6}
        )
    truth_problem = build_problem(
        graph,
        truth,
        objective=plan.objective,
        batch_size=plan.batch_size,
        max_shards=len(plan.shard_sizes),
        dtype=plan.inputs.dtype,
    )
    wall = verify_plan(plan, truth_problem, rel_tol=1.0).simulated_makespan_s
    for entry in ranks:
        entry["compute_s"] = sum(entry["tasks"].values())
        entry["total_s"] = wall
    return {
        "workload": "graph",
        "objective": plan.objective,
        "predicted_s": plan.objective_s,
        "wall_s": wall,
        "ranks": ranks,
    }
