"""Pipelined micro-batches for MILP-SPLIT's latency plans (GPipe-style).

A batch of Q samples can also be cut into m micro-batches that all follow one
placement: contiguous stages over a chain of devices, each device holding its
stage's weights once and the per-sample memory (the KV cache) of all the
samples it serves. Micro-batch 1 enters the first stage while micro-batch 0 is
in the second, and so on; on a chain of stages with times T_1..T_n per
micro-batch the makespan is about

    sum_q T_q + (m - 1) max_q T_q      (plus the transfers between stages),

so many short, balanced stages of small micro-batches win when a stage's time
shrinks with its batch. This is how pipeline-parallel serving systems run a
batch, and what the data-parallel groups of split.data_parallel cannot express (there
each shard has devices of its own, so every group holds a full copy of the
weights and memory can force the shards onto slower devices).

Candidates, for each data-parallel grouping g (1 and those of split.data_parallel)
and each device order of split.throughput (fastest first):

- the stages of split.throughput.stage_dp (min-max stage time, memory checked
  for the group's whole share of the batch) over prefixes of the order: the
  shortest prefix that fits in memory, and the longer ones that end where the
  devices' speed changes (all the fast GPUs, then the next kind, ...). Over
  the whole order the min-max DP would spread stages onto slow devices to
  shorten the longest stage, and lengthen the sum;
- for every micro-batch count m (2 <= g m <= the problem's max_shards, at most
  the group's samples and the number of stages), the group's samples cut into m near-equal
  micro-batches on those stages, each device running micro-batch 0's tasks,
  then micro-batch 1's, ... (topological order within one).

schedule.make_plan computes each candidate's exact makespan from these device
orders; MILP-SPLIT keeps the best of all its candidates, and the verifier
checks it. Where it loses: the stages are balanced for the min-max (the
throughput DP), not for the sum plus (m - 1) max, and modules stay whole.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.core.tensor_groups import DeviceClass
from llm_planner.placement.bounds.partition import count_partitions, partitions
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.split.data_parallel import candidate_group_counts, device_groups, replicate, shard_sizes
from llm_planner.placement.split.subsolve import device_classes
from llm_planner.placement.split.throughput import device_orders, stage_dp

FINALISTS = 3  # candidates, ranked by the run-level estimate, that make_plan schedules exactly


def pipelined_plans(ctx, started: float) -> list[Plan]:
    """Latency plans with each data-parallel group's samples pipelined as micro-batches (module docstring)."""
    problem: PlacementProblem = ctx.problem
    topo = [problem.graph.index(n) for n in problem.graph.topological_order()]
    groupings = [[list(range(problem.num_devices))]] + [
        device_groups(problem, g) for g in candidate_group_counts(problem)
    ]
    times = functools.lru_cache(maxsize=None)(lambda b: task_times(problem, b))
    ranked = []  # (estimated makespan, tie-break, groups, group sizes, group 0's assignment, m)
    for groups in groupings:
        group_sizes = shard_sizes(problem.batch_size, len(groups))
        most = min(group_sizes[-1], problem.max_shards // len(groups))
        if most < 2:
            continue
        for full in device_orders(problem, groups[0], group_sizes[0]):
            for order, where in _prefix_stages(ctx, full, group_sizes[0]):
                stages0 = [-1] * problem.num_tasks
                for module, q in zip(ctx.modules, where):
                    for t in module.tasks:
                        stages0[t] = order[q]
                for m in range(2, min(most, len(set(stages0))) + 1):
                    estimate = run_estimate(problem, times, [stages0] * m, topo, shard_sizes(group_sizes[0], m))
                    ranked.append((estimate, len(ranked), groups, group_sizes, stages0, m))
    ranked.sort(key=lambda r: r[:2])
    return [
        _plan(problem, groups, sizes, stages0, m, topo, started)
        for _, _, groups, sizes, stages0, m in ranked[:FINALISTS]
    ]


def _plan(
    problem: PlacementProblem,
    groups: list[list[int]],
    group_sizes: list[int],
    stages0: list[int],
    m: int,
    topo: list[int],
    started: float,
) -> Plan:
    """Each group's samples in m micro-batches on group 0's stages (mapped to the group), scheduled exactly."""
    sizes, assignments = [], []
    for assign, size in zip(replicate(groups, stages0, {})[0], group_sizes):
        for micro in shard_sizes(size, m):
            sizes.append(micro)
            assignments.append(assign)
    return make_plan(
        problem,
        sizes,
        assignments,
        solver="milp-split",
        status="heuristic",
        started_at=started,
        lower_bound_s=0.0,
        device_orders=run_orders(assignments, topo),
    )


def _prefix_stages(ctx, order: list[int], batch: int) -> list[tuple[list[int], list[int]]]:
    """(prefix, stage_dp's module -> device position) for the prefixes of the module docstring."""
    stages = functools.lru_cache(maxsize=None)(lambda n: stage_dp(ctx, batch, order[:n]))
    if stages(len(order)) is None:
        return []
    lo, hi = 1, len(order)  # fitting is monotone in the prefix (a device may stay idle): the shortest one by bisection
    while lo < hi:
        mid = (lo + hi) // 2
        if stages(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    times = task_times(ctx.problem, batch)[:, order]
    speed = np.where(np.isfinite(times), times, 0.0).sum(axis=0)
    ends = sorted({lo} | {n for n in range(lo + 1, len(order)) if speed[n] != speed[n - 1]} | {len(order)})
    return [(order[:n], stages(n)) for n in ends if stages(n) is not None]


# -- replicated stages --------------------------------------------------------------------------

MAX_SIZE_SPLITS = 64  # micro-batch size lists tried per count m (all partitions of Q when there are no more)


def run_orders(assignments: list[list[int]], topo: list[int]) -> dict[int, list[tuple[int, int]]]:
    """Each device's (shard, task) items, run by run: a run is a maximal stretch of one shard's
    tasks in topological order on one device; every shard's r-th run comes before any shard's
    (r + 1)-th, shards in index order. With one run per device (the contiguous stages of
    `pipelined_plans`) this is GPipe's order: each device runs shard 0's tasks, then shard
    1's; a device that a shard visits twice (a decoder's LM head beside its embedding) serves
    every shard's first visit before any second one. Deadlock-free: an item waits only for
    items of a smaller (run, shard)."""
    runs = [_runs(assign, topo) for assign in assignments]
    orders: dict[int, list[tuple[int, int]]] = {}
    for r in range(max((len(x) for x in runs), default=0)):
        for s, shard_runs in enumerate(runs):
            if r < len(shard_runs):
                device, tasks = shard_runs[r]
                orders.setdefault(device, []).extend((s, i) for i in tasks)
    return orders


def _runs(assign: list[int], topo: list[int]) -> list[tuple[int, list[int]]]:
    out: list[tuple[int, list[int]]] = []
    for i in topo:
        if out and out[-1][0] == assign[i]:
            out[-1][1].append(i)
        else:
            out.append((assign[i], [i]))
    return out


def run_estimate(
    problem: PlacementProblem,
    times: Callable[[int], np.ndarray],
    assignments: list[list[int]],
    topo: list[int],
    sizes: list[int],
) -> float:
    """Makespan of shards `sizes` on `assignments` in `run_orders`, at the level of runs: a run
    starts when its device has finished the run before it and its inputs from the shard's
    earlier runs have arrived, and takes the sum of its tasks' times. Like make_plan's step_time,
    a decoder's step ends no earlier than each shard's lm_head finish plus its token hand-off back
    to embed (PlacementProblem.token_time). Exact for a chain; an estimate elsewhere, used only to
    rank candidates."""
    structure: dict[tuple[int, ...], list[tuple[int, list[int], list[tuple[int, float, float]]]]] = {}
    for assign in assignments:
        if tuple(assign) not in structure:
            structure[tuple(assign)] = _run_inputs(problem, assign, topo)
    runs = [structure[tuple(assign)] for assign in assignments]
    work: dict[tuple[int, int, int], float] = {}  # (id of the run's task list, device, samples) -> its time
    free = [0.0] * problem.num_devices
    done = [[0.0] * problem.num_tasks for _ in sizes]
    for r in range(max((len(x) for x in runs), default=0)):
        for s, (shard_runs, b) in enumerate(zip(runs, sizes)):
            if r >= len(shard_runs):
                continue
            d, tasks, inputs = shard_runs[r]
            finished = done[s]
            ready = max((finished[u] + fixed + slope * b for u, fixed, slope in inputs), default=0.0)
            key = (id(tasks), d, b)
            if key not in work:
                work[key] = float(times(b)[tasks, d].sum())
            free[d] = max(ready, free[d]) + work[key]
            for i in tasks:
                finished[i] = free[d]
    end = max(free, default=0.0)
    if problem.token_loop is None:
        return end
    head = problem.token_loop[0]
    return max([end] + [done[s][head] + problem.token_time(a, b) for s, (a, b) in enumerate(zip(assignments, sizes))])


def _run_inputs(
    problem: PlacementProblem, assign: list[int], topo: list[int]
) -> list[tuple[int, list[int], list[tuple[int, float, float]]]]:
    """Each run of `assign` as (device, tasks, (source, fixed time, per-sample time) of each
    edge into it from outside)."""
    ins = problem.in_edges()
    out = []
    for d, tasks in _runs(assign, topo):
        inside = set(tasks)
        inputs = []
        for i in tasks:
            for e in ins[i]:
                u = int(problem.edge_src[e])
                if u not in inside:
                    inputs.append(
                        (u, float(problem.comm_fixed[e, assign[u], d]), float(problem.comm_slope[e, assign[u], d]))
                    )
        out.append((d, tasks, inputs))
    return out


def replicated_plans(problem: PlacementProblem, bases: list[list[int]], started: float) -> list[Plan]:
    """Micro-batches over one-shard placements whose stages have idle twins (module docstring).

    For each base assignment, each device d it uses gets a pool: d and the devices of d's class
    (llm_planner.core.tensor_groups.device_class: same server template, kind and degree) that the base leaves
    idle, each idle one going to the stage of its class with the most work per device. Shard k runs
    d's tasks on the (k mod |pool|)-th device of d's pool, which then holds d's weights too. Shard
    sizes: every partition of Q into m parts, largest first (near-equal ones alone when there are
    more than MAX_SIZE_SPLITS), for 2 <= m <= the problem's max_shards; those that fit in memory
    are ranked by `run_estimate` and the best FINALISTS scheduled exactly in `run_orders`."""

    q, most = problem.batch_size, min(problem.batch_size, problem.max_shards)
    if most < 2:
        return []
    topo = [problem.graph.index(n) for n in problem.graph.topological_order()]
    times = functools.lru_cache(maxsize=None)(lambda b: task_times(problem, b))
    classes = device_classes(problem)
    work = times(math.ceil(q / 2))
    ranked, seen = [], set()
    for base in bases:
        pools = _pools(base, classes, work)
        if all(len(pool) == 1 for pool in pools.values()):
            continue
        for m in range(2, most + 1):
            splits = list(partitions(q, m)) if count_partitions(q, m) <= MAX_SIZE_SPLITS else [tuple(shard_sizes(q, m))]
            assigns = [[pools[d][k % len(pools[d])] for d in base] for k in range(m)]
            for sizes in splits:
                if len(sizes) != m or (tuple(base), sizes) in seen:
                    continue
                seen.add((tuple(base), sizes))
                if (problem.device_memory_used(list(sizes), assigns) > problem.mem_capacity).any():
                    continue
                ranked.append(
                    (run_estimate(problem, times, assigns, topo, list(sizes)), len(ranked), list(sizes), assigns)
                )
    ranked.sort(key=lambda r: r[:2])
    return [
        make_plan(
            problem,
            sizes,
            assigns,
            solver="milp-split",
            status="heuristic",
            started_at=started,
            lower_bound_s=0.0,
            device_orders=run_orders(assigns, topo),
        )
        for _, _, sizes, assigns in ranked[:FINALISTS]
    ]


def _pools(base: list[int], classes: list[DeviceClass], work: np.ndarray) -> dict[int, list[int]]:
    """Each used device's pool: itself and the idle devices of its class it gets (replicated_plans)."""
    used = sorted(set(base))
    load = {d: float(sum(work[i, d] for i, k in enumerate(base) if k == d)) for d in used}
    pools = {d: [d] for d in used}
    for e in range(len(classes)):
        if e in pools:
            continue
        takers = [d for d in used if classes[d] == classes[e]]
        if takers:
            d = max(takers, key=lambda d: (load[d] / len(pools[d]), -d))
            pools[d].append(e)
    return pools
