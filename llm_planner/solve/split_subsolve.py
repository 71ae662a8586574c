"""Solving MILP-SPLIT's module subproblems: closed form, exact MILP or list scheduler,
deduplicated by structure and device symmetry, serially or in a process pool.

A subproblem is named by a `SubKey`: the module's structural signature, the
(input device, output device) pair in canonical form, the mask of usable
devices and the batch. Modules with equal signatures and device pairs related
by a symmetry of the cluster (devices of one kind in one server, or servers of
one template, are interchangeable) share one solve; the solution is carried
over by the device permutation that maps one pair onto the other.
"""

from __future__ import annotations

import heapq
import logging
import os
import random
import sys
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from llm_planner.solve.modules import Module
from llm_planner.solve.options import SolveOptions
from llm_planner.solve.problem import PlacementProblem
from llm_planner.solve.subproblem import build_subproblem, is_solvable

log = logging.getLogger(__name__)

INF = float("inf")


@dataclass(frozen=True)
class SubSolution:
    cost_s: float  # the module's span: input cut finished -> output cut finished (inf: infeasible)
    bound_s: float  # a lower bound on the optimal span for this device pair
    devices: tuple[int, ...]  # device of each module task, in Module.tasks order
    order: tuple[int, ...]  # positions in Module.tasks in execution order
    method: str  # "closed-form", "milp", "milp-optimal", "heft"


INFEASIBLE = SubSolution(cost_s=INF, bound_s=INF, devices=(), order=(), method="infeasible")


def device_classes(problem: PlacementProblem) -> list[tuple[str, str]]:
    """(server template, kind) of each device: members of one class are interchangeable."""
    return [(d.node_template, d.kind) for d in problem.devices]


def pair_key(problem: PlacementProblem, classes: list[tuple[str, str]], k: int | None, l: int) -> tuple:
    """Canonical form of a device pair under the cluster's symmetries."""
    dev = problem.devices
    if k is None:
        return (None, classes[l])
    relation = 0 if k == l else (1 if dev[k].node == dev[l].node else 2)
    return (classes[k], classes[l], relation)


def device_permutation(problem: PlacementProblem, src: tuple[int | None, int], dst: tuple[int | None, int]) -> np.ndarray:
    """perm[d] = image of device d under a symmetry mapping src pair onto dst pair."""
    devs = problem.devices
    node_map = {d.node: d.node for d in devs}

    def swap_nodes(a: str, b: str) -> None:
        inv = {v: n for n, v in node_map.items()}
        na, nb = inv[a], inv[b]
        node_map[na], node_map[nb] = b, a

    slot = {(d.node, d.kind, d.index): i for i, d in enumerate(devs)}
    index_map: dict[tuple[str, str], dict[int, int]] = {}

    def image(i: int) -> tuple[str, str, int]:
        d = devs[i]
        node = node_map[d.node]
        idx = index_map.get((node, d.kind), {}).get(d.index, d.index)
        return node, d.kind, idx

    for a, b in zip(src, dst):
        if a is None:
            continue
        cur_node = image(a)[0]
        if cur_node != devs[b].node:
            swap_nodes(cur_node, devs[b].node)
        node, kind, idx = image(a)
        if idx != devs[b].index:
            m = index_map.setdefault((node, kind), {})
            inv = {v: j for j, v in m.items()}
            ja, jb = inv.get(idx, idx), inv.get(devs[b].index, devs[b].index)
            m[ja], m[jb] = devs[b].index, idx
    perm = np.array([slot[image(i)] for i in range(len(devs))], dtype=int)
    assert all(perm[a] == b for a, b in zip(src, dst) if a is not None), "symmetry mapping failed"
    return perm


