"""MILP-SPLIT: cut the graph into a chain of modules, solve each module exactly, join by DP.

Latency. Let modules M_1..M_m end at the cut tasks c_1..c_m (solve/modules.py).
Every task of M_j runs after c_{j-1} finishes and before c_j finishes, and the
tasks of different modules never overlap in time, so for a single shard

    latency = sum_j span_j,   span_j = finish(c_j) - finish(c_{j-1}).

For each module and pair (k = device of c_{j-1}, l = device of c_j) the exact
MILP gives the least span A_j(k, l) (solve/split_subsolve.py) and a dual bound
B_j(k, l) <= A_j(k, l). The dynamic program

    D_1(l) = A_1(l),    D_j(l) = min_k D_{j-1}(k) + A_j(k, l)

gives the optimal plan when every subproblem is solved to optimality and
memory does not bind: any plan restricted to one module is a feasible
subproblem solution for its cut devices. The same recursion over B_j instead
of A_j is a lower bound on the optimal latency (the sum of per-module bounds
along the chain), valid whatever the memory, for one shard; for a batch that
may be split, the same chain at the largest shard's least size enters a
minimum over shard counts (`shard_chain_bound`).

Modules planned heuristically are searched further where the plan uses them:
once the DP has picked a solution per module, an iterated local search runs on
the picked subproblems not proven optimal, and the DP joins again over the
lowered costs (`_searched_dp`, for the best candidate's chain only).

Memory couples modules (a device holds the weights of every module placed on
it). The DP ignores it; the joined plan is then checked module by module and,
at the first module where a device overflows, the plan before that module is
kept, the device is closed for the rest of the chain, the remaining modules'
subproblems are re-solved without it and the DP resumes from the kept prefix
(repair and re-solve). This is where the split loses optimality with binding
memory: a closed device might still have room for a later, smaller module.

Data parallelism: when the batch may be split, the devices are cut into g
identical groups (identical servers, or identical devices of one server) and
each group runs one shard of about Q/g samples with the same plan mapped by the
symmetry; every feasible g is tried and the best plan kept. Uneven splits over
unlike devices are left to the exact MILP.

Throughput: modules are kept whole and assigned to devices as contiguous
stages along a device order (fastest first) by a min-max DP, see
solve/split_throughput.py; single tasks then move between devices from the
best such plan and from the best baseline (solve/split_loads.py).

The plan returned is never worse than the best baseline: when a baseline wins,
its plan is returned with solver details saying so.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from llm_planner.plan import Plan
from llm_planner.solve import split_subsolve as subsolve
from llm_planner.solve.modules import Module, split_modules
from llm_planner.solve.options import SolveOptions
from llm_planner.solve.problem import PlacementProblem
from llm_planner.solve.schedule import make_plan

log = logging.getLogger(__name__)

INF = float("inf")
INTENSIFY_ROUNDS = 2  # DP -> search the picked modules -> DP, at most this many times per chain
MAX_CHAIN_BATCHES = 4  # shard_chain_bound computes module chains at this many batch sizes at most


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
        self.pool = subsolve.Pool(problem, options)  # the subproblem workers, for the whole run; closed by solve_split
        # the chain bound (sum of module bounds) holds for one shard only; elsewhere HEFT modules skip their bound LPs
        self.wants_chain_bound = problem.objective == "latency" and (problem.max_shards == 1 or problem.batch_size == 1)

    def __enter__(self) -> SplitContext:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.close()

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

    def intensify(self, picks: list[tuple[CostTable, int | None, int]], allowed_from: list[np.ndarray], batch: int,
                  tables_from: int) -> bool:
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
            if key in self.intensified or sol.method in ("milp-optimal", "infeasible") or sol.cost_s <= sol.bound_s * (1 + self.options.rel_gap):
                continue
            if len(self.modules[j].tasks) > subsolve.LOCAL_SEARCH_MAX_TASKS:
                continue
            self.intensified.add(key)
            calls[key] = (subsolve.intensify_subproblem, (self.modules[j], k, l, allowed_from[j], batch, sol.devices, self.options), {})
            picked[key] = (k, l, sol)
        if not calls:
            return False
        for key, found in subsolve.run_many(p, calls, self.options, self.pool).items():
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
        from llm_planner.solve.bounds import task_times

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
    from llm_planner.solve.modules import module_signature

    out, prev = [], None
    for j, tasks in enumerate(merged):
        out.append(Module(index=j, tasks=tuple(tasks), input_task=prev, signature=module_signature(problem, tasks, prev)))
        prev = tasks[-1]
    return out


def _dp(ctx: SplitContext, start: int, allowed_from: list[np.ndarray], batch: int, init: dict[int | None, float]):
    """min-sum DP over modules start..m-1 from the given costs of the input cut's devices:
    (module solutions, total, the (table, input device, output device) picked per module)."""
    back: list[tuple[CostTable, np.ndarray]] = []
    inputs = list(init)
    best = np.array([init[k] for k in inputs])
    for j in range(start, len(ctx.modules)):
        if ctx.modules[j].input_task is None:
            inputs, best = [None], np.zeros(1)
        keep = np.isfinite(best)
        inputs, best = [k for k, ok in zip(inputs, keep) if ok], best[keep]
        if not inputs:
            return [], INF, []
        table = ctx.costs(j, allowed_from[j], batch, inputs)
        if not table.outs:
            return [], INF, []
        total = best[:, None] + table.cost
        arg = np.argmin(total, axis=0)
        back.append((table, arg))
        inputs, best = list(table.outs), total[arg, np.arange(len(table.outs))]
    if not np.isfinite(best).any():
        return [], INF, []
    b = int(np.argmin(best))
    value = float(best[b])
    sols, picks = [], []
    for n in range(len(back) - 1, -1, -1):
        table, arg = back[n]
        a = int(arg[b])
        sols.append(table.solution(a, b))
        k = table.inputs[a]
        picks.append((table, k, table.outs[b]))
        if n > 0 and k is not None:
            b = back[n - 1][0].outs.index(k)
    return sols[::-1], value, picks[::-1]


def _searched_dp(ctx: SplitContext, start: int, allowed_from: list[np.ndarray], batch: int, init: dict[int | None, float]):
    """The DP; with ctx.search on, then the iterated local search on the modules it picked,
    then the DP again over the improved costs, until it picks only searched (or proven)
    subproblems or INTENSIFY_ROUNDS rounds have run. Costs only fall, so each round's
    total is at most the last's; the search is spent only where the DP looks."""
    sols, total, picks = _dp(ctx, start, allowed_from, batch, init)
    for _ in range(INTENSIFY_ROUNDS if ctx.search else 0):
        if not sols or not ctx.intensify(picks, allowed_from, batch, start):
            break
        sols, total, picks = _dp(ctx, start, allowed_from, batch, init)
    return sols, total


