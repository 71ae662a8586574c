"""Baseline planners: what a user would do instead of solving the MILP.

Each baseline decides an assignment (and for "heft" the device orders); the
shared scheduler (problem.schedule.make_plan) times it and computes the
objective, so baselines and solvers are scored the same way. Every baseline
respects device support, colocation groups and memory, or returns None.
docs/objectives.md describes them.

- "single-device": every task on one device that runs them all and holds them
  all; of those, the one whose plan is best (the reference of the MILP-SPLIT
  paper, "everything on the fastest device that fits").
- "even-split": tasks in topological order cut into contiguous stages of equal
  task count (sizes differ by at most one), one per device, over the
  accelerators fastest first (all devices if there are none), as pipeline
  libraries do by default. A task its stage's device cannot run goes to the
  fastest device that can.
- "memory-greedy": tasks in topological order fill the accelerators in spec
  order, then the CPUs, moving to the next device when one is full, as Hugging
  Face's device_map="auto" does. A task the current device cannot run goes to
  the first later device that can, without moving on.
- "heft": HEFT (Topcuoglu, Hariri, Wu, IEEE TPDS 2002): tasks by decreasing
  upward rank (mean task times and mean transfer times), each on the device
  giving the earliest finish time with transfers, insertion-based, skipping
  devices without memory room; a colocation group goes where its first member
  (in that order) goes.
- "data-parallel": the batch split over the m fastest devices that run every
  task and hold the whole graph for one sample, each shard whole on one device,
  with the shard sizes that give the least makespan (not proportional to speed:
  a device's time for b samples is not linear in b); the best m up to max_shards.

Speed of a device: the time of the whole graph on it for the full batch.
All use one shard except "data-parallel", and single devices only (on a problem with
tensor-parallel groups they run on its physical devices; solve/baselines/tensor_parallel.py has the
layouts with groups).
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math
import time

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.placement.baselines.common import (
    Result,
    balanced_split,
    fastest_first,
    fits,
    follow_groups,
    whole_graph_objective,
)
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.fit import MemoryLedger, colocation_units, runs_all, solve_in_flight, topo_order
from llm_planner.placement.problem import PlacementProblem, restrict_devices
from llm_planner.placement.schedule import make_plan

log = logging.getLogger(__name__)

BASELINE_NAMES = ("single-device", "even-split", "memory-greedy", "heft", "data-parallel")


def run_baseline(name: str, problem: PlacementProblem) -> Plan | None:
    """The plan of baseline `name`, or None when it finds no placement that fits."""
    runners = {
        "single-device": _single_device,
        "even-split": _even_split,
        "memory-greedy": _memory_greedy,
        "heft": _heft,
        "data-parallel": _data_parallel,
    }
    if name not in runners:
        raise ValueError(f"unknown baseline {name!r}; choose one of {', '.join(BASELINE_NAMES)}")
    started = time.perf_counter()
    if problem.has_groups:  # these layouts place tasks on single devices
        problem = restrict_devices(problem, list(range(problem.num_physical)))

    def once(posed: PlacementProblem) -> Plan | None:
        result = runners[name](posed)
        if result is None:
            return None
        sizes, assigns, orders = result
        return make_plan(
            posed,
            sizes,
            assigns,
            solver=f"baseline:{name}",
            status="heuristic",
            started_at=started,
            lower_bound_s=0.0,
            device_orders=orders,
        )

    plan = solve_in_flight(problem, once)  # throughput: a steady state that fits (problem.fit)
    if plan is None:
        log.info("baseline %s: no feasible placement", name)
    return plan


def _single_device(problem: PlacementProblem) -> Result | None:
    q, n = problem.batch_size, problem.num_tasks
    able = [k for k in range(problem.num_devices) if problem.supported[:, k].all() and fits(problem, [q], [[k] * n])]
    if not able:
        return None
    best = min(able, key=lambda k: (whole_graph_objective(problem, [q], [k]), k))
    return [q], [[best] * n], None


def _even_split(problem: PlacementProblem) -> Result | None:
    q = problem.batch_size
    accel = [k for k in range(problem.num_devices) if not problem.is_cpu[k]]
    stages = fastest_first(problem, accel or list(range(problem.num_devices)))
    ranked = fastest_first(problem, list(range(problem.num_devices)))
    topo = topo_order(problem)
    chunks = np.array_split(np.array(topo), min(len(stages), len(topo)))
    assign = [0] * problem.num_tasks
    for k, chunk in zip(stages, chunks):
        for i in chunk:
            assign[int(i)] = k if problem.supported[i, k] else next(d for d in ranked if problem.supported[i, d])
    grouped = follow_groups(problem, assign)
    if grouped is None or not fits(problem, [q], [grouped]):
        return None
    return [q], [grouped], None


def _memory_greedy(problem: PlacementProblem) -> Result | None:
    q = problem.batch_size
    order = [k for k in range(problem.num_devices) if not problem.is_cpu[k]]
    order += [k for k in range(problem.num_devices) if problem.is_cpu[k]]
    units, ledger = colocation_units(problem), MemoryLedger(problem, q)
    assign = [-1] * problem.num_tasks
    current = 0
    for i in topo_order(problem):
        if assign[i] >= 0:
            continue  # placed with its colocation group
        members = units[i]
        pos = next(
            (
                j
                for j in range(current, len(order))
                if runs_all(problem, members, order[j]) and ledger.room(members, order[j])
            ),
            None,
        )
        if pos is None:
            return None
        if runs_all(problem, members, order[current]):
            current = pos  # the current device is full: move on, never back
        ledger.add(members, order[pos])
        for m in members:
            assign[m] = order[pos]
    return [q], [assign], None


def _upward_ranks(problem: PlacementProblem, batch: int) -> np.ndarray:
    """HEFT's rank_u: mean task time plus the longest chain of mean transfer + rank below."""
    t = task_times(problem, batch)
    mean_time = np.array([t[i, problem.supported[i]].mean() for i in range(problem.num_tasks)])
    k = problem.num_devices
    if k > 1 and problem.num_edges:
        off = ~np.eye(k, dtype=bool)
        mean_comm = (problem.comm_fixed[:, off] + problem.comm_slope[:, off] * batch).mean(axis=1)
    else:
        mean_comm = np.zeros(problem.num_edges)
    rank = np.zeros(problem.num_tasks)
    out_edges = problem.out_edges()
    for i in reversed(topo_order(problem)):
        tail = max((mean_comm[e] + rank[int(problem.edge_dst[e])] for e in out_edges[i]), default=0.0)
        rank[i] = mean_time[i] + tail
    return rank


