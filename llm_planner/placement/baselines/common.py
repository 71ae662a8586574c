"""What the baselines share: device speed order, memory checks, colocation groups, shard sizes."""

from __future__ import annotations

import numpy as np

from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.fit import runs_all, topo_order
from llm_planner.placement.problem import PlacementProblem

Result = tuple[list[int], list[list[int]], "dict[int, list[tuple[int, int]]] | None"]


def fastest_first(problem: PlacementProblem, devices: list[int]) -> list[int]:
    """Devices by (tasks they cannot run, time of the tasks they can for the batch, spec order)."""
    t = task_times(problem, problem.batch_size)
    key = {k: (int((~problem.supported[:, k]).sum()), float(t[problem.supported[:, k], k].sum()), k) for k in devices}
    return sorted(devices, key=key.__getitem__)


def fits(problem: PlacementProblem, sizes: list[int], assigns: list[list[int]]) -> bool:
    return bool(np.all(problem.device_memory_used(sizes, assigns) <= problem.mem_capacity))


def follow_groups(problem: PlacementProblem, assign: list[int]) -> list[int] | None:
    """Put each colocation group on its first member's device (topological order), or the
    fastest device that runs the whole group; None if no device runs it."""
    order = {i: pos for pos, i in enumerate(topo_order(problem))}
    ranked = fastest_first(problem, list(range(problem.num_devices)))
    out = list(assign)
    for group in problem.colocate_groups():
        first = min(group, key=order.__getitem__)
        k = next((d for d in [assign[first], *ranked] if runs_all(problem, group, d)), None)
        if k is None:
            return None
        for i in group:
            out[i] = k
    return out


def whole_graph_objective(problem: PlacementProblem, sizes: list[int], devices: list[int]) -> float:
    """Objective when shard j runs whole on devices[j] (all different): no transfers, and each
    device runs its tasks back to back, so makespan = max load = max_j sum_i t(i, devices[j], b_j)."""
    busiest = max(float(task_times(problem, b)[:, k].sum()) for b, k in zip(sizes, devices))
    return busiest / problem.batch_size if problem.objective == "throughput" else busiest


def balanced_split(problem: PlacementProblem, devices: list[int]) -> list[int] | None:
    """Shard sizes >= 1 summing to Q, one per device, each shard whole on its device, with the
    least makespan max_k T_k(b_k), T_k(b) = the whole graph's time on k for b samples (non-
    decreasing in b), among sizes that fit in memory; None if none fit. Exact: the least T
    whose capacities cap_k(T) = max{b : T_k(b) <= T, b fits on k} add up to Q is the optimum,
    and T is one of the T_k(b)."""
    q, n = problem.batch_size, problem.num_tasks
    if len(devices) > q:
        return None
    span = {b: task_times(problem, b).sum(axis=0) for b in range(1, q - len(devices) + 2)}
    fitting = {(k, b): fits(problem, [b], [[k] * n]) for k in devices for b in span}
    for limit in sorted({float(span[b][k]) for k in devices for b in span}):
        caps = [max((b for b in span if span[b][k] <= limit and fitting[(k, b)]), default=0) for k in devices]
        if min(caps) >= 1 and sum(caps) >= q:
            sizes = list(caps)
            while sum(sizes) > q:  # trim the device whose shard takes longest (ties: the later one)
                j = max((j for j in range(len(sizes)) if sizes[j] > 1), key=lambda j: (span[sizes[j]][devices[j]], j))
                sizes[j] -= 1
            if fits(problem, sizes, [[k] * n for k in devices]):
                return sizes
    return None
