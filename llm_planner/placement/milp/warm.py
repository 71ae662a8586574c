"""Warm starts for the exact MILP, beyond the baselines of solve.baselines.

`contiguous_split` (throughput only) cuts one topological order of the tasks into
intervals, at most one per device: a greedy with a bisected target load, then
the exact dynamic program over that order. The result is a good incumbent for
max-load problems whose optimum is close to a pipeline, and a contiguous one, so
it also starts the --contiguous model. On the dnn-partitioning inputs
LayerGraphs/bert24_inference and resnet50_inference it finds 17.7899 and
33.7747, the optima of that paper's dynamic program over all contiguous splits,
in under a second; the best baselines give 21.56 and 68.21.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.schedule import device_loads, make_plan


def contiguous_split(problem: PlacementProblem) -> Plan | None:
    """Throughput warm start: a topological order cut into intervals, at most one per device.

    First a greedy (devices fastest first, each taking the longest interval from
    where the previous one ended whose load stays <= L and that fits its memory,
    L bisected), then, where the state space is small, the exact dynamic program
    over the same order: F[c][j] = min over i < j and device class d with a free
    device of max(F[c - d][i], load_d(order[i:j])), c counting the devices used
    per class (devices of one kind are interchangeable here). Intervals of a
    topological order are contiguous task sets, so the plan suits --contiguous.
    None when nothing fits.
    """
    if problem.objective != "throughput" or problem.num_tasks == 0:
        return None
    started = time.perf_counter()
    p, Q = problem, problem.batch_size
    times = task_times(p, Q)
    order = [p.graph.index(n) for n in p.graph.topological_order()]
    adjacency = _adjacency(p)
    candidates = [a for a in (_greedy(p, times, order, adjacency),) if a is not None]
    bound = min((_max_load(p, a) for a in candidates), default=math.inf)
    dp = _interval_dp(p, times, order, adjacency, bound)
    if dp is not None:
        candidates.append(dp)
    if not candidates:
        return None
    best = min(candidates, key=lambda a: _max_load(p, a))
    return make_plan(
        p, [Q], [best], solver="milp:contiguous-split", status="heuristic", started_at=started, lower_bound_s=0.0
    )


def _max_load(p: PlacementProblem, assign: list[int]) -> float:
    return float(device_loads(p, [p.batch_size], [assign]).max())


def _greedy(p: PlacementProblem, times: np.ndarray, order: list[int], adjacency) -> list[int] | None:
    """The greedy of contiguous_split: the best assignment over a bisection of the target load."""
    speed = np.where(np.isfinite(times), times, 0.0).sum(axis=0) + np.isinf(times).sum(axis=0) * 1e30
    devices = sorted(range(p.num_devices), key=lambda k: (speed[k], k))
    finite = np.where(np.isfinite(times), times, 0.0)
    hi = float(
        finite.max(axis=1).sum() + (p.comm_fixed + p.comm_slope * p.batch_size).max(initial=0.0) * 2 * p.num_edges
    )
    lo, best = 0.0, None
    for _ in range(40):
        target = (lo + hi) / 2 if best is not None else hi
        assign = _fill(p, times, order, devices, target, adjacency)
        if assign is None:
            if best is None:
                return None
            lo = target
            continue
        load = _max_load(p, assign)
        if best is None or load < best[0]:
            best = (load, assign)
        hi = min(target, load)
        if hi - lo <= 1e-4 * hi:
            break
    return best[1]


MAX_DP_CELLS = 5e7  # states x intervals the dynamic program may visit


def _interval_dp(p: PlacementProblem, times: np.ndarray, order: list[int], adjacency, bound: float) -> list[int] | None:
    """The exact best split of `order` into intervals, one per device at most (see contiguous_split).

    Intervals whose busy time exceeds `bound` (a load already reached) are skipped.
    Colocation groups are not modelled here: with any, the result is dropped."""
    if p.colocate_groups():
        return None
    n = len(order)
    kinds: dict[str, list[int]] = {}
    for k, d in enumerate(p.devices):
        kinds.setdefault(d.kind, []).append(k)
    classes = list(kinds.values())
    states = list(itertools.product(*[range(len(c) + 1) for c in classes]))
    if len(states) * len(classes) * (n + 1) ** 2 > MAX_DP_CELLS:
        return None
    loads = [_interval_loads(p, times, order, adjacency, c[0], bound) for c in classes]
    best = {s: np.full(n + 1, math.inf) for s in states}
    choice: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    best[states[0]][0] = 0.0
    for s in sorted(states, key=sum)[1:]:
        how = np.full(n + 1, -1)
        start = np.zeros(n + 1, dtype=int)
        for d in range(len(classes)):
            if s[d] == 0:
                continue
            prev = s[:d] + (s[d] - 1,) + s[d + 1 :]
            cand = np.maximum(best[prev][:, None], loads[d])  # [i, j]
            i = cand.argmin(axis=0)
            value = cand[i, np.arange(n + 1)]
            better = value < best[s]
            best[s] = np.where(better, value, best[s])
            how, start = np.where(better, d, how), np.where(better, i, start)
        choice[s] = (how, start)
    final = min(states, key=lambda s: best[s][n])
    if not math.isfinite(best[final][n]):
        return None
    return _unwind(order, classes, choice, final, n)


def _unwind(order: list[int], classes: list[list[int]], choice: dict, state: tuple, end: int) -> list[int]:
    assign = [-1] * len(order)
    while end > 0:
        how, start = choice[state]
        d, i = int(how[end]), int(start[end])
        device = classes[d][state[d] - 1]  # the class's devices in spec order
        for task in order[i:end]:
            assign[task] = device
        state, end = state[:d] + (state[d] - 1,) + state[d + 1 :], i
    return assign


def _interval_loads(
    p: PlacementProblem, times: np.ndarray, order: list[int], adjacency, k: int, bound: float
) -> np.ndarray:
    """loads[i, j]: load of device k holding order[i:j] (inf if it does not fit or exceeds `bound`)."""
    n = len(order)
    loads = np.full((n + 1, n + 1), math.inf)
    np.fill_diagonal(loads, 0.0)
    for i in range(n):
        interval = _Interval(p, times, k, adjacency)
        for j in range(i, n):
            if not p.supported[order[j], k]:
                break
            interval.add(order[j])
            if interval.busy > bound or interval.memory > p.mem_capacity[k]:
                break
            loads[i, j + 1] = interval.busy + interval.transfers
    return loads


def _fill(
    p: PlacementProblem, times: np.ndarray, order: list[int], devices: list[int], target: float, adjacency
) -> list[int] | None:
    """Greedy intervals for one target load; None if the tasks do not all fit.

    A colocation group joins the interval that reaches its first member, whole.
    """
    unit = {i: [i] for i in range(p.num_tasks)}
    for group in p.colocate_groups():
        unit.update({i: group for i in group})
    assign = [-1] * p.num_tasks
    pos = 0
    for k in devices:
        while pos < len(order) and assign[order[pos]] >= 0:
            pos += 1
        if pos == len(order):
            break
        interval, best_end = _Interval(p, times, k, adjacency), pos
        for end in range(pos, len(order)):
            members = [i for i in unit[order[end]] if assign[i] < 0 and not interval.inside[i]]
            if not p.supported[members, k].all():
                break
            for i in members:
                interval.add(i)
            if interval.busy > target or interval.memory > p.mem_capacity[k]:  # loads only add transfers to busy time
                break
            if interval.busy + interval.transfers <= target:
                best_end = end + 1
        for end in range(pos, best_end):
            for i in unit[order[end]]:
                assign[i] = k if assign[i] < 0 else assign[i]
        pos = best_end
    return assign if all(a >= 0 for a in assign) else None


class _Interval:
    """The load and memory of device k holding a growing task set, updated per added task.

    Transfers to devices not yet known are charged at k's worst link (direct
    model); the host-staged model charges each task's output once per side.
    """

    def __init__(self, p: PlacementProblem, times: np.ndarray, k: int, adjacency: tuple[list, list]):
        self.p, self.times, self.k = p, times, k
        self.inside = np.zeros(p.num_tasks, dtype=bool)
        self.busy = self.transfers = self.memory = 0.0
        self.each = p.task_memory_bytes(p.batch_size)
        self.staged = p.throughput_model == "host_staged"
        self.hop = p.hop_s_per_sample * (0.0 if self.staged and p.is_cpu[k] else p.batch_size)
        comm = p.comm_fixed + p.comm_slope * p.batch_size
        self.worst_out = comm[:, k, :].max(axis=1) if p.num_edges else np.zeros(0)  # edge leaving k
        self.worst_in = comm[:, :, k].max(axis=1) if p.num_edges else np.zeros(0)
        self.outs, self.ins = adjacency
        self.succ_outside = np.array([len(o) for o in self.outs])
        self.succ_inside = np.zeros(p.num_tasks, dtype=int)

    def add(self, i: int) -> None:
        p, k = self.p, self.k
        self.busy += float(self.times[i, k])
        if p.mem_counts[i, k]:
            self.memory += float(self.each[i])
        hop = self.hop
        if self.staged:  # i's own output: was charged as entering, now as leaving
            self.transfers += hop[i] * (int(self.succ_outside[i] > 0) - int(self.succ_inside[i] > 0))
        for e, v in self.outs[i]:
            if not self.staged:
                self.transfers += -float(self.worst_in[e]) if self.inside[v] else float(self.worst_out[e])
        for e, u in self.ins[i]:
            self.succ_outside[u] -= 1
            self.succ_inside[u] += 1
            if not self.staged:
                self.transfers += -float(self.worst_out[e]) if self.inside[u] else float(self.worst_in[e])
            elif self.inside[u] and self.succ_outside[u] == 0:
                self.transfers -= hop[u]
            elif not self.inside[u] and self.succ_inside[u] == 1:
                self.transfers += hop[u]
        self.inside[i] = True


def _adjacency(p: PlacementProblem) -> tuple[list[list[tuple[int, int]]], list[list[tuple[int, int]]]]:
    outs: list[list[tuple[int, int]]] = [[] for _ in range(p.num_tasks)]
    ins: list[list[tuple[int, int]]] = [[] for _ in range(p.num_tasks)]
    for e, (u, v) in enumerate(zip(p.edge_src.tolist(), p.edge_dst.tolist())):
        outs[u].append((e, v))
        ins[v].append((e, u))
    return outs, ins
