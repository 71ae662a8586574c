"""Module detection for MILP-SPLIT: cut a DAG into a chain of modules.

Single-channel cuts. With a virtual source s feeding every source task and a
virtual sink t fed by every sink task, a task c is on every s-t path iff c
dominates t (Lengauer-Tarjan dominators, networkx.immediate_dominators). The
dominators of t, in topological order c_1, ..., c_m, are the cut tasks.
Module j holds the tasks that lie after c_{j-1} and up to c_j (c_j included):
every edge into module j comes from c_{j-1} or from inside the module, so a
module's only input is the output of the previous cut (the "input device" of
its subproblem) and its only output is c_j (the "output device").

Multi-channel regions. Where no single task separates the graph (residual
connections spanning blocks, randomly wired stages) the region between two
consecutive cuts is one module, however many tasks it holds: we merge rather
than carry several devices in the DP state, since the state would grow as
|K|^(cut width) and cut widths of randomly wired stages reach dozens. MILP-SPLIT
keeps such modules whole (split.split_context.SplitContext passes no size cap) and plans the
ones above SolveOptions.max_module_tasks by HEFT and local search instead of the
exact MILP (split/subsolve.py), which is where the split can lose optimality
even without memory limits (docs/milp-split.md). `split_modules` can also cut
oversize modules into chunks of consecutive tasks in topological order; a chunk
boundary is then crossed by many tensors, of which a chunk's subproblem sees
only those leaving the previous chunk's last task, so chunk costs are estimates.

Identical modules (the blocks of a transformer, repeated CNN stages) get the
same structural signature (the task and edge costs in module order), so a
subproblem is solved once per distinct signature and pair of devices.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import networkx as nx
import numpy as np

from llm_planner.placement.problem import PlacementProblem

_SOURCE, _SINK = -1, -2


@dataclass(frozen=True, kw_only=True)
class Module:
    index: int
    tasks: tuple[int, ...]  # task indices in topological order; the last is the output cut
    input_task: int | None  # the previous cut (outside this module), None for the first
    signature: str  # equal for structurally identical modules (same costs, same wiring)


def find_cut_tasks(problem: PlacementProblem) -> list[int]:
    """Tasks every source-to-sink path passes through, in topological order."""
    g = nx.DiGraph()
    g.add_nodes_from(range(problem.num_tasks))
    g.add_edges_from(zip(problem.edge_src.tolist(), problem.edge_dst.tolist()))
    sources = [v for v in g if g.in_degree(v) == 0]
    sinks = [v for v in g if g.out_degree(v) == 0]
    g.add_edges_from((_SOURCE, v) for v in sources)
    g.add_edges_from((v, _SINK) for v in sinks)
    idom = nx.immediate_dominators(g, _SOURCE)
    cuts = []
    node = idom[_SINK]
    while node != _SOURCE:
        cuts.append(node)
        node = idom[node]
    return cuts[::-1]


def _topo_position(problem: PlacementProblem) -> dict[int, int]:
    index = {t.name: i for i, t in enumerate(problem.graph.tasks)}
    return {index[name]: pos for pos, name in enumerate(problem.graph.topological_order())}


def split_modules(problem: PlacementProblem, max_module_tasks: int) -> list[Module]:
    """Modules between consecutive cut tasks, oversize ones chunked in topological order."""
    pos = _topo_position(problem)
    order = sorted(range(problem.num_tasks), key=pos.__getitem__)
    cuts = find_cut_tasks(problem)
    cut_pos = [pos[c] for c in cuts]
    groups: list[list[int]] = []
    start = 0
    for cp in cut_pos:
        groups.append(order[start : cp + 1])
        start = cp + 1
    if start < len(order):  # tasks after the last cut (cannot happen with a single sink, kept for safety)
        groups.append(order[start:])
    chunks: list[list[int]] = []
    for group in groups:
        for i in range(0, len(group), max(1, max_module_tasks)):
            chunks.append(group[i : i + max_module_tasks])
    modules = []
    in_edges = problem.in_edges()
    for j, tasks in enumerate(chunks):
        input_task = chunks[j - 1][-1] if j > 0 else None
        modules.append(
            Module(
                index=j,
                tasks=tuple(tasks),
                input_task=input_task,
                signature=module_signature(problem, tasks, input_task, in_edges),
            )
        )
    return modules


def module_signature(
    problem: PlacementProblem, tasks: list[int], input_task: int | None, in_edges: list[list[int]]
) -> str:
    """A hash of everything a module's subproblem depends on, up to renaming tasks.

    `in_edges`: `problem.in_edges()`, so that a module reads only the edges into its own tasks
    (scanning every edge per module made a 50,000-task chain quadratic: 7 minutes).
    """
    local = {t: n for n, t in enumerate(tasks)}
    if input_task is not None:
        local[input_task] = -1
    h = hashlib.sha256()
    for t in tasks:
        h.update(np.ascontiguousarray(problem.time_pieces[t]).tobytes())
        h.update(problem.supported[t].tobytes())
        h.update(
            np.array([problem.weight_bytes[t], problem.mem_bytes_per_sample[t], problem.hop_s_per_sample[t]]).tobytes()
        )
        h.update(problem.mem_counts[t].tobytes())
        h.update(problem.graph.tasks[t].colocate_group.encode())
    edges = sorted(e for t in tasks for e in in_edges[t])  # in edge order, as the hash has always been
    for e in edges:
        u, v = int(problem.edge_src[e]), int(problem.edge_dst[e])
        if u in local:
            h.update(np.array([local[u], local[v]]).tobytes())
            h.update(problem.comm_fixed[e].tobytes())
            h.update(problem.comm_slope[e].tobytes())
    return h.hexdigest()[:16]
