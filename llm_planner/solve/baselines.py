"""Baseline planners: what a user would do instead of solving the MILP.

Each baseline decides an assignment (and for "heft" the device orders); the
shared scheduler (solve.schedule.make_plan) times it and computes the
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
tensor-parallel groups they run on its physical devices; solve/baselines_tp.py has the
layouts with groups).
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math
import time

import numpy as np

from llm_planner.plan import Plan
from llm_planner.solve.bounds import task_times as _times
from llm_planner.solve.problem import PlacementProblem, restrict_devices
from llm_planner.solve.schedule import make_plan

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
    result = runners[name](problem)
    if result is None:
        log.info("baseline %s: no feasible placement", name)
        return None
    sizes, assigns, orders = result
    return make_plan(
        problem, sizes, assigns, solver=f"baseline:{name}", status="heuristic", started_at=started,
        lower_bound_s=0.0, device_orders=orders,
    )


def run_all_baselines(problem: PlacementProblem) -> dict[str, Plan | None]:
    return {name: run_baseline(name, problem) for name in BASELINE_NAMES}


def best_baseline(problem: PlacementProblem) -> Plan | None:
    """The feasible baseline plan with the lowest objective (None if none is feasible)."""
    plans = [p for p in run_all_baselines(problem).values() if p is not None]
    return min(plans, key=lambda p: p.objective_s, default=None)


# -- shared pieces --------------------------------------------------------------

Result = tuple[list[int], list[list[int]], "dict[int, list[tuple[int, int]]] | None"]


def _fastest_first(problem: PlacementProblem, devices: list[int]) -> list[int]:
    """Devices by (tasks they cannot run, time of the tasks they can for the batch, spec order)."""
    t = _times(problem, problem.batch_size)
    key = {k: (int((~problem.supported[:, k]).sum()), float(t[problem.supported[:, k], k].sum()), k) for k in devices}
    return sorted(devices, key=key.__getitem__)


def _topo(problem: PlacementProblem) -> list[int]:
    return [problem.graph.index(n) for n in problem.graph.topological_order()]


def _units(problem: PlacementProblem) -> dict[int, list[int]]:
    """Task -> the members of its colocation group (itself alone if none)."""
    unit = {i: [i] for i in range(problem.num_tasks)}
    for group in problem.colocate_groups():
        for i in group:
            unit[i] = group
    return unit


def _runs_all(problem: PlacementProblem, members: list[int], k: int) -> bool:
    return bool(problem.supported[members, k].all())


def _fits(problem: PlacementProblem, sizes: list[int], assigns: list[list[int]]) -> bool:
    return bool(np.all(problem.device_memory_used(sizes, assigns) <= problem.mem_capacity))


class _Ledger:
    """Memory in use per device while a greedy places tasks for one shard of `batch` samples."""

    def __init__(self, problem: PlacementProblem, batch: int):
        self.p, self.batch = problem, batch
        self.used = np.zeros(problem.num_devices)

    def need(self, members: list[int], k: int) -> float:
        p = self.p
        return float(sum(p.weight_bytes[i] + p.mem_bytes_per_sample[i] * self.batch for i in members if p.mem_counts[i, k]))

    def room(self, members: list[int], k: int) -> bool:
        return self.used[k] + self.need(members, k) <= self.p.mem_capacity[k]

    def add(self, members: list[int], k: int) -> None:
        self.used[k] += self.need(members, k)


def _follow_groups(problem: PlacementProblem, assign: list[int]) -> list[int] | None:
    """Put each colocation group on its first member's device (topological order), or the
    fastest device that runs the whole group; None if no device runs it."""
    order = {i: pos for pos, i in enumerate(_topo(problem))}
    ranked = _fastest_first(problem, list(range(problem.num_devices)))
    out = list(assign)
    for group in problem.colocate_groups():
        first = min(group, key=order.__getitem__)
        k = next((d for d in [assign[first], *ranked] if _runs_all(problem, group, d)), None)
        if k is None:
            return None
        for i in group:
            out[i] = k
    return out


# -- the baselines ----------------------------------------------------------------


def _whole_graph_objective(problem: PlacementProblem, sizes: list[int], devices: list[int]) -> float:
    """Objective when shard j runs whole on devices[j] (all different): no transfers, and each
    device runs its tasks back to back, so makespan = max load = max_j sum_i t(i, devices[j], b_j)."""
    busiest = max(float(_times(problem, b)[:, k].sum()) for b, k in zip(sizes, devices))
    return busiest / problem.batch_size if problem.objective == "throughput" else busiest


def _single_device(problem: PlacementProblem) -> Result | None:
    q, n = problem.batch_size, problem.num_tasks
    able = [k for k in range(problem.num_devices) if problem.supported[:, k].all() and _fits(problem, [q], [[k] * n])]
    if not able:
        return None
    best = min(able, key=lambda k: (_whole_graph_objective(problem, [q], [k]), k))
    return [q], [[best] * n], None


def _even_split(problem: PlacementProblem) -> Result | None:
    q = problem.batch_size
    accel = [k for k in range(problem.num_devices) if not problem.is_cpu[k]]
    stages = _fastest_first(problem, accel or list(range(problem.num_devices)))
    ranked = _fastest_first(problem, list(range(problem.num_devices)))
    topo = _topo(problem)
    chunks = np.array_split(np.array(topo), min(len(stages), len(topo)))
    assign = [0] * problem.num_tasks
    for k, chunk in zip(stages, chunks):
        for i in chunk:
            assign[int(i)] = k if problem.supported[i, k] else next(d for d in ranked if problem.supported[i, d])
    grouped = _follow_groups(problem, assign)
    if grouped is None or not _fits(problem, [q], [grouped]):
        return None
    return [q], [grouped], None


def _memory_greedy(problem: PlacementProblem) -> Result | None:
    q = problem.batch_size
    order = [k for k in range(problem.num_devices) if not problem.is_cpu[k]]
    order += [k for k in range(problem.num_devices) if problem.is_cpu[k]]
    units, ledger = _units(problem), _Ledger(problem, q)
    assign = [-1] * problem.num_tasks
    current = 0
    for i in _topo(problem):
        if assign[i] >= 0:
            continue  # placed with its colocation group
        members = units[i]
        pos = next((j for j in range(current, len(order)) if _runs_all(problem, members, order[j]) and ledger.room(members, order[j])), None)
        if pos is None:
            return None
        if _runs_all(problem, members, order[current]):
            current = pos  # the current device is full: move on, never back
        ledger.add(members, order[pos])
        for m in members:
            assign[m] = order[pos]
    return [q], [assign], None


def _upward_ranks(problem: PlacementProblem, batch: int) -> np.ndarray:
    """HEFT's rank_u: mean task time plus the longest chain of mean transfer + rank below."""
    t = _times(problem, batch)
    mean_time = np.array([t[i, problem.supported[i]].mean() for i in range(problem.num_tasks)])
    k = problem.num_devices
    if k > 1 and problem.num_edges:
        off = ~np.eye(k, dtype=bool)
        mean_comm = (problem.comm_fixed[:, off] + problem.comm_slope[:, off] * batch).mean(axis=1)
    else:
        mean_comm = np.zeros(problem.num_edges)
    rank = np.zeros(problem.num_tasks)
    out_edges = problem.out_edges()
    for i in reversed(_topo(problem)):
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
            if begin + duration <= start and begin < start:  # strict: a zero-length task never jumps a task at its start time
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
    rank, units, ledger = _upward_ranks(problem, q), _units(problem), _Ledger(problem, q)
    topo_pos = {i: pos for pos, i in enumerate(_topo(problem))}
    in_edges, out_edges = problem.in_edges(), problem.out_edges()
    waiting = [len(in_edges[i]) for i in range(n)]
    ready_heap = [(-rank[i], topo_pos[i], i) for i in range(n) if waiting[i] == 0]  # highest rank first
    heapq.heapify(ready_heap)
    assign, finish = [-1] * n, [0.0] * n
    slots = [_Slots() for _ in range(problem.num_devices)]
    times = _times(problem, q).tolist()  # t(i, k, q), as problem.task_time computes it
    while ready_heap:
        i = heapq.heappop(ready_heap)[2]
        if assign[i] >= 0:
            candidates = [assign[i]]  # a later member of a placed colocation group
        else:
            candidates = [k for k in range(problem.num_devices) if _runs_all(problem, units[i], k) and ledger.room(units[i], k)]
        best: tuple[float, int, float, int] | None = None  # (finish, device, start, position)
        for k in candidates:
            ready = max((finish[int(problem.edge_src[e])] + problem.transfer_time(e, assign[int(problem.edge_src[e])], k, q) for e in in_edges[i]), default=0.0)
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