def _first_overflow(ctx: SplitContext, sols: list[subsolve.SubSolution], batch: int) -> tuple[int, int] | None:
    """(module index, device) where memory first overflows along the chain, or None."""
    p = ctx.problem
    used = np.zeros(p.num_devices)
    for j, sol in enumerate(sols):
        for pos, d in enumerate(sol.devices):
            t = ctx.modules[j].tasks[pos]
            if p.mem_counts[t, d]:
                used[d] += p.weight_bytes[t] + p.mem_bytes_per_sample[t] * batch
        over = np.nonzero(used > p.mem_capacity * (1 + 1e-12))[0]
        if len(over):
            return j, int(over[0])
    return None


def latency_chain(ctx: SplitContext, batch: int, allowed: np.ndarray) -> tuple[list[subsolve.SubSolution], float] | None:
    """Module solutions of the DP with memory repair, or None when nothing fits."""
    m = len(ctx.modules)
    allowed_from = [allowed.copy() for _ in range(m)]
    ctx.prefetch(allowed, batch)
    prefix: list[subsolve.SubSolution] = []
    prefix_cost, start, init = 0.0, 0, {None: 0.0}
    for _ in range(ctx.problem.num_devices + 1):
        sols, total = _searched_dp(ctx, start, allowed_from, batch, init)
        if not sols:
            return None
        chain = prefix + sols
        over = _first_overflow(ctx, chain, batch)
        if over is None:
            return chain, prefix_cost + total
        j, device = over
        log.info("milp-split: device %s overflows at module %d; closing it for the rest of the chain", ctx.problem.devices[device].name, j)
        prefix = chain[:j]
        prefix_cost = sum(s.cost_s for s in prefix)
        for jj in range(j, m):
            allowed_from[jj][device] = False
        start = j
        init = {prefix[-1].devices[-1]: 0.0} if prefix else {None: 0.0}
    return None


