"""Solving MILP-SPLIT's module subproblems: closed form, exact MILP or list scheduler,
deduplicated by structure and device symmetry, serially or in a process pool
(solve/split/pool.py); the local search on a module's assignment is in
solve/split/moves.py.

A subproblem is named by a `SubKey`: the module's structural signature, the
(input device, output device) pair in canonical form, the mask of usable
devices and the batch. Modules with equal signatures and device pairs related
by a symmetry of the cluster (devices of one class, llm_planner.core.tensor_groups.device_class:
server template, kind and degree, are interchangeable inside one server, and so are
servers of one template) share one solve; the solution is carried over by the device
permutation that maps one pair onto the other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from llm_planner.core.tensor_groups import DeviceClass, device_class
from llm_planner.placement.baselines.single import run_baseline
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.errors import SolveError
from llm_planner.placement.milp.milp import solve_milp
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.schedule import asap_schedule
from llm_planner.placement.split.modules import Module
from llm_planner.placement.split.moves import improve_by_moves
from llm_planner.placement.split.pool import Pool, run_many
from llm_planner.placement.split.subproblem import build_subproblem, is_solvable

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


def device_classes(problem: PlacementProblem) -> list[DeviceClass]:
    """The class of each device (core.tensor_groups.device_class): members of one class are interchangeable."""
    return [device_class(d) for d in problem.devices]


def pair_key(problem: PlacementProblem, classes: list[DeviceClass], k: int | None, l: int) -> tuple:
    """Canonical form of a device pair under the cluster's symmetries."""
    dev = problem.devices
    if k is None:
        return (None, classes[l])
    relation = 0 if k == l else (1 if dev[k].node == dev[l].node else 2)
    return (classes[k], classes[l], relation)


def device_permutation(
    problem: PlacementProblem, src: tuple[int | None, int], dst: tuple[int | None, int]
) -> np.ndarray:
    """perm[d] = image of device d under a symmetry mapping src pair onto dst pair: copies of a
    server template swapped whole, then devices of one class (device_class) swapped inside a server."""
    devs = problem.devices
    node_map = {d.node: d.node for d in devs}

    def swap_nodes(a: str, b: str) -> None:
        inv = {v: n for n, v in node_map.items()}
        na, nb = inv[a], inv[b]
        node_map[na], node_map[nb] = b, a

    slot = {(d.node, device_class(d), d.index): i for i, d in enumerate(devs)}
    index_map: dict[tuple[str, DeviceClass], dict[int, int]] = {}

    def image(i: int) -> tuple[str, DeviceClass, int]:
        d = devs[i]
        node, cls = node_map[d.node], device_class(d)
        idx = index_map.get((node, cls), {}).get(d.index, d.index)
        return node, cls, idx

    for a, b in zip(src, dst):
        if a is None:
            continue
        cur_node = image(a)[0]
        if cur_node != devs[b].node:
            swap_nodes(cur_node, devs[b].node)
        node, cls, idx = image(a)
        if idx != devs[b].index:
            m = index_map.setdefault((node, cls), {})
            inv = {v: j for j, v in m.items()}
            ja, jb = inv.get(idx, idx), inv.get(devs[b].index, devs[b].index)
            m[ja], m[jb] = devs[b].index, idx
    perm = np.array([slot[image(i)] for i in range(len(devs))], dtype=int)
    assert all(perm[a] == b for a, b in zip(src, dst) if a is not None), "symmetry mapping failed"
    return perm


def solve_subproblem(
    problem: PlacementProblem,
    module: Module,
    k: int | None,
    l: int,
    allowed: np.ndarray,
    batch: int,
    options: SolveOptions,
    *,
    with_bound: bool = True,
) -> SubSolution:
    """One module for one (input device, output device) pair.

    Up to options.max_module_tasks tasks: the exact MILP (warm-started by the best
    baseline, options.time_limit_s). Larger modules: HEFT. A plan not proven optimal
    (HEFT, or the MILP stopped by its time limit) is then improved by moving tasks
    (`improve_by_moves`), for modules of at most LOCAL_SEARCH_MAX_TASKS tasks.

    The bound of a HEFT module is bounds.combined.lower_bound of the subproblem, its input
    pinned to k: the path LP's pinned windows (bounds/path_lp.py) then know that a
    device other than k waits for a transfer before it can start; `with_bound=False`
    skips it (bound 0) where the caller reads no bound.
    """
    sub, _ = build_subproblem(problem, module.tasks, module.input_task, k, l, allowed, batch)
    if not is_solvable(sub):
        return INFEASIBLE
    offset = 1 if module.input_task is not None else 0
    if len(module.tasks) == 1:
        return _closed_form(sub, offset, l, batch)

    if len(module.tasks) <= options.max_module_tasks:
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
    """bounds.combined.lower_bound of module's subproblem for `batch` samples with its input cut
    on k (None: the module has no input cut) and its output cut on l."""

    sub, _ = build_subproblem(
        problem, module.tasks, module.input_task, k, l, np.ones(problem.num_devices, dtype=bool), batch
    )
    if not is_solvable(sub):
        return INF
    return lower_bound(sub)


