"""From an assignment to a timed schedule, an objective and a Plan.

Every solver decides *where* each (shard, task) runs and, optionally, in which
order each device runs them; this module computes *when* (as soon as possible)
and the objective, the same way for all solvers. The verifier does not use this
module: it recomputes everything with its own simulation.

Assignments are `list[list[int]]`: per shard, the device index of each task.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import replace

import numpy as np

from llm_planner.core.plan import Plan, PlanInputs, ScheduledTask, SolverInfo
from llm_planner.placement.problem import PlacementProblem

Assignment = list[list[int]]


class ScheduleError(RuntimeError):
    """Device orders that contradict the graph (a cycle) or an unsupported placement."""


def upward_rank(problem: PlacementProblem, assign: list[int], batch: int) -> np.ndarray:
    """Longest path to a sink from each task, times and transfers included."""
    rank = np.zeros(problem.num_tasks)
    out_edges = problem.out_edges()
    index = {t.name: i for i, t in enumerate(problem.graph.tasks)}
    for name in reversed(problem.graph.topological_order()):
        i = index[name]
        tail = 0.0
        for e in out_edges[i]:
            v = int(problem.edge_dst[e])
            tail = max(tail, problem.transfer_time(e, assign[i], assign[v], batch) + rank[v])
        rank[i] = problem.task_time(i, assign[i], batch) + tail
    return rank


def asap_schedule(
    problem: PlacementProblem,
    shard_sizes: list[int],
    assignments: Assignment,
    device_orders: dict[int, list[tuple[int, int]]] | None = None,
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """Start and finish of every (shard, task).

    With `device_orders` (device -> [(shard, task), ...]) each device follows that
    order; without, a greedy list scheduler picks, among ready items, the one that
    can start earliest (ties: larger upward rank first).
    """
    in_edges = problem.in_edges()
    out_edges = problem.out_edges()
    items = [(s, i) for s, b in enumerate(shard_sizes) if b > 0 for i in range(problem.num_tasks)]
    waiting = {it: len(in_edges[it[1]]) for it in items}
    position: dict[tuple[int, int], tuple[int, int]] = {}
    if device_orders is not None:
        for k, order in device_orders.items():
            for pos, it in enumerate(order):
                position[it] = (k, pos)
        for it in items:
            if it not in position:
                raise ScheduleError(f"device orders miss task {problem.graph.tasks[it[1]].name!r} of shard {it[0]}")
            waiting[it] += 1 if position[it][1] > 0 else 0
    ranks = {s: upward_rank(problem, assignments[s], shard_sizes[s]) for s, b in enumerate(shard_sizes) if b > 0}
    if device_orders is None:
        return _list_schedule(problem, shard_sizes, assignments, ranks, waiting)
    data_ready = {it: 0.0 for it in items}
    device_free = np.zeros(problem.num_devices)
    start, finish = {}, {}
    heap = [(0.0, -ranks[s][i], s, i) for (s, i) in items if waiting[(s, i)] == 0]
    heapq.heapify(heap)
    while heap:
        est, _, s, i = heapq.heappop(heap)
        k = assignments[s][i]
        if not problem.supported[i, k]:
            raise ScheduleError(f"task {problem.graph.tasks[i].name!r} cannot run on {problem.devices[k].name}")
        now = max(device_free[k], data_ready[(s, i)])
        if now > est + 1e-15:  # the device got busier since this item was queued
            heapq.heappush(heap, (now, -ranks[s][i], s, i))
            continue
        start[(s, i)] = now
        finish[(s, i)] = now + problem.task_time(i, k, shard_sizes[s])
        device_free[k] = finish[(s, i)]
        released = []
        for e in out_edges[i]:
            v = int(problem.edge_dst[e])
            arrive = finish[(s, i)] + problem.transfer_time(e, k, assignments[s][v], shard_sizes[s])
            data_ready[(s, v)] = max(data_ready[(s, v)], arrive)
            waiting[(s, v)] -= 1
            released.append((s, v))
        if device_orders is not None:
            _, pos = position[(s, i)]
            order = device_orders[k]
            if pos + 1 < len(order):
                nxt = order[pos + 1]
                data_ready[nxt] = max(data_ready[nxt], finish[(s, i)])
                waiting[nxt] -= 1
                released.append(nxt)
        for it in dict.fromkeys(released):  # an item can be both a graph successor and next on the device
            if waiting[it] == 0:
                ready_at = max(data_ready[it], device_free[assignments[it[0]][it[1]]] if device_orders is None else 0.0)
                heapq.heappush(heap, (ready_at, -ranks[it[0]][it[1]], it[0], it[1]))
    if len(start) != len(items):
        raise ScheduleError("the device orders contradict the task graph (a cycle between devices)")
    return start, finish


def _list_schedule(
    problem: PlacementProblem,
    shard_sizes: list[int],
    assignments: Assignment,
    ranks: dict[int, np.ndarray],
    waiting: dict[tuple[int, int], int],
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """asap_schedule without device orders: repeatedly start the ready item of least
    (earliest start, -upward rank, shard, task), its earliest start being
    max(its device free, its data there).

    Per device, ready items wait in `pending` (by data-ready time) until the device
    is free by then, and in `avail` (by rank) after; the choice is the best head over
    devices, so each item moves through the heaps once: O(items (devices + log items)).
    """
    num_k, out_edges = problem.num_devices, problem.out_edges()
    pending: list[list[tuple[float, float, int, int]]] = [[] for _ in range(num_k)]
    avail: list[list[tuple[float, int, int]]] = [[] for _ in range(num_k)]
    device_free = [0.0] * num_k
    data_ready = {it: 0.0 for it in waiting}
    for (s, i), count in waiting.items():
        if count == 0:
            heapq.heappush(pending[assignments[s][i]], (0.0, -ranks[s][i], s, i))
    start, finish = {}, {}
    while True:
        best: tuple[tuple[float, float, int, int], int] | None = None
        for k in range(num_k):
            pend, ready = pending[k], avail[k]
            while pend and pend[0][0] <= device_free[k]:
                heapq.heappush(ready, heapq.heappop(pend)[1:])
            head = (device_free[k], *ready[0]) if ready else (pend[0] if pend else None)
            if head is not None and (best is None or head < best[0]):
                best = (head, k)
        if best is None:
            break
        (_, _, s, i), k = best
        now = max(device_free[k], data_ready[(s, i)])
        heapq.heappop(avail[k] if avail[k] else pending[k])
        if not problem.supported[i, k]:
            raise ScheduleError(f"task {problem.graph.tasks[i].name!r} cannot run on {problem.devices[k].name}")
        start[(s, i)] = now
        finish[(s, i)] = device_free[k] = now + problem.task_time(i, k, shard_sizes[s])
        for e in out_edges[i]:
            v = int(problem.edge_dst[e])
            arrive = finish[(s, i)] + problem.transfer_time(e, k, assignments[s][v], shard_sizes[s])
            data_ready[(s, v)] = max(data_ready[(s, v)], arrive)
            waiting[(s, v)] -= 1
            if waiting[(s, v)] == 0:
                heapq.heappush(pending[assignments[s][v]], (data_ready[(s, v)], -ranks[s][v], s, v))
    assert len(start) == len(waiting), "a task never became ready in an acyclic graph"
    return start, finish


def device_loads(problem: PlacementProblem, shard_sizes: list[int], assignments: Assignment) -> np.ndarray:
    """Busy time of every device per batch, under the problem's throughput model."""
    load = np.zeros(problem.num_devices)
    out_edges = problem.out_edges()
    charged = range(problem.num_edges if problem.throughput_model == "direct" else problem.num_tasks)
    for s, b in enumerate(shard_sizes):
        if b <= 0:
            continue
        a = assignments[s]
        for i in range(problem.num_tasks):
            load[a[i]] += problem.task_time(i, a[i], b)
        add_transfer_charges(problem, load, a, b, charged, out_edges)
        add_token_charges(problem, load, a, b)
    return load