def _least_chain(ctx: SplitContext, step) -> float:
    """min over device paths of the sum over modules of step(j, input devices) -> (output
    devices, [inputs, outputs] matrix of module j's costs)."""
    inputs: list[int | None] = [None]
    best = np.zeros(1)
    for j, module in enumerate(ctx.modules):
        if module.input_task is None:
            inputs, best = [None], np.zeros(1)
        outs, cost = step(j, inputs)
        total = best[:, None] + cost
        inputs, best = list(outs), total.min(axis=0)
    return float(best.min()) if len(best) else 0.0


def chain_bound(ctx: SplitContext, batch: int) -> float:
    """min over device paths of the sum of per-module lower bounds (one shard)."""
    allowed = np.ones(ctx.problem.num_devices, dtype=bool)

    def step(j: int, inputs: list[int | None]) -> tuple[list[int], np.ndarray]:
        table = ctx.costs(j, allowed, batch, inputs)
        return table.outs, table.bound

    return _least_chain(ctx, step)


def shard_chain_bound(ctx: SplitContext, floor: float = 0.0) -> float:
    """A latency bound for a batch that may be split: min over s of
    max(chain(ceil(Q / s)), LP(s)), with LP(s) the shard-count bound's load LP
    (solve/bounds.py) and chain(b) the DP over per-module bounds at b samples.

    Valid: a plan of s non-empty shards has a largest shard of b >= ceil(Q / s)
    samples, which is a one-shard plan of its own (the other shards only take device
    time and memory), obeys the module cuts and so spans at least the sum of its
    modules' least spans at b, each at least its bound at ceil(Q / s) (times,
    transfers and memory do not fall with more samples). The plan is also at least
    LP(s). An s whose LP(s) is already above the least value found cannot lower the
    minimum, and its chain is not computed; once the least value found is at most
    `floor` (a bound the caller has already), the search stops; the result is never below `floor`.
    Chains are computed at MAX_CHAIN_BATCHES batch sizes at most; the s left then
    count with LP(s) alone.
    """
    from llm_planner.solve.bounds import shard_lp_bound

    p = ctx.problem
    most = min(p.batch_size, p.max_shards)
    load = {s: shard_lp_bound(p, s) for s in range(1, most + 1)}
    best = INF
    for s in sorted(load, key=load.get):
        if load[s] >= best:
            break  # sorted: every later s has a larger LP(s) too
        b = math.ceil(p.batch_size / s)
        if b not in ctx.chain_bounds and len(ctx.chain_bounds) >= MAX_CHAIN_BATCHES:
            best = min(best, load[s])  # this s and every later one are at least LP(s)
            break
        best = min(best, max(load[s], module_chain_bound(ctx, b)))
        if best <= floor:
            return floor
    return max(best, floor)


def module_chain_bound(ctx: SplitContext, batch: int) -> float:
    """min over device paths of the sum of module bounds for one shard of `batch` samples:
    one-task modules in closed form, larger ones by solve.bounds.lower_bound of the module
    subproblem with its cuts pinned (split_subsolve.module_bound), one per module structure
    and (input, output) device pair up to the cluster's symmetries, solved in the pool."""
    if batch in ctx.chain_bounds:
        return ctx.chain_bounds[batch]
    p = ctx.problem
    allowed = np.ones(p.num_devices, dtype=bool)

    def key(j: int, k: int | None, l: int) -> tuple:
        return (ctx.modules[j].signature, subsolve.pair_key(p, ctx.classes, k, l), batch)

    calls = {}
    for j, module in enumerate(ctx.modules):
        if len(module.tasks) > 1:
            for k in [None] if module.input_task is None else ctx._outs(j - 1, allowed):
                for l in ctx._outs(j, allowed):
                    pair = key(j, k, l)
                    if pair not in ctx.module_bounds and pair not in calls:
                        calls[pair] = (subsolve.module_bound, (module, k, l, batch), {})
    ctx.module_bounds.update(subsolve.run_many(p, calls, ctx.options, ctx.pool))

    def step(j: int, inputs: list[int | None]) -> tuple[list[int], np.ndarray]:
        module, outs = ctx.modules[j], ctx._outs(j, allowed)
        if len(module.tasks) == 1:
            return outs, ctx._one_task_costs(module, inputs, outs, batch)
        return outs, np.array([[ctx.module_bounds[key(j, k, l)] for l in outs] for k in inputs]).reshape(len(inputs), len(outs))

    ctx.chain_bounds[batch] = _least_chain(ctx, step)
    return ctx.chain_bounds[batch]