class _Slots:
    """One device's busy slots (start, end, task), sorted by start, for HEFT's insertion policy.

    Slots never overlap, so their ends are sorted too. Starts and ends are also kept in
    arrays (with room to grow), so that a long list of slots is searched in numpy.
    """

    VECTOR_FROM = 64  # search this many slots or more with numpy

    def __init__(self) -> None:
        self.busy: list[tuple[float, float, int]] = []
        self.starts, self.ends = np.zeros(16), np.zeros(16)

    def earliest(self, ready: float, duration: float) -> tuple[float, int]:
        """The earliest start >= ready in a gap that fits the task, and the slot position there."""
        busy = self.busy
        first = bisect.bisect_right(busy, ready, key=lambda slot: slot[0])  # gaps before `first` end by `ready`
        prev_end = busy[first - 1][1] if first else 0.0
        n = len(busy)
        if n - first >= self.VECTOR_FROM:
            starts = self.starts[first:n]
            begin = np.maximum(ready, np.concatenate(([prev_end], self.ends[first : n - 1])))
            fits = (begin + duration <= starts) & (begin < starts)
            if fits.any():
                pos = int(np.argmax(fits))
                return float(begin[pos]), first + pos
            return max(ready, busy[-1][1]), len(busy)
        for pos in range(first, len(busy)):
            start, end, _ = busy[pos]
            begin = max(ready, prev_end)
            if (
                begin + duration <= start and begin < start
            ):  # strict: a zero-length task never jumps a task at its start time
                return begin, pos
            prev_end = max(prev_end, end)
        return max(ready, prev_end), len(busy)

    def insert(self, pos: int, start: float, end: float, task: int) -> None:
        n = len(self.busy)
        self.busy.insert(pos, (start, end, task))
        if n == len(self.starts):
            self.starts, self.ends = np.concatenate((self.starts, self.starts)), np.concatenate((self.ends, self.ends))
        for arr, value in ((self.starts, start), (self.ends, end)):
            arr[pos + 1 : n + 1] = arr[pos:n]  # numpy copies overlapping slices correctly
            arr[pos] = value


