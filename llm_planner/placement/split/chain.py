"""MILP-SPLIT's dynamic program over the chain of modules (latency; the math is in
solve/split/split.py): the least chain of module spans, its repair where memory
overflows, the chain bounds, and the plan it gives.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.placement.bounds.load import shard_lp_bound
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.split import subsolve
from llm_planner.placement.split.pool import run_many
from llm_planner.placement.split.split_context import INF, CostTable, SplitContext

log = logging.getLogger(__name__)

INTENSIFY_ROUNDS = 2  # DP -> search the picked modules -> DP, at most this many times per chain
MAX_CHAIN_BATCHES = 4  # shard_chain_bound computes module chains at this many batch sizes at most


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


def _searched_dp(
    ctx: SplitContext, start: int, allowed_from: list[np.ndarray], batch: int, init: dict[int | None, float]
):
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
    each = p.task_memory_bytes(batch)
    for j, sol in enumerate(sols):
        for pos, d in enumerate(sol.devices):
            t = ctx.modules[j].tasks[pos]
            if p.mem_counts[t, d]:
                used[d] += each[t]
        over = np.nonzero(used > p.mem_capacity * (1 + 1e-12))[0]
        if len(over):
            return j, int(over[0])
    return None


def latency_chain(
    ctx: SplitContext, batch: int, allowed: np.ndarray
) -> tuple[list[subsolve.SubSolution], float] | None:
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
        log.info(
            "milp-split: device %s overflows at module %d; closing it for the rest of the chain",
            ctx.problem.devices[device].name,
            j,
        )
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
    (bounds/load.py) and chain(b) the DP over per-module bounds at b samples.

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
    one-task modules in closed form, larger ones by bounds.combined.lower_bound of the module
    subproblem with its cuts pinned (split.subsolve.module_bound), one per module structure
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
    ctx.module_bounds.update(run_many(p, calls, ctx.options, ctx.pool))

    def step(j: int, inputs: list[int | None]) -> tuple[list[int], np.ndarray]:
        module, outs = ctx.modules[j], ctx._outs(j, allowed)
        if len(module.tasks) == 1:
            return outs, ctx._one_task_costs(module, inputs, outs, batch)
        return outs, np.array([[ctx.module_bounds[key(j, k, l)] for l in outs] for k in inputs]).reshape(
            len(inputs), len(outs)
        )

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
        ctx.seeds[(j, k, l)] = subsolve.seeded_solution(
            p, module, k, l, p.batch_size, [assign[t] for t in module.tasks], order, span
        )


def one_shard_plan(ctx: SplitContext, started: float) -> Plan | None:
    """The DP's chain for the whole batch on every device, as a plan (None if nothing fits)."""
    p = ctx.problem
    found = latency_chain(ctx, p.batch_size, np.ones(p.num_devices, dtype=bool))
    if found is None:
        return None
    assign, orders = assemble(ctx, found[0])
    return make_plan(
        p,
        [p.batch_size],
        [assign],
        solver="milp-split",
        status="heuristic",
        started_at=started,
        lower_bound_s=0.0,
        device_orders=orders,
    )