def assemble(ctx: SplitContext, sols: list[subsolve.SubSolution]) -> tuple[list[int], dict[int, list[tuple[int, int]]]]:
    """Global assignment and device orders (shard 0) of a chain of module solutions."""
    assign = [-1] * ctx.problem.num_tasks
    orders: dict[int, list[tuple[int, int]]] = {}
    for module, sol in zip(ctx.modules, sols):
        for pos, d in enumerate(sol.devices):
            assign[module.tasks[pos]] = d
        for pos in sol.order:
            orders.setdefault(sol.devices[pos], []).append((0, module.tasks[pos]))
    assert min(assign) >= 0, "a task left unassigned by the split"
    return assign, orders


def seed_from_plan(ctx: SplitContext, plan: Plan) -> None:
    """Offer each multi-task module's part of a one-shard plan (a baseline's) to the DP.

    Modules never overlap in time (every task of module j runs after cut c_{j-1} and
    before c_j finishes), so the part of module j spans finish(c_j) - finish(c_{j-1})
    in that plan, for its devices of c_{j-1} and c_j. The DP then mixes these parts
    with the subproblems' solutions, module by module, and cannot end above the plan
    where memory does not bind.
    """
    if len(plan.shard_sizes) != 1:
        return
    p = ctx.problem
    index = {t.name: i for i, t in enumerate(p.graph.tasks)}
    dev = {name: k for k, name in enumerate(p.device_names)}
    assign = [dev[plan.shard_assignments[0][t.name]] for t in p.graph.tasks]
    start, finish = {}, {}
    for st in plan.schedule:
        start[index[st.task]], finish[index[st.task]] = st.start_s, st.finish_s
    for j, module in enumerate(ctx.modules):
        if len(module.tasks) == 1:
            continue
        k = assign[module.input_task] if module.input_task is not None else None
        l = assign[module.tasks[-1]]
        span = finish[module.tasks[-1]] - (finish[module.input_task] if module.input_task is not None else 0.0)
        order = sorted(range(len(module.tasks)), key=lambda n: (start[module.tasks[n]], finish[module.tasks[n]], n))
        ctx.seeds[(j, k, l)] = subsolve.seeded_solution(p, module, k, l, p.batch_size, [assign[t] for t in module.tasks], order, span)


def one_shard_plan(ctx: SplitContext, started: float) -> Plan | None:
    """The DP's chain for the whole batch on every device, as a plan (None if nothing fits)."""
    p = ctx.problem
    found = latency_chain(ctx, p.batch_size, np.ones(p.num_devices, dtype=bool))
    if found is None:
        return None
    assign, orders = assemble(ctx, found[0])
    return make_plan(p, [p.batch_size], [assign], solver="milp-split", status="heuristic", started_at=started, lower_bound_s=0.0,
                     device_orders=orders)


def solve_split(problem: PlacementProblem, options: SolveOptions) -> Plan:
    """MILP-SPLIT for both objectives; see the module docstring."""
    started = time.perf_counter()
    with SplitContext(problem, options) as ctx:
        return _split_plan(ctx, started)