def solve_subproblem(problem: PlacementProblem, module: Module, k: int | None, l: int, allowed: np.ndarray, batch: int,
                     options: SolveOptions, *, with_bound: bool = True) -> SubSolution:
    """One module for one (input device, output device) pair.

    Up to options.max_module_tasks tasks: the exact MILP (warm-started by the best
    baseline, options.time_limit_s). Larger modules: HEFT. A plan not proven optimal
    (HEFT, or the MILP stopped by its time limit) is then improved by moving tasks
    (`improve_by_moves`), for modules of at most LOCAL_SEARCH_MAX_TASKS tasks.

    The bound of a HEFT module is solve.bounds.lower_bound of the subproblem, its input
    pinned to k: the path LP's pinned windows (solve/bounds_path.py) then know that a
    device other than k waits for a transfer before it can start; `with_bound=False`
    skips it (bound 0) where the caller reads no bound.
    """
    sub, _ = build_subproblem(problem, module.tasks, module.input_task, k, l, allowed, batch)
    if not is_solvable(sub):
        return INFEASIBLE
    offset = 1 if module.input_task is not None else 0
    if len(module.tasks) == 1:
        return _closed_form(sub, offset, l, batch)
    from llm_planner.solve.errors import SolveError
    from llm_planner.solve.baselines import run_baseline
    from llm_planner.solve.bounds import lower_bound

    if len(module.tasks) <= options.max_module_tasks:
        from llm_planner.solve.milp import solve_milp

        try:
            plan = solve_milp(sub, replace(options, verify=False, threads=1))
        except SolveError:
            return INFEASIBLE
        method = "milp-optimal" if plan.solver.status == "optimal" else "milp"
    else:
        plan = run_baseline("heft", sub)
        if plan is None:
            return INFEASIBLE
        method = "heft"
    dev = {n: k2 for k2, n in enumerate(sub.device_names)}
    assign = [dev[plan.assignment[t.name]] for t in sub.graph.tasks]
    names = {t.name: n for n, t in enumerate(sub.graph.tasks)}
    order = [names[st.task] for st in sorted(plan.schedule, key=lambda st: (st.start_s, st.finish_s))]
    cost, bound = plan.objective_s, plan.lower_bound_s
    if method == "heft":
        bound = lower_bound(sub) if with_bound else 0.0
    if method != "milp-optimal" and sub.num_tasks <= LOCAL_SEARCH_MAX_TASKS:
        moved = improve_by_moves(sub, assign, max(2, LOCAL_SEARCH_WORK // sub.num_tasks))
        moved_cost, moved_order = _list_scheduled(sub, moved)
        if moved_cost < cost * (1 - 1e-12):
            assign, cost, order, method = moved, moved_cost, moved_order, method + "+moves"
    devices, order_t = _module_part(assign, order, offset)
    return SubSolution(cost_s=cost, bound_s=min(bound, cost), devices=devices, order=order_t, method=method)


def _module_part(assign: list[int], order: list[int], offset: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A subproblem's devices and execution order (positions) without its input task, if any (offset 1)."""
    return tuple(assign[offset:]), tuple(n - offset for n in order if n >= offset)


def module_bound(problem: PlacementProblem, module: Module, k: int | None, l: int, batch: int) -> float:
    """solve.bounds.lower_bound of module's subproblem for `batch` samples with its input cut
    on k (None: the module has no input cut) and its output cut on l."""
    from llm_planner.solve.bounds import lower_bound

    sub, _ = build_subproblem(problem, module.tasks, module.input_task, k, l, np.ones(problem.num_devices, dtype=bool), batch)
    if not is_solvable(sub):
        return INF
    return lower_bound(sub)


# Local search effort is capped in task-evaluations (evaluations x tasks), not in
# seconds, so that its result does not depend on the machine's load.
LOCAL_SEARCH_MAX_TASKS = 1000  # larger modules keep HEFT's plan
LOCAL_SEARCH_WORK = 10_000  # task-evaluations per subproblem (about 0.02 s)
INTENSIFY_WORK = 8_000_000  # (task + edge)-evaluations of the iterated local search on a module the DP picks (4-12 s)
KICK_STRENGTH = 10  # the iterated local search moves 1..KICK_STRENGTH random tasks before each descent
KICK_PATIENCE = 200  # and stops after this many kicks in a row that found nothing better


class ListMakespan:
    """Makespan of an assignment of a one-shard subproblem, list-scheduled exactly as
    schedule.asap_schedule does without device orders (same upward ranks, same choice
    rule), with every cost precomputed: the local search's evaluation function."""

    def __init__(self, sub: PlacementProblem):
        from llm_planner.solve.bounds import task_times

        b, num_k = sub.batch_size, sub.num_devices
        self.num_tasks, self.num_devices = sub.num_tasks, num_k
        self.times = task_times(sub, b).tolist()
        comm = sub.comm_fixed + sub.comm_slope * b
        comm[:, np.arange(num_k), np.arange(num_k)] = 0.0
        self.comm = comm.tolist()
        self.succ: list[list[tuple[int, int]]] = [[] for _ in range(sub.num_tasks)]
        for e, (u, v) in enumerate(zip(sub.edge_src.tolist(), sub.edge_dst.tolist())):
            self.succ[u].append((e, v))
        self.indegree = np.bincount(sub.edge_dst, minlength=sub.num_tasks).tolist()
        index = {t.name: i for i, t in enumerate(sub.graph.tasks)}
        self.reverse_topo = [index[name] for name in reversed(sub.graph.topological_order())]

    def __call__(self, a: list[int]) -> float:
        times, comm, succ = self.times, self.comm, self.succ
        rank = [0.0] * self.num_tasks
        for i in self.reverse_topo:
            tail = 0.0
            for e, v in succ[i]:
                tail = max(tail, comm[e][a[i]][a[v]] + rank[v])
            rank[i] = times[i][a[i]] + tail
        pending: list[list[tuple[float, float, int]]] = [[] for _ in range(self.num_devices)]
        avail: list[list[tuple[float, int]]] = [[] for _ in range(self.num_devices)]
        free, ready, waiting = [0.0] * self.num_devices, [0.0] * self.num_tasks, list(self.indegree)
        # what set each task's start: the producer whose data came last, or the task before it on its device
        producer, before, last_on = [-1] * self.num_tasks, [-1] * self.num_tasks, [-1] * self.num_devices
        self.last, self.producer, self.before = -1, producer, before
        for i in range(self.num_tasks):
            if waiting[i] == 0:
                heapq.heappush(pending[a[i]], (0.0, -rank[i], i))
        makespan = 0.0
        while True:
            best, where = None, -1
            for k in range(self.num_devices):
                pend, av = pending[k], avail[k]
                while pend and pend[0][0] <= free[k]:
                    heapq.heappush(av, heapq.heappop(pend)[1:])
                head = (free[k], *av[0]) if av else (pend[0] if pend else None)
                if head is not None and (best is None or head < best):
                    best, where = head, k
            if best is None:
                return makespan
            i = best[2]
            heapq.heappop(avail[where] if avail[where] else pending[where])
            if free[where] > ready[i]:
                before[i] = last_on[where]
            last_on[where] = i
            finish = free[where] = max(free[where], ready[i]) + times[i][where]
            if finish > makespan:
                makespan, self.last = finish, i
            for e, v in succ[i]:
                arrival = finish + comm[e][where][a[v]]
                if arrival > ready[v]:
                    ready[v], producer[v] = arrival, i
                waiting[v] -= 1
                if waiting[v] == 0:
                    heapq.heappush(pending[a[v]], (ready[v], -rank[v], v))


    def critical(self) -> list[int]:
        """The tasks of the last call's critical chain: from the last task to finish back to the
        start, each task's device predecessor where it waited for the device, else the producer
        whose data arrived last: the tasks whose moves are most likely to shorten the schedule."""
        chain, i = [], self.last
        while i >= 0:
            chain.append(i)
            i = self.before[i] if self.before[i] >= 0 else self.producer[i]
        return chain


class _MoveSearch:
    """Moves of one task (a whole colocation group) to another device under the
    subproblem's support and memory rules, scored by the list-scheduled makespan."""

    def __init__(self, sub: PlacementProblem, assign: list[int]):
        self.sub, self.makespan = sub, ListMakespan(sub)
        self.need = np.where(sub.mem_counts, (sub.weight_bytes + sub.mem_bytes_per_sample * sub.batch_size)[:, None], 0.0)
        member = {i: [i] for i in range(sub.num_tasks)}
        for group in sub.colocate_groups():
            for i in group:
                member[i] = group
        self.units = [member[i] for i in range(sub.num_tasks) if member[i][0] == i]
        self.unit_of = [0] * sub.num_tasks
        for n, unit in enumerate(self.units):
            for i in unit:
                self.unit_of[i] = n
        self.evaluations = 0

    def used(self, assign: list[int]) -> np.ndarray:
        used = np.zeros(self.sub.num_devices)
        np.add.at(used, assign, self.need[np.arange(self.sub.num_tasks), assign])
        return used

    def fits(self, unit: list[int], k: int, used: np.ndarray) -> bool:
        return bool(self.sub.supported[unit, k].all()) and used[k] + self.need[unit, k].sum() <= self.sub.mem_capacity[k]

    def score(self, assign: list[int]) -> float:
        self.evaluations += 1
        return self.makespan(assign)

    def _move(self, assign: list[int], unit: list[int], k: int, used: np.ndarray, value: float) -> float | None:
        """Move `unit` to device k (where it fits) in place: kept, with `used` updated, and its
        makespan returned if that is below `value`; else undone and None."""
        old = assign[unit[0]]
        for m in unit:
            assign[m] = k
        moved = self.score(assign)
        if moved < value * (1 - 1e-12):
            used[old] -= self.need[unit, old].sum()
            used[k] += self.need[unit, k].sum()
            return moved
        for m in unit:
            assign[m] = old
        return None

    def descend(self, assign: list[int], value: float, max_evaluations: int) -> float:
        """First-improvement descent in place; returns the final makespan."""
        return self._descend(assign, value, max_evaluations, lambda: self.units, restart=False)

    def descend_critical(self, assign: list[int], value: float, max_evaluations: int) -> float:
        """`descend` over the units on the critical chain (ListMakespan.critical) only, the chain
        taken again after each improving move; in place, returns the final makespan. The last
        schedule scored must be `assign`'s."""
        def chain() -> list[list[int]]:
            return [self.units[n] for n in dict.fromkeys(self.unit_of[i] for i in self.makespan.critical())]

        return self._descend(assign, value, max_evaluations, chain, restart=True)

    def _descend(self, assign: list[int], value: float, max_evaluations: int, units, *, restart: bool) -> float:
        """Passes over `units()` trying every move of each, until a pass improves nothing or the
        budget is spent; with `restart`, a new pass (a new `units()`) after each improving move."""
        used, improved = self.used(assign), True
        while improved and self.evaluations < max_evaluations:
            improved = False
            for unit in units():
                for k in range(self.sub.num_devices):
                    if self.evaluations >= max_evaluations:
                        break
                    if k != assign[unit[0]] and self.fits(unit, k, used):
                        moved = self._move(assign, unit, k, used, value)
                        if moved is not None:
                            value, improved = moved, True
                            if restart:
                                break
                if (improved and restart) or self.evaluations >= max_evaluations:
                    break
        return value

    def kick(self, assign: list[int], rng: random.Random, strength: int) -> None:
        """Move 1..strength random units to random devices where they fit (in place)."""
        used = self.used(assign)
        for _ in range(rng.randint(1, strength)):
            unit = rng.choice(self.units)
            old = assign[unit[0]]
            options = [k for k in range(self.sub.num_devices) if k != old and self.fits(unit, k, used)]
            if options:
                k = rng.choice(options)
                for m in unit:
                    assign[m] = k
                used[old] -= self.need[unit, old].sum()
                used[k] += self.need[unit, k].sum()


def improve_by_moves(sub: PlacementProblem, assign: list[int], max_evaluations: int, *, kicks: bool = False, seed: int = 0) -> list[int]:
    """Local search from `assign`: first-improvement descent over one-task (colocation
    group) moves while the list-scheduled makespan drops and memory fits; with `kicks`,
    an iterated local search that then perturbs the best assignment (1 to KICK_STRENGTH random moves),
    descends again over the moves of the tasks on the critical chain only (`descend_critical`: a
    few tasks instead of all, so many more kicks fit in the budget) and keeps the result when it
    is better, until `max_evaluations`
    schedules are spent or KICK_PATIENCE kicks in a row found nothing better (seeded:
    the same input gives the same output). Returns the
    best assignment found; it fits wherever the start fits."""
    search = _MoveSearch(sub, assign)
    best = list(assign)
    value = search.descend(best, search.score(best), max_evaluations)
    rng = random.Random(seed)
    idle = 0
    while kicks and search.evaluations < max_evaluations and search.units and idle < KICK_PATIENCE:
        trial = list(best)
        search.kick(trial, rng, KICK_STRENGTH)
        tried = search.descend_critical(trial, search.score(trial), max_evaluations)
        idle += 1
        if tried < value * (1 - 1e-12):
            best, value, idle = trial, tried, 0
    return best


def seeded_solution(problem: PlacementProblem, module: Module, k: int | None, l: int, batch: int,
                    devices: list[int], order: list[int], span_s: float) -> SubSolution:
    """A module's part of a given one-shard plan (its devices, its tasks' positions by start,
    its span in that plan), improved by moves when that helps."""
    best = SubSolution(cost_s=span_s, bound_s=0.0, devices=tuple(devices), order=tuple(order), method="baseline")
    sub, _ = build_subproblem(problem, module.tasks, module.input_task, k, l, np.ones(problem.num_devices, dtype=bool), batch)
    if sub.num_tasks > LOCAL_SEARCH_MAX_TASKS:
        return best
    offset = 1 if module.input_task is not None else 0
    moved = improve_by_moves(sub, ([k] if offset else []) + list(devices), max(2, LOCAL_SEARCH_WORK // sub.num_tasks))
    cost, moved_order = _list_scheduled(sub, moved)
    if cost >= span_s * (1 - 1e-12):
        return best
    devices_m, order_m = _module_part(moved, moved_order, offset)
    return SubSolution(cost_s=cost, bound_s=0.0, devices=devices_m, order=order_m, method="baseline+moves")


def intensify_subproblem(problem: PlacementProblem, module: Module, k: int | None, l: int, allowed: np.ndarray, batch: int,
                         devices: tuple[int, ...], options: SolveOptions) -> SubSolution | None:
    """The iterated local search (`improve_by_moves` with kicks, INTENSIFY_WORK (task + edge)-evaluations)
    from a module solution's devices for the pair (k, l); None when it finds nothing better
    than the list-scheduled start. Bound 0: the caller keeps the subproblem's own."""
    sub, _ = build_subproblem(problem, module.tasks, module.input_task, k, l, allowed, batch)
    offset = 1 if module.input_task is not None else 0
    start = ([k] if offset else []) + list(devices)
    moved = improve_by_moves(sub, start, max(2, INTENSIFY_WORK // (sub.num_tasks + sub.num_edges)), kicks=True, seed=options.seed)
    if moved == start:
        return None
    cost, order = _list_scheduled(sub, moved)
    devices_m, order_m = _module_part(moved, order, offset)
    return SubSolution(cost_s=cost, bound_s=0.0, devices=devices_m, order=order_m, method="ils")


def _list_scheduled(sub: PlacementProblem, assign: list[int]) -> tuple[float, list[int]]:
    """(makespan, tasks by start) of an assignment, by schedule.asap_schedule itself."""
    from llm_planner.solve.schedule import asap_schedule

    start, finish = asap_schedule(sub, [sub.batch_size], [assign])
    return max(finish.values()), [i for (_, i) in sorted(start, key=lambda it: (start[it], finish[it], it))]


def _closed_form(sub: PlacementProblem, offset: int, l: int, batch: int) -> SubSolution:
    ready = 0.0
    for e in range(sub.num_edges):  # only edges from the input task reach a one-task module
        k = int(np.argmax(sub.supported[int(sub.edge_src[e])]))
        ready = max(ready, sub.transfer_time(e, k, l, batch))
    cost = ready + sub.task_time(offset, l, batch)
    return SubSolution(cost_s=cost, bound_s=cost, devices=(l,), order=(0,), method="closed-form")


def map_solution(sol: SubSolution, perm: np.ndarray) -> SubSolution:
    return replace(sol, devices=tuple(int(perm[d]) for d in sol.devices))


def make_executor(options: SolveOptions, num_jobs: int, problem: PlacementProblem) -> Executor | None:
    """A process pool (or an MPI pool when started under mpirun with several ranks) whose
    workers receive `problem` once, when they start; None = serial."""
    workers = options.workers or os.cpu_count() or 1
    if num_jobs < 2 or workers < 2:
        return None
    if int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1:
        try:
            from mpi4py.futures import MPIPoolExecutor  # lazily: only for planning across cluster nodes

            return MPIPoolExecutor(initializer=_init_worker, initargs=(problem,))
        except ImportError:
            log.warning("running under MPI but mpi4py is missing: solving subproblems on this node only")
    return ProcessPoolExecutor(max_workers=min(workers, num_jobs), initializer=_init_worker, initargs=(problem,))


class Pool:
    """One pool of workers for all the batches of jobs of one problem (a MILP-SPLIT run asks for
    a dozen batches; starting a pool for each cost more than the jobs on small graphs). Started at
    the first batch of at least two jobs, with options.workers processes; `close` ends it."""

    def __init__(self, problem: PlacementProblem, options: SolveOptions):
        self.problem, self.options = problem, options
        self._executor: Executor | None = None

    def executor(self, num_jobs: int) -> Executor | None:
        if self._executor is None and num_jobs >= 2:
            self._executor = make_executor(self.options, sys.maxsize, self.problem)  # sized by options.workers alone
        return self._executor if num_jobs >= 2 else None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None


_worker_problem: PlacementProblem | None = None  # in a pool worker: the problem its jobs belong to


def _init_worker(problem: PlacementProblem) -> None:
    global _worker_problem
    _worker_problem = problem


def _call(fn, args: tuple, kwargs: dict):
    assert _worker_problem is not None, "pool worker started without its problem"
    return fn(_worker_problem, *args, **kwargs)


def run_many(problem: PlacementProblem, calls: dict[tuple, tuple], options: SolveOptions, pool: Pool | None = None) -> dict:
    """Run every call (key -> (fn, args, kwargs), fn(problem, *args, **kwargs)) serially or in
    `pool` (which must be `problem`'s), else in a pool of `make_executor` for these calls only;
    results by key. Calls for one-task modules run here."""
    heavy = [key for key, (_, args, _) in calls.items() if len(args[0].tasks) > 1]
    if pool is not None:
        assert pool.problem is problem, "a pool's workers hold another problem"
        executor = pool.executor(len(heavy))
    else:
        executor = make_executor(options, len(heavy), problem)
    if executor is None:
        return {key: fn(problem, *args, **kwargs) for key, (fn, args, kwargs) in calls.items()}
    out: dict[tuple, object] = {}
    try:
        futures = {key: executor.submit(_call, *calls[key]) for key in heavy}
        for key, (fn, args, kwargs) in calls.items():
            if key not in futures:
                out[key] = fn(problem, *args, **kwargs)
        for key, fut in futures.items():
            out[key] = fut.result()
    finally:
        if pool is None:
            executor.shutdown()
    return out


def solve_many(problem: PlacementProblem, jobs: dict[tuple, tuple], options: SolveOptions,
               skip_bound: frozenset = frozenset(), pool: Pool | None = None) -> dict[tuple, SubSolution]:
    """Solve every job (key -> (module, k, l, allowed, batch)); results by key.
    Jobs in `skip_bound` compute no bound for a HEFT module (bound 0)."""
    return run_many(problem, {key: (solve_subproblem, (*job, options), {"with_bound": key not in skip_bound}) for key, job in jobs.items()},
                    options, pool)
