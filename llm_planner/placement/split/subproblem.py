"""Module subproblems for MILP-SPLIT: a module of a PlacementProblem as a problem of its own.

The subproblem of module M with input cut u on device k and output cut c on
device l is the PlacementProblem restricted to {u} + M where
- u is pinned to k, takes no time and holds no memory (it ran in the previous
  module; only its output tensor matters, through the transfer costs of its edges);
- c (the module's last task) is pinned to l;
- devices outside `allowed` cannot be used (MILP-SPLIT's memory repair);
- one shard of `batch` samples, latency objective.
Its optimal makespan is exactly the time from u's finish to c's finish that the
module adds to the whole plan (see llm_planner/placement/split/split.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from llm_planner.core.plan import PlanInputs
from llm_planner.graph.ir import Task, TaskGraph
from llm_planner.placement.problem import PlacementProblem


def build_subproblem(
    problem: PlacementProblem,
    tasks: tuple[int, ...],
    input_task: int | None,
    input_device: int | None,
    output_device: int | None,
    allowed: np.ndarray,
    batch: int,
) -> tuple[PlacementProblem, list[int]]:
    """The subproblem and the global index of each of its tasks (input first, if any)."""
    local = ([input_task] if input_task is not None else []) + list(tasks)
    pos = {g: n for n, g in enumerate(local)}
    edges = [e for e in range(problem.num_edges) if int(problem.edge_src[e]) in pos and int(problem.edge_dst[e]) in pos]
    graph_tasks = [problem.graph.tasks[g] for g in local]
    graph_edges = [problem.graph.edges[e] for e in edges]
    pieces = problem.time_pieces[local].copy()
    supported = problem.supported[local].copy()
    supported[:, ~allowed] = False
    weight = problem.weight_bytes[local].copy()
    per_sample = problem.mem_bytes_per_sample[local].copy()
    if input_task is not None:
        assert input_device is not None
        name = graph_tasks[0].name
        graph_tasks[0] = Task(name=name, kind="input")
        pieces[0] = 0.0
        supported[0] = False
        supported[0, input_device] = True
        weight[0] = per_sample[0] = 0.0
    if output_device is not None:
        keep = supported[-1, output_device]
        supported[-1] = False
        supported[-1, output_device] = keep
    graph = TaskGraph(name=f"{problem.graph.name}[{local[-1]}]", tasks=tuple(graph_tasks), edges=tuple(graph_edges))
    sub = dataclasses.replace(
        problem,
        graph=graph,
        objective="latency",
        batch_size=batch,
        max_shards=1,
        time_pieces=pieces,
        supported=supported,
        edge_src=np.array([pos[int(problem.edge_src[e])] for e in edges], dtype=int),
        edge_dst=np.array([pos[int(problem.edge_dst[e])] for e in edges], dtype=int),
        comm_fixed=problem.comm_fixed[edges],
        comm_slope=problem.comm_slope[edges],
        weight_bytes=weight,
        mem_bytes_per_sample=per_sample,
        mem_counts=problem.mem_counts[local],
        hop_s_per_sample=problem.hop_s_per_sample[local],
        token_loop=None,  # a module sees no decode loop; make_plan charges it on the whole plan
        # plans of subproblems are never saved: no graph hash (make_plan would compute one)
        inputs=PlanInputs(
            cluster=None,
            cluster_sha256="",
            model={"subproblem_of": problem.graph.name},
            graph_sha256="",
            objective="latency",
            batch_size=batch,
            max_shards=1,
            dtype=problem.dtype,
        ),
    )
    return sub, local


def is_solvable(sub: PlacementProblem) -> bool:
    """Every task has at least one usable device."""
    return bool(sub.supported.any(axis=1).all())
