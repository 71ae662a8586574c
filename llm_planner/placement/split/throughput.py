"""MILP-SPLIT for the throughput objective: contiguous pipeline stages by a min-max DP.

Modules stay whole (a module's tasks share a device) and are laid along a
device order as contiguous stages, the way pipeline-parallel systems cut a
model. With modules m_0..m_{M-1} and devices d_0..d_{K-1} in the order,

    F[q][j] = min( F[q-1][j],                                       (device q idle)
                   min_{i<j} max(F[q-1][i], W(i..j-1, d_q) + X(i, j, q)) )

is the least bottleneck load when modules 0..j-1 are on devices d_0..d_q, with
W the stage's task time on d_q and X its transfer charges: the tensor of the
cut entering the stage (from d_{q-1}) and the one leaving it (to d_{q+1}), each
charged as the problem's throughput model says. Charges are estimated with the
neighbouring devices of the order (a skipped device makes the estimate
inexact); the plan's load is then computed exactly by schedule.make_plan.
Stages must fit in memory, with the per-sample memory (KV cache) of every batch the
plan keeps in flight (problem.fit): a plan that needs B batches and does not fit them is
planned again with the memory of B batches. The device orders tried (`device_orders`): fastest
device first; fastest server first, its devices fastest first; and every other
order of the device classes when there are at most MAX_DEVICE_ORDERS of them;
each for one shard and for the data-parallel groups of split.data_parallel, and the
best exact plan is kept.

Where this loses against the exact MILP: modules cannot be split over several
devices, each device holds one contiguous stage, and transfer estimates may
steer the DP wrong when devices are skipped. split.loads then moves single
tasks between devices, starting from the best of these plans.
"""

from __future__ import annotations

import math

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.core.tensor_groups import DeviceClass, device_class
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.fit import MAX_IN_FLIGHT_RESOLVES, fits_steady_state
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.split.data_parallel import candidate_group_counts, device_groups, replicate, shard_sizes

INF = float("inf")