def _balanced_split(problem: PlacementProblem, devices: list[int]) -> list[int] | None:
    """Shard sizes >= 1 summing to Q, one per device, each shard whole on its device, with the
    least makespan max_k T_k(b_k), T_k(b) = the whole graph's time on k for b samples (non-
    decreasing in b), among sizes that fit in memory; None if none fit. Exact: the least T
    whose capacities cap_k(T) = max{b : T_k(b) <= T, b fits on k} add up to Q is the optimum,
    and T is one of the T_k(b)."""
    q, n = problem.batch_size, problem.num_tasks
    if len(devices) > q:
        return None
    span = {b: _times(problem, b).sum(axis=0) for b in range(1, q - len(devices) + 2)}
    fits = {(k, b): _fits(problem, [b], [[k] * n]) for k in devices for b in span}
    for limit in sorted({float(span[b][k]) for k in devices for b in span}):
        caps = [max((b for b in span if span[b][k] <= limit and fits[(k, b)]), default=0) for k in devices]
        if min(caps) >= 1 and sum(caps) >= q:
            sizes = list(caps)
            while sum(sizes) > q:  # trim the device whose shard takes longest (ties: the later one)
                j = max((j for j in range(len(sizes)) if sizes[j] > 1), key=lambda j: (span[sizes[j]][devices[j]], j))
                sizes[j] -= 1
            if _fits(problem, sizes, [[k] * n for k in devices]):
                return sizes
    return None