# Local search effort is capped in task-evaluations (evaluations x tasks), not in
# seconds, so that its result does not depend on the machine's load.
LOCAL_SEARCH_MAX_TASKS = 1000  # larger modules keep HEFT's plan
LOCAL_SEARCH_WORK = 10_000  # task-evaluations per subproblem (about 0.02 s)
INTENSIFY_WORK = 8_000_000  # (task + edge)-evaluations of the iterated local search on a module the DP picks (4-12 s)


def seeded_solution(
    problem: PlacementProblem,
    module: Module,
    k: int | None,
    l: int,
    batch: int,
    devices: list[int],
    order: list[int],
    span_s: float,
) -> SubSolution:
    """A module's part of a given one-shard plan (its devices, its tasks' positions by start,
    its span in that plan), improved by moves when that helps."""
    best = SubSolution(cost_s=span_s, bound_s=0.0, devices=tuple(devices), order=tuple(order), method="baseline")
    sub, _ = build_subproblem(
        problem, module.tasks, module.input_task, k, l, np.ones(problem.num_devices, dtype=bool), batch
    )
    if sub.num_tasks > LOCAL_SEARCH_MAX_TASKS:
        return best
    offset = 1 if module.input_task is not None else 0
    moved = improve_by_moves(sub, ([k] if offset else []) + list(devices), max(2, LOCAL_SEARCH_WORK // sub.num_tasks))
    cost, moved_order = _list_scheduled(sub, moved)
    if cost >= span_s * (1 - 1e-12):
        return best
    devices_m, order_m = _module_part(moved, moved_order, offset)
    return SubSolution(cost_s=cost, bound_s=0.0, devices=devices_m, order=order_m, method="baseline+moves")


def intensify_subproblem(
    problem: PlacementProblem,
    module: Module,
    k: int | None,
    l: int,
    allowed: np.ndarray,
    batch: int,
    devices: tuple[int, ...],
    options: SolveOptions,
) -> SubSolution | None:
    """The iterated local search (`improve_by_moves` with kicks, INTENSIFY_WORK (task + edge)-evaluations)
    from a module solution's devices for the pair (k, l); None when it finds nothing better
    than the list-scheduled start. Bound 0: the caller keeps the subproblem's own."""
    sub, _ = build_subproblem(problem, module.tasks, module.input_task, k, l, allowed, batch)
    offset = 1 if module.input_task is not None else 0
    start = ([k] if offset else []) + list(devices)
    moved = improve_by_moves(
        sub, start, max(2, INTENSIFY_WORK // (sub.num_tasks + sub.num_edges)), kicks=True, seed=options.seed
    )
    if moved == start:
        return None
    cost, order = _list_scheduled(sub, moved)
    devices_m, order_m = _module_part(moved, order, offset)
    return SubSolution(cost_s=cost, bound_s=0.0, devices=devices_m, order=order_m, method="ils")


def _list_scheduled(sub: PlacementProblem, assign: list[int]) -> tuple[float, list[int]]:
    """(makespan, tasks by start) of an assignment, by schedule.asap_schedule itself."""

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


def solve_many(
    problem: PlacementProblem,
    jobs: dict[tuple, tuple],
    options: SolveOptions,
    skip_bound: frozenset = frozenset(),
    pool: Pool | None = None,
) -> dict[tuple, SubSolution]:
    """Solve every job (key -> (module, k, l, allowed, batch)); results by key.
    Jobs in `skip_bound` compute no bound for a HEFT module (bound 0)."""
    return run_many(
        problem,
        {key: (solve_subproblem, (*job, options), {"with_bound": key not in skip_bound}) for key, job in jobs.items()},
        options,
        pool,
    )