def add_token_charges(problem: PlacementProblem, load: np.ndarray, assign: list[int], batch: int) -> None:
    """The decode loop's token hand-off (PlacementProblem.token_time), charged to both its ends
    like a cut edge of the direct model."""
    if problem.token_loop is not None:
        c = problem.token_time(assign, batch)
        load[assign[problem.token_loop[0]]] += c
        load[assign[problem.token_loop[1]]] += c


def step_time(problem: PlacementProblem, sizes: list[int], assignments: Assignment, finish: dict) -> float:
    """One step's latency: the last finish, or a shard's lm_head finish plus its token hand-off back
    to embed when that is later (the next step starts there; docs/objectives.md)."""
    end = max(finish.values())
    if problem.token_loop is None:
        return end
    head = problem.token_loop[0]
    return max(
        [end] + [finish[(s, head)] + problem.token_time(a, b) for s, (a, b) in enumerate(zip(assignments, sizes))]
    )


def add_transfer_charges(
    problem: PlacementProblem, load: np.ndarray, assign: list[int], batch: int, items, out_edges: list[list[int]]
) -> None:
    """Add to `load` the transfer charges of `items` for a shard of `batch` samples placed by `assign`,
    under the problem's throughput model: items are edges (direct: a cut edge's transfer time
    on both its ends) or tasks (host-staged: a task's output, sent once if any successor is
    elsewhere, costs its hop on each accelerator it leaves or enters). `out_edges`:
    problem.out_edges(), passed in so that callers in a loop compute it once."""
    a = assign
    if problem.throughput_model == "direct":
        for e in items:
            k, l = a[int(problem.edge_src[e])], a[int(problem.edge_dst[e])]
            if k != l:
                c = problem.transfer_time(e, k, l, batch)
                load[k] += c
                load[l] += c
        return
    for u in items:
        k = a[u]
        dests = {a[int(problem.edge_dst[e])] for e in out_edges[u]} - {k}
        cost = problem.hop_s_per_sample[u] * batch
        if dests and not problem.is_cpu[k]:
            load[k] += cost
        for l in dests:
            if not problem.is_cpu[l]:
                load[l] += cost


