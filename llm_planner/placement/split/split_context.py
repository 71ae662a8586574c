"""The state of one MILP-SPLIT run (solve/split/split.py): its modules and, per module, the
table of subproblem solutions A_j(k, l) and bounds B_j(k, l) over (input device, output
device) pairs, each solved once per structure and device symmetry (solve/split/subsolve.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from llm_planner.core.gap import proven
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.split import subsolve
from llm_planner.placement.split.modules import Module, module_signature, split_modules
from llm_planner.placement.split.pool import Pool, run_many

log = logging.getLogger(__name__)

INF = float("inf")


@dataclass
class CostTable:
    """A_j(k, l) and B_j(k, l) of one module for the given input and output devices."""

    inputs: list[int | None]
    outs: list[int]
    cost: np.ndarray  # [len(inputs), len(outs)] spans, inf where infeasible
    bound: np.ndarray  # lower bounds on the spans
    solutions: dict[tuple[int | None, int], subsolve.SubSolution] | None  # None: one-task module
    keys: dict[tuple[int | None, int], tuple] | None = None  # the cache key of each pair's subproblem

    def solution(self, a: int, b: int) -> subsolve.SubSolution:
        k, l = self.inputs[a], self.outs[b]
        if self.solutions is None:
            c = float(self.cost[a, b])
            return subsolve.SubSolution(cost_s=c, bound_s=c, devices=(l,), order=(0,), method="closed-form")
        return self.solutions[(k, l)]


class SplitContext:
    """Modules, cached subproblem solutions and solve counts of one MILP-SPLIT run."""

    def __init__(self, problem: PlacementProblem, options: SolveOptions):
        self.problem, self.options = problem, options
        self.modules = merge_for_colocation(problem, split_modules(problem, max_module_tasks=10**9))
        self.classes = subsolve.device_classes(problem)
        self.cache: dict[tuple, subsolve.SubSolution] = {}
        self.num_requested = 0
        self._times: dict[int, np.ndarray] = {}
        self._in_edges: list[list[int]] | None = None  # problem.in_edges(), once
        # (module, input device, output device) -> a module solution taken from a whole-graph plan;
        # used where it beats the subproblem's own, for the full batch on all devices
        self.seeds: dict[tuple[int, int | None, int], subsolve.SubSolution] = {}
        self.search = False  # run the iterated local search on the DP's picks (see _searched_dp)
        self.intensified: set[tuple] = set()  # subproblem keys the iterated local search has run on
        self._reps: dict[tuple, tuple] = {}  # subproblem key -> the device pair it was solved for
        self.module_bounds: dict[tuple, float] = {}  # (signature, device pair key, batch) -> bound (shard_chain_bound)
        self.chain_bounds: dict[int, float] = {}  # batch -> module_chain_bound
        self.pool = Pool(problem, options)  # the subproblem workers, for the whole run; closed by solve_split
        # the chain bound (sum of module bounds) holds for one shard only; elsewhere HEFT modules skip their bound LPs
        self.wants_chain_bound = problem.objective == "latency" and (problem.max_shards == 1 or problem.batch_size == 1)

    def __enter__(self) -> SplitContext:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.pool.close(abort=exc_type is not None)  # interrupted or failed: the workers' jobs are not wanted

    def costs(self, j: int, allowed: np.ndarray, batch: int, inputs: list[int | None]) -> CostTable:
        """Module j's spans for every input device in `inputs` and every usable output device."""
        p, module = self.problem, self.modules[j]
        outs = self._outs(j, allowed)
        self.num_requested += len(inputs) * len(outs)
        if len(module.tasks) == 1:
            cost = self._one_task_costs(module, inputs, outs, batch)
            return CostTable(inputs=inputs, outs=outs, cost=cost, bound=cost, solutions=None)
        keyed, jobs, unbounded = self._jobs(j, allowed, batch, inputs)
        self._solve(jobs, unbounded)
        solutions, keys = {}, {}
        seeded = bool(allowed.all()) and batch == p.batch_size
        for k, l, key in keyed:
            keys[(k, l)] = key
            sol = self.cache[key]
            src = self._reps[key]  # the pair it was solved for (an earlier call may have solved it for another)
            if src != (k, l) and sol.devices:
                sol = subsolve.map_solution(sol, subsolve.device_permutation(p, src, (k, l)))
            seed = self.seeds.get((j, k, l)) if seeded else None
            if seed is not None and seed.cost_s < sol.cost_s:
                sol = replace(seed, bound_s=min(sol.bound_s, seed.cost_s))  # the pair's bound stays valid
            solutions[(k, l)] = sol
        cost = np.array([[solutions[(k, l)].cost_s for l in outs] for k in inputs]).reshape(len(inputs), len(outs))
        bound = np.array([[solutions[(k, l)].bound_s for l in outs] for k in inputs]).reshape(len(inputs), len(outs))
        return CostTable(inputs=inputs, outs=outs, cost=cost, bound=bound, solutions=solutions, keys=keys)

    def intensify(
        self,
        picks: list[tuple[CostTable, int | None, int]],
        allowed_from: list[np.ndarray],
        batch: int,
        tables_from: int,
    ) -> bool:
        """Run the iterated local search on the subproblems behind the DP's picks (module
        tables_from + n for the n-th pick) that are not proven optimal and not yet searched;
        store what improves in the cache, in the frame of the pair each key was solved for.
        Returns whether any subproblem was searched."""
        p = self.problem
        calls, picked = {}, {}
        for n, (table, k, l) in enumerate(picks):
            j = tables_from + n
            if table.keys is None:
                continue
            key = table.keys[(k, l)]
            sol = table.solutions[(k, l)]
            if (
                key in self.intensified
                or sol.method in ("milp-optimal", "infeasible")
                or proven(sol.cost_s, sol.bound_s, self.options.rel_gap)
            ):
                continue
            if len(self.modules[j].tasks) > subsolve.LOCAL_SEARCH_MAX_TASKS:
                continue
            self.intensified.add(key)
            calls[key] = (
                subsolve.intensify_subproblem,
                (self.modules[j], k, l, allowed_from[j], batch, sol.devices, self.options),
                {},
            )
            picked[key] = (k, l, sol)
        if not calls:
            return False
        for key, found in run_many(p, calls, self.options, self.pool).items():
            k, l, start = picked[key]
            if found is None or found.cost_s >= min(start.cost_s, self.cache[key].cost_s) * (1 - 1e-12):
                continue
            rep = self._reps[key]
            if rep != (k, l):
                found = subsolve.map_solution(found, subsolve.device_permutation(p, (k, l), rep))
            old = self.cache[key]
            self.cache[key] = replace(found, bound_s=min(old.bound_s, found.cost_s), method=old.method + "+ils")
        return True

    def prefetch(self, allowed: np.ndarray, batch: int) -> None:
        """Solve every subproblem the DP over `allowed` can ask for, in one batch of jobs
        (keeps the pool busy instead of waiting for it module by module)."""
        jobs: dict[tuple, tuple] = {}
        unbounded: set[tuple] = set()
        for j, module in enumerate(self.modules):
            if len(module.tasks) > 1:
                inputs = [None] if module.input_task is None else [k for k in self._outs(j - 1, allowed)]
                _, more, without = self._jobs(j, allowed, batch, inputs, skip=jobs)
                jobs.update(more)
                unbounded |= without
        self._solve(jobs, unbounded)

    def _outs(self, j: int, allowed: np.ndarray) -> list[int]:
        """Devices that may run module j's output cut."""
        last = self.modules[j].tasks[-1]
        return [l for l in range(self.problem.num_devices) if allowed[l] and self.problem.supported[last, l]]

    def _jobs(self, j: int, allowed: np.ndarray, batch: int, inputs: list[int | None], skip: dict | None = None):
        """Subproblem keys of module j for each (input, output) pair, the jobs not yet solved
        (each for the first pair with its key), and the jobs whose bound no one reads (HEFT
        modules then carry bound 0)."""
        p, module = self.problem, self.modules[j]
        symmetric = bool(allowed.all())
        wants_bound = self.wants_chain_bound and symmetric and batch == p.batch_size  # what chain_bound reads
        jobs: dict[tuple, tuple] = {}
        keyed = []
        for k in inputs:
            for l in self._outs(j, allowed):
                pk = subsolve.pair_key(p, self.classes, k, l) if symmetric else (k, l)
                key = (module.signature, pk, allowed.tobytes(), batch)
                keyed.append((k, l, key))
                if key not in self.cache and key not in jobs and (skip is None or key not in skip):
                    jobs[key] = (module, k, l, allowed, batch)
        return keyed, jobs, set() if wants_bound else set(jobs)

    def _solve(self, jobs: dict[tuple, tuple], unbounded: set[tuple]) -> None:
        solved = subsolve.solve_many(self.problem, jobs, self.options, skip_bound=frozenset(unbounded), pool=self.pool)
        self._reps.update({key: (job[1], job[2]) for key, job in jobs.items()})
        self.cache.update(solved)

    def _one_task_costs(self, module: Module, inputs: list[int | None], outs: list[int], batch: int) -> np.ndarray:
        """Closed form for a module of one task c: max over edges u->c of c(e, k, l, b), plus t(c, l, b)."""

        p = self.problem
        c = module.tasks[0]
        if batch not in self._times:
            self._times[batch] = task_times(p, batch)
        run = self._times[batch][c, outs]
        cost = np.tile(run, (len(inputs), 1))
        if module.input_task is None:
            return cost
        if self._in_edges is None:
            self._in_edges = p.in_edges()
        in_edges = self._in_edges[c]
        if in_edges:
            ks, ls = np.asarray(inputs, dtype=int), np.asarray(outs, dtype=int)
            pair = np.ix_(in_edges, ks, ls)
            comm = (p.comm_fixed[pair] + p.comm_slope[pair] * batch).max(axis=0)  # [inputs, outs]
            cost += np.where(ks[:, None] == ls[None, :], 0.0, comm)
        return cost


def merge_for_colocation(problem: PlacementProblem, modules: list[Module]) -> list[Module]:
    """Merge consecutive modules so that no colocation group spans two of them."""
    group_of = {}
    for j, m in enumerate(modules):
        for t in m.tasks:
            group_of[t] = j
    spans = []
    for members in problem.colocate_groups():
        js = sorted({group_of[t] for t in members})
        if len(js) > 1:
            spans.append((js[0], js[-1]))
    if not spans:
        return modules
    merged: list[list[int]] = []
    end = -1
    for j, m in enumerate(modules):
        if j <= end:
            merged[-1].extend(m.tasks)
        else:
            merged.append(list(m.tasks))
        end = max([end] + [b for a, b in spans if a == j])
    out, prev, in_edges = [], None, problem.in_edges()
    for j, tasks in enumerate(merged):
        out.append(
            Module(
                index=j, tasks=tuple(tasks), input_task=prev, signature=module_signature(problem, tasks, prev, in_edges)
            )
        )
        prev = tasks[-1]
    return out