def _split_plan(ctx: SplitContext, started: float) -> Plan:
    """solve_split's work, with the context's pool open."""
    from llm_planner.solve.baseline_set import all_baselines
    from llm_planner.solve.bounds import lower_bound
    from llm_planner.solve.split_groups import data_parallel_plans
    from llm_planner.solve.split_loads import improve_loads
    from llm_planner.solve.split_pipeline import pipelined_plans, replicated_plans
    from llm_planner.solve.split_throughput import throughput_plan

    problem, options = ctx.problem, ctx.options
    candidates: list[Plan] = []
    details = {"modules": len(ctx.modules), "distinct_modules": len({m.signature for m in ctx.modules})}
    baselines = [b for b in all_baselines(problem).values() if b is not None]
    baseline = min(baselines, key=lambda b: b.objective_s, default=None)
    bound = lower_bound(problem) if options.bound else 0.0
    if baseline is not None and baseline.objective_s <= bound * (1 + options.rel_gap):
        # nothing can beat it by more than rel_gap: no module needs solving
        details.update(baseline_won=baseline.solver.name, stopped="the best baseline meets the lower bound")
        return _finish(problem, options, baseline, bound, details, started)
    if problem.objective == "latency":
        one_shard = [b for b in baselines if len(b.shard_sizes) == 1]
        if one_shard:
            seed_from_plan(ctx, min(one_shard, key=lambda b: b.objective_s))
        chains = [one_shard_plan(ctx, started)] + data_parallel_plans(ctx, started)
        chains = [c for c in chains if c is not None]
        if chains:
            # the iterated local search, for the chain of the best candidate only: it is what the plan will be
            ctx.search = True
            best = min(chains, key=lambda c: c.objective_s)
            groups = len(best.shard_sizes)
            chains += [one_shard_plan(ctx, started)] if groups == 1 else data_parallel_plans(ctx, started, only=groups)
            ctx.search = False
            candidates += [c for c in chains if c is not None]
        candidates += pipelined_plans(ctx, started)
        candidates += replicated_plans(problem, _one_shard_bases(problem, candidates, baselines), started)
    else:
        candidates += throughput_plan(ctx, started)
        # moves between devices, from the best stage plan and from the best baseline (split_loads)
        starts = [min(found, key=lambda c: c.objective_s) for found in (candidates, baselines) if found]
        candidates += [better for plan in starts if (better := improve_loads(problem, plan, started)) is not None]
    if not options.bound:
        pass
    elif ctx.wants_chain_bound:
        bound = max(bound, chain_bound(ctx, problem.batch_size))
    elif problem.objective == "latency":
        bound = max(bound, shard_chain_bound(ctx, bound))
    details.update(
        subproblems_requested=ctx.num_requested,
        subproblems_solved=sum(1 for s in ctx.cache.values() if s.method not in ("closed-form", "infeasible")),
        subproblems_closed_form=sum(1 for s in ctx.cache.values() if s.method == "closed-form"),
        subproblems_not_optimal=sum(1 for s in ctx.cache.values() if s.method not in ("closed-form", "milp-optimal", "infeasible")),
    )
    if not candidates and baseline is None:
        from llm_planner.solve.errors import SolveError
        from llm_planner.solve.baselines import infeasibility_reason

        raise SolveError(f"milp-split found no plan that fits in memory: {infeasibility_reason(problem)}")
    best = min(candidates, key=lambda p: p.objective_s) if candidates else None
    if best is None or (baseline is not None and baseline.objective_s < best.objective_s * (1 - 1e-12)):
        details["baseline_won"] = baseline.solver.name
        best = baseline
    return _finish(problem, options, best, bound, details, started)


def _one_shard_bases(problem: PlacementProblem, candidates: list[Plan], baselines: list[Plan]) -> list[list[int]]:
    """The assignments of the best one-shard plan among the candidates and among the baselines
    (split_pipeline.replicated_plans pipelines micro-batches over them)."""
    index = {name: k for k, name in enumerate(problem.device_names)}
    bases = []
    for plans in (candidates, baselines):
        one = [c for c in plans if len(c.shard_sizes) == 1]
        if one:
            best = min(one, key=lambda c: c.objective_s)
            base = [index[best.assignment[t.name]] for t in problem.graph.tasks]
            if base not in bases:
                bases.append(base)
    return bases


def _finish(problem: PlacementProblem, options: SolveOptions, best: Plan, bound: float, details: dict, started: float) -> Plan:
    """The plan as MILP-SPLIT's: its bound, status and solver details."""
    elapsed = time.perf_counter() - started
    status = "optimal" if best.objective_s <= bound * (1 + options.rel_gap) else "heuristic"
    return replace(
        best,
        lower_bound_s=float(min(bound, best.objective_s) if best.objective_s >= bound * (1 - 1e-9) else bound),
        solver=replace(best.solver, name="milp-split", status=status, time_s=elapsed, backend=options.backend, details=details),
    )