def make_plan(
    problem: PlacementProblem,
    shard_sizes: list[int],
    assignments: Assignment,
    *,
    solver: str,
    status: str,
    started_at: float,
    lower_bound_s: float,
    backend: str = "",
    details: dict | None = None,
    device_orders: dict[int, list[tuple[int, int]]] | None = None,
) -> Plan:
    """Schedule the assignment, compute the objective and wrap it as a Plan."""
    sizes = [int(b) for b in shard_sizes]
    keep = [s for s, b in enumerate(sizes) if b > 0]
    if device_orders is not None:
        remap = {old: new for new, old in enumerate(keep)}
        device_orders = {k: [(remap[s], i) for s, i in order if s in remap] for k, order in device_orders.items()}
    sizes = [sizes[s] for s in keep]
    assignments = [list(map(int, assignments[s])) for s in keep]
    start, finish = asap_schedule(problem, sizes, assignments, device_orders)
    names, devs = [t.name for t in problem.graph.tasks], problem.device_names
    schedule = tuple(
        ScheduledTask(
            task=names[i], shard=s, device=devs[assignments[s][i]], start_s=start[(s, i)], finish_s=finish[(s, i)]
        )
        for (s, i) in sorted(start, key=lambda it: (start[it], it))
    )
    max_load = float(device_loads(problem, sizes, assignments).max())
    if problem.objective == "latency":
        objective_s = step_time(problem, sizes, assignments, finish)
    else:
        objective_s = max_load / problem.batch_size
    inputs = problem.inputs or PlanInputs(
        cluster=None,
        cluster_sha256="",
        model={},
        graph_sha256=problem.graph.sha256(),
        objective=problem.objective,
        batch_size=problem.batch_size,
        max_shards=problem.max_shards,
        dtype=problem.dtype,
    )
    return Plan(
        inputs=inputs,
        objective=problem.objective,
        objective_s=float(objective_s),
        lower_bound_s=float(lower_bound_s),
        shard_sizes=tuple(sizes),
        shard_assignments=tuple({names[i]: devs[a[i]] for i in range(len(names))} for a in assignments),
        schedule=schedule,
        solver=SolverInfo(
            name=solver, status=status, time_s=time.perf_counter() - started_at, backend=backend, details=details or {}
        ),
        max_load_s=max_load,
    )


def with_bound(plan: Plan, lower_bound_s: float) -> Plan:
    """The same plan with the better of its bound and `lower_bound_s`."""
    return replace(plan, lower_bound_s=float(max(plan.lower_bound_s, lower_bound_s)))
