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

import logging
import os
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


def solve_subproblem(problem: PlacementProblem, module: Module, k: int | None, l: int, allowed: np.ndarray, batch: int, options: SolveOptions) -> SubSolution:
    """One module for one (input device, output device) pair."""
    sub, local = build_subproblem(problem, module.tasks, module.input_task, k, l, allowed, batch)
    if not is_solvable(sub):
        return INFEASIBLE
    offset = 1 if module.input_task is not None else 0
    if len(module.tasks) == 1:
        return _closed_form(sub, offset, l, batch)
    from llm_planner.solve.api import SolveError
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
    names = {t.name: n for n, t in enumerate(sub.graph.tasks)}
    dev = {n: k2 for k2, n in enumerate(sub.device_names)}
    devices = tuple(dev[plan.assignment[sub.graph.tasks[n].name]] for n in range(offset, len(local)))
    order = tuple(names[s.task] - offset for s in sorted(plan.schedule, key=lambda s: (s.start_s, s.finish_s)) if names[s.task] >= offset)
    bound = plan.lower_bound_s if method != "heft" else min(lower_bound(sub), plan.objective_s)
    return SubSolution(cost_s=plan.objective_s, bound_s=bound, devices=devices, order=order, method=method)


def _closed_form(sub: PlacementProblem, offset: int, l: int, batch: int) -> SubSolution:
    ready = 0.0
    for e in range(sub.num_edges):  # only edges from the input task reach a one-task module
        k = int(np.argmax(sub.supported[int(sub.edge_src[e])]))
        ready = max(ready, sub.transfer_time(e, k, l, batch))
    cost = ready + sub.task_time(offset, l, batch)
    return SubSolution(cost_s=cost, bound_s=cost, devices=(l,), order=(0,), method="closed-form")


def map_solution(sol: SubSolution, perm: np.ndarray) -> SubSolution:
    return replace(sol, devices=tuple(int(perm[d]) for d in sol.devices))


def make_executor(options: SolveOptions, num_jobs: int) -> Executor | None:
    """A process pool (or an MPI pool when started under mpirun with several ranks); None = serial."""
    workers = options.workers or os.cpu_count() or 1
    if num_jobs < 2 or workers < 2:
        return None
    if int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1:
        try:
            from mpi4py.futures import MPIPoolExecutor  # lazily: only for planning across cluster nodes

            return MPIPoolExecutor()
        except ImportError:
            log.warning("running under MPI but mpi4py is missing: solving subproblems on this node only")
    return ProcessPoolExecutor(max_workers=min(workers, num_jobs))


def _job(args: tuple) -> SubSolution:
    return solve_subproblem(*args)


def solve_many(problem: PlacementProblem, jobs: dict[tuple, tuple], options: SolveOptions) -> dict[tuple, SubSolution]:
    """Solve every job (key -> (module, k, l, allowed, batch)); results by key."""
    keys = list(jobs)
    heavy = [key for key in keys if len(jobs[key][0].tasks) > 1]
    executor = make_executor(options, len(heavy))
    out: dict[tuple, SubSolution] = {}
    if executor is None:
        for key in keys:
            out[key] = solve_subproblem(problem, *jobs[key], options)
        return out
    with executor:
        futures = {key: executor.submit(_job, (problem, *jobs[key], options)) for key in heavy}
        for key in keys:
            if key not in futures:
                out[key] = solve_subproblem(problem, *jobs[key], options)
        for key, fut in futures.items():
            out[key] = fut.result()
    return out