def _module_arrays(ctx, batch: int, devices: list[int], batches: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """work[j, q]: time of module j on devices[q] (inf if unsupported); mem[j, q]: its memory there,
    per-sample memory counted for `batches` batches in flight."""

    p: PlacementProblem = ctx.problem
    times = task_times(p, batch)[:, devices]
    per_task_mem = p.memory_need(batch, batches)[:, devices]
    work = np.array([times[list(m.tasks)].sum(axis=0) for m in ctx.modules])
    mem = np.array([per_task_mem[list(m.tasks)].sum(axis=0) for m in ctx.modules])
    return work, mem


def _cut_charge(ctx, cut_edges: list[list[int]], j: int, k: int, l: int, batch: int) -> tuple[float, float]:
    """(sender charge, receiver charge) of moving cut j's output from k to l."""
    p: PlacementProblem = ctx.problem
    if k == l or j + 1 >= len(ctx.modules):
        return 0.0, 0.0
    if p.throughput_model == "host_staged":
        hop = p.hop_s_per_sample[ctx.modules[j].tasks[-1]] * batch
        return (0.0 if p.is_cpu[k] else hop), (0.0 if p.is_cpu[l] else hop)
    total = sum(p.transfer_time(e, k, l, batch) for e in cut_edges[j])
    return total, total


def stage_dp(ctx, batch: int, devices: list[int], batches: int = 1) -> list[int] | None:
    """Device (index into `devices`) of every module, or None if nothing fits with the per-sample
    memory of `batches` batches in flight."""
    num_m, num_q = len(ctx.modules), len(devices)
    work, mem = _module_arrays(ctx, batch, devices, batches)
    bad = ~np.isfinite(work)  # module j cannot run on devices[q]
    cum_w = np.vstack([np.zeros(num_q), np.cumsum(np.where(bad, 0.0, work), axis=0)])
    cum_bad = np.vstack([np.zeros(num_q), np.cumsum(bad, axis=0)])
    cum_m = np.vstack([np.zeros(num_q), np.cumsum(mem, axis=0)])
    cap = ctx.problem.mem_capacity[devices]
    out_edges = ctx.problem.out_edges()
    cut_edges = [out_edges[m.tasks[-1]] for m in ctx.modules]
    F = np.full((num_q + 1, num_m + 1), INF)
    F[:, 0] = 0.0
    arg = np.full((num_q + 1, num_m + 1), -1, dtype=int)
    for q in range(1, num_q + 1):
        d = devices[q - 1]
        prev = devices[q - 2] if q >= 2 else None
        nxt = devices[q] if q < num_q else None
        F[q] = F[q - 1]
        arg[q] = -1
        inc = np.zeros(num_m + 1)  # charge for the cut entering a stage that starts at module i
        out = np.zeros(num_m + 1)  # charge for the cut leaving a stage that ends before module j
        for i in range(1, num_m + 1):
            if prev is not None:
                inc[i] = _cut_charge(ctx, cut_edges, i - 1, prev, d, batch)[1]
            if nxt is not None:
                out[i] = _cut_charge(ctx, cut_edges, i - 1, d, nxt, batch)[0]
        for j in range(1, num_m + 1):
            i = np.arange(j)
            load = cum_w[j, q - 1] - cum_w[i, q - 1]
            fits = ((cum_m[j, q - 1] - cum_m[i, q - 1]) <= cap[q - 1]) & (cum_bad[j, q - 1] == cum_bad[i, q - 1])
            value = np.maximum(F[q - 1, i], load + inc[i] + out[j])
            value[~fits] = INF
            best = int(np.argmin(value))
            if value[best] < F[q, j]:
                F[q, j], arg[q, j] = value[best], best
    if not np.isfinite(F[num_q, num_m]):
        return None
    where = [0] * num_m
    j = num_m
    for q in range(num_q, 0, -1):
        i = arg[q, j]
        if i < 0:
            continue
        for jj in range(i, j):
            where[jj] = q - 1
        j = i
        if j == 0:
            break
    return where


def device_orders(problem: PlacementProblem, devices: list[int], batch: int) -> list[list[int]]:
    """The device orders the stage DP lays modules along.

    Fastest device first, and fastest server first with its devices fastest first;
    then every other order of the device classes (devices of one class, device_class, on one
    server are interchangeable, so each class keeps its devices fastest first), as long as
    there are at most MAX_DEVICE_ORDERS distinct orders in all. The fastest device
    does not always take the first stage: on an RWNN over a CPU, an A100 and a T4
    the best contiguous plan puts the first third on the T4 and the rest on the
    A100, an order the first two miss.
    """

    times = task_times(problem, batch)[:, devices]
    speed = {d: float(np.sum(np.where(np.isfinite(times[:, q]), times[:, q], 0.0))) for q, d in enumerate(devices)}
    fastest = sorted(devices, key=lambda d: (speed[d], d))
    node_best: dict[str, float] = {}
    for d in devices:
        node = problem.devices[d].node
        node_best[node] = min(node_best.get(node, INF), speed[d])
    by_node = sorted(devices, key=lambda d: (node_best[problem.devices[d].node], problem.devices[d].node, speed[d], d))
    orders = [fastest] if by_node == fastest else [fastest, by_node]
    members: dict[tuple[str, DeviceClass], list[int]] = {}
    for d in fastest:
        members.setdefault((problem.devices[d].node, device_class(problem.devices[d])), []).append(d)
    counts = [len(m) for m in members.values()]
    if _arrangements(counts) > MAX_DEVICE_ORDERS:
        return orders
    queues = list(members.values())
    for classes in _class_sequences(counts):
        members_left = [iter(q) for q in queues]  # each class hands out its devices fastest first
        order = [next(members_left[c]) for c in classes]
        if order not in orders:
            orders.append(order)
    return orders


MAX_DEVICE_ORDERS = 120  # distinct class orders tried by the stage DP (5 distinct devices: all of them)


def _arrangements(counts: list[int]) -> int:
    """The number of distinct sequences of a multiset with these multiplicities."""
    return math.factorial(sum(counts)) // math.prod(math.factorial(c) for c in counts)


def _class_sequences(counts: list[int]):
    """Every distinct sequence of class indices with these multiplicities, in lexicographic order."""
    left, seq = list(counts), []

    def extend():
        if len(seq) == sum(counts):
            yield tuple(seq)
            return
        for c, n in enumerate(left):
            if n:
                left[c] -= 1
                seq.append(c)
                yield from extend()
                seq.pop()
                left[c] += 1

    yield from extend()


def throughput_plan(ctx, started: float) -> list[Plan]:
    """Stage plans for one shard and for each data-parallel grouping, each one whose steady state fits."""
    problem: PlacementProblem = ctx.problem
    plans = []
    groupings = [[list(range(problem.num_devices))]] + [
        device_groups(problem, g) for g in candidate_group_counts(problem)
    ]
    for groups in groupings:
        sizes = shard_sizes(problem.batch_size, len(groups))
        for order in device_orders(problem, groups[0], sizes[0]):
            plan = _stage_plan(ctx, started, groups, sizes, order)
            if plan is not None:
                plans.append(plan)
    return plans


def _stage_plan(ctx, started: float, groups: list[list[int]], sizes: list[int], order: list[int]) -> Plan | None:
    """The stage DP's plan along `order` whose steady state fits (problem.fit): when the plan needs
    B batches in flight and their memory does not fit, the DP again with the memory of more
    batches (B, or one more than last time), which cuts fewer stages or spares memory."""
    problem: PlacementProblem = ctx.problem
    batches = 1
    for _ in range(MAX_IN_FLIGHT_RESOLVES + 1):
        where = stage_dp(ctx, sizes[0], order, batches)
        if where is None:
            return None
        assign0 = [-1] * problem.num_tasks
        for module, q in zip(ctx.modules, where):
            for t in module.tasks:
                assign0[t] = order[q]
        assignments, _ = replicate(groups, assign0, {})
        plan = make_plan(
            problem, sizes, assignments, solver="milp-split", status="heuristic", started_at=started, lower_bound_s=0.0
        )
        if problem.objective != "throughput" or fits_steady_state(problem, plan):
            return plan
        batches = max(batches + 1, plan.batches_in_flight)
    return None