def _data_parallel(problem: PlacementProblem) -> Result | None:
    q, n = problem.batch_size, problem.num_tasks
    able = [k for k in range(problem.num_devices) if problem.supported[:, k].all() and _fits(problem, [1], [[k] * n])]
    ranked = _fastest_first(problem, able)
    best, best_result = math.inf, None
    for m in range(1, min(problem.max_shards, q, len(ranked)) + 1):
        devices = ranked[:m]
        sizes = _balanced_split(problem, devices)
        if sizes is None:
            continue
        objective = _whole_graph_objective(problem, sizes, devices)
        if objective < best:
            best, best_result = objective, (sizes, [[k] * n for k in devices], None)
    return best_result


# -- why nothing fits ---------------------------------------------------------------


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB"


def _unit_shortfalls(problem: PlacementProblem) -> list[tuple[float, str]]:
    """(shortfall bytes, sentence) for every task or colocation group too big for every device that runs it."""
    batch = math.ceil(problem.batch_size / problem.max_shards)  # some shard is at least this big
    ledger, units = _Ledger(problem, batch), _units(problem)
    seen: set[int] = set()
    out = []
    for i in _topo(problem):
        members = units[i]
        if i in seen:
            continue
        seen.update(members)
        what = f"task {problem.graph.tasks[i].name!r}" if len(members) == 1 else f"colocation group {problem.graph.tasks[i].colocate_group!r}"
        able = [k for k in range(problem.num_devices) if _runs_all(problem, members, k)]
        if not able:
            out.append((math.inf, f"no device can run every task of {what}"))
            continue
        k = min(able, key=lambda d: ledger.need(members, d) - problem.mem_capacity[d])
        short = ledger.need(members, k) - problem.mem_capacity[k]
        if short > 0:
            out.append((short, f"{what} needs {_gb(ledger.need(members, k))} for a shard of {batch} samples but the best device "
                               f"that can run it, {problem.device_names[k]!r}, holds {_gb(problem.mem_capacity[k])} (short by {_gb(short)})"))
    return out


def memory_shortfall(problem: PlacementProblem) -> str | None:
    """A sentence when no placement can fit in memory, provably (a task or colocation group
    fits no device that runs it, or the tasks need more than all devices hold); else None."""
    units = _unit_shortfalls(problem)
    if units:
        units.sort(key=lambda u: -u[0])
        more = f" ({len(units) - 1} more task(s) do not fit either)" if len(units) > 1 else ""
        return units[0][1] + more
    need = _total_need(problem)
    capacity = float(problem.mem_capacity.sum())
    if need > capacity:
        return f"the tasks need at least {_gb(need)} of device memory in all but the devices hold {_gb(capacity)} (short by {_gb(need - capacity)})"
    return None


def _total_need(problem: PlacementProblem) -> float:
    need = 0.0
    for i in range(problem.num_tasks):
        able = problem.supported[i]
        if (problem.mem_counts[i] | ~able).all():  # memory counts wherever it can run
            need += problem.weight_bytes[i] + problem.mem_bytes_per_sample[i] * problem.batch_size
    return need


def infeasibility_reason(problem: PlacementProblem) -> str:
    """A sentence on why no placement fits in memory (or why the heuristics found none)."""
    provable = memory_shortfall(problem)
    if provable is not None:
        return provable
    need, capacity = _total_need(problem), float(problem.mem_capacity.sum())
    whole = [k for k in range(problem.num_devices) if problem.supported[:, k].all()]
    single = ""
    if whole:
        ledger = _Ledger(problem, problem.batch_size)
        all_tasks = list(range(problem.num_tasks))
        k = min(whole, key=lambda d: ledger.need(all_tasks, d) - problem.mem_capacity[d])
        short = ledger.need(all_tasks, k) - problem.mem_capacity[k]
        if short > 0:
            single = f"; on one device the model needs {_gb(ledger.need(all_tasks, k))} but the roomiest, {problem.device_names[k]!r}, holds {_gb(problem.mem_capacity[k])} (short by {_gb(short)})"
    else:
        single = "; no single device can run every task"
    total = _gb(capacity) if math.isfinite(capacity) else "unlimited"
    return (
        f"every task fits on some device that can run it and the total need ({_gb(need)}) is within the total capacity "
        f"({total}), but the greedy heuristics found no placement that fits{single}; the MILP solver may still find one"
    )