def _heft(problem: PlacementProblem) -> Result | None:
    q, n = problem.batch_size, problem.num_tasks
    rank, units, ledger = _upward_ranks(problem, q), colocation_units(problem), MemoryLedger(problem, q)
    topo_pos = {i: pos for pos, i in enumerate(topo_order(problem))}
    in_edges, out_edges = problem.in_edges(), problem.out_edges()
    waiting = [len(in_edges[i]) for i in range(n)]
    ready_heap = [(-rank[i], topo_pos[i], i) for i in range(n) if waiting[i] == 0]  # highest rank first
    heapq.heapify(ready_heap)
    assign, finish = [-1] * n, [0.0] * n
    slots = [_Slots() for _ in range(problem.num_devices)]
    times = task_times(problem, q).tolist()  # t(i, k, q), as problem.task_time computes it
    while ready_heap:
        i = heapq.heappop(ready_heap)[2]
        if assign[i] >= 0:
            candidates = [assign[i]]  # a later member of a placed colocation group
        else:
            candidates = [
                k for k in range(problem.num_devices) if runs_all(problem, units[i], k) and ledger.room(units[i], k)
            ]
        best: tuple[float, int, float, int] | None = None  # (finish, device, start, position)
        for k in candidates:
            ready = max(
                (
                    finish[int(problem.edge_src[e])] + problem.transfer_time(e, assign[int(problem.edge_src[e])], k, q)
                    for e in in_edges[i]
                ),
                default=0.0,
            )
            start, pos = slots[k].earliest(ready, times[i][k])
            end = start + times[i][k]
            if best is None or end < best[0]:
                best = (end, k, start, pos)
        if best is None:
            return None
        end, k, start, pos = best
        if assign[i] < 0:
            ledger.add(units[i], k)
            for m in units[i]:
                assign[m] = k
        finish[i] = end
        slots[k].insert(pos, start, end, i)
        for e in out_edges[i]:
            v = int(problem.edge_dst[e])
            waiting[v] -= 1
            if waiting[v] == 0:
                heapq.heappush(ready_heap, (-rank[v], topo_pos[v], v))
    orders = {k: [(0, i) for _, _, i in dev.busy] for k, dev in enumerate(slots) if dev.busy}
    return [q], [assign], orders


def _data_parallel(problem: PlacementProblem) -> Result | None:
    q, n = problem.batch_size, problem.num_tasks
    able = [k for k in range(problem.num_devices) if problem.supported[:, k].all() and fits(problem, [1], [[k] * n])]
    ranked = fastest_first(problem, able)
    best, best_result = math.inf, None
    for m in range(1, min(problem.max_shards, q, len(ranked)) + 1):
        devices = ranked[:m]
        sizes = balanced_split(problem, devices)
        if sizes is None:
            continue
        objective = whole_graph_objective(problem, sizes, devices)
        if objective < best:
            best, best_result = objective, (sizes, [[k] * n for k in devices], None)
    return best_result
