"""A MILP solution and a plan, each read as the other: the integer values a plan sets (a warm
start), and the shard sizes, assignments and (latency) device orders a solution's values give.
The formulation and its variables: llm_planner.placement.milp.model."""

from __future__ import annotations

import math

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.placement.milp.model import Formulation


def warm_start_values(form: Formulation, plan: Plan) -> dict[int, float] | None:
    """Integer variables (x, b, u, o) of a plan; the backend completes the continuous ones."""
    p = form.p
    if len(plan.shard_sizes) > form.S:
        return None
    task = {t.name: i for i, t in enumerate(p.graph.tasks)}
    dev = {n: k for k, n in enumerate(p.device_names)}
    order = sorted(range(len(plan.shard_sizes)), key=lambda s: -plan.shard_sizes[s])  # sizes must decrease
    values: dict[int, float] = {int(c): 0.0 for c in form.x.ravel()}
    for new, old in enumerate(order):
        for name, device in plan.shard_assignments[old].items():
            values[int(form.x[new, task[name], dev[device]])] = 1.0
    if not form.fixed:
        for s in range(form.S):
            size = plan.shard_sizes[order[s]] if s < len(order) else 0
            values[int(form.size[s])] = float(size)
            values[int(form.active[s])] = float(size > 0)
    if p.has_groups:
        used = {dev[d] for a in plan.shard_assignments for d in a.values()}
        for k, col in form.use.items():
            values[col] = float(k in used)
    if form.latency:
        shard_of = {old: new for new, old in enumerate(order)}
        start = {(shard_of[st.shard], task[st.task]): (st.start_s, st.finish_s) for st in plan.schedule}
        for n, (s, i, s2, j) in enumerate(form.pairs):
            first = start.get((s, i), (math.inf, math.inf)) <= start.get((s2, j), (math.inf, math.inf))
            values[int(form.order[n])] = float(first)
    return values


def read_solution(
    form: Formulation, values: np.ndarray
) -> tuple[list[int], list[list[int]], dict[int, list[tuple[int, int]]] | None]:
    """(shard sizes, per-shard device of every task, latency: each device's (shard, task) order)."""
    p = form.p
    sizes = [form.Q] if form.fixed else [int(round(values[c])) for c in form.size]
    x = np.where(p.supported[None], values[form.x], -1.0)
    assignments = [[int(np.argmax(x[s, i])) for i in range(form.N)] for s in range(form.S)]
    if not form.latency:
        return sizes, assignments, None
    return sizes, assignments, _device_orders(form, values, sizes, assignments)


def _device_orders(
    form: Formulation, values: np.ndarray, sizes: list[int], assignments: list[list[int]]
) -> dict[int, list[tuple[int, int]]]:
    """Each device's items sorted by (start, finish, topological position, shard).

    Starts are first pushed forward along edges (start_v >= finish_u + transfer) to
    undo the solver's feasibility tolerance; then the order is one global order
    consistent with the task graph, so the device orders can never form a cycle.
    """
    p = form.p
    index = {t.name: i for i, t in enumerate(p.graph.tasks)}
    topo = [index[n] for n in p.graph.topological_order()]
    position = {i: n for n, i in enumerate(topo)}
    in_edges = p.in_edges()
    keys = []
    for s, b in enumerate(sizes):
        if b <= 0:
            continue
        a = assignments[s]
        start, finish = {}, {}
        for v in topo:
            ready = max(
                (finish[int(p.edge_src[e])] + p.transfer_time(e, a[int(p.edge_src[e])], a[v], b) for e in in_edges[v]),
                default=0.0,
            )
            start[v] = max(float(values[form.start[s, v]]), ready)
            finish[v] = start[v] + p.task_time(v, a[v], b)
            keys.append((start[v], finish[v], position[v], s, v))
    orders: dict[int, list[tuple[int, int]]] = {k: [] for k in range(form.K)}
    for _, _, _, s, v in sorted(keys):
        orders[assignments[s][v]].append((s, v))
    return orders
