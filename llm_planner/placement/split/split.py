"""MILP-SPLIT: cut the graph into a chain of modules, solve each module exactly, join by DP.

Latency. Let modules M_1..M_m end at the cut tasks c_1..c_m (solve/split/modules.py).
Every task of M_j runs after c_{j-1} finishes and before c_j finishes, and the
tasks of different modules never overlap in time, so for a single shard

    latency = sum_j span_j,   span_j = finish(c_j) - finish(c_{j-1}).

For each module and pair (k = device of c_{j-1}, l = device of c_j) the exact
MILP gives the least span A_j(k, l) (solve/split/subsolve.py) and a dual bound
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
solve/split/throughput.py; single tasks then move between devices from the
best such plan and from the best baseline (solve/split/loads.py). Every candidate keeps
the memory of the batches its steady state has in flight (problem/fit.py).

The plan returned is never worse than the best baseline: when a baseline wins,
its plan is returned with solver details saying so.

The pieces: modules.py cuts the graph, subproblem.py and subsolve.py solve a module
for a device pair (pool.py spreads them over processes, moves.py searches them
further), context.py keeps their cost tables, chain.py joins them by the DP,
groups.py, pipeline.py, throughput.py and loads.py build the other candidate plans,
and tp.py adds the tensor-parallel groups on top of this module's `solve_split`.
"""

from __future__ import annotations

import time
from dataclasses import replace

from llm_planner.core.gap import gap, proven
from llm_planner.core.gap import status as gap_status
from llm_planner.core.plan import Plan
from llm_planner.placement.errors import SolveError
from llm_planner.placement.fit import fits_steady_state, infeasibility_reason
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.session import SolveSession
from llm_planner.placement.split.chain import chain_bound, one_shard_plan, seed_from_plan, shard_chain_bound
from llm_planner.placement.split.data_parallel import data_parallel_plans
from llm_planner.placement.split.loads import improve_loads
from llm_planner.placement.split.pipeline_parallel import pipelined_plans, replicated_plans
from llm_planner.placement.split.split_context import SplitContext
from llm_planner.placement.split.throughput import throughput_plan


def solve_split(problem: PlacementProblem, options: SolveOptions, session: SolveSession | None = None) -> Plan:
    """MILP-SPLIT for both objectives; see the module docstring. `session`: the problem's baselines
    and bound, computed once (solve.session); a new one otherwise."""
    started = time.perf_counter()
    session = session or SolveSession(problem, options)
    with SplitContext(problem, options) as ctx:
        return _split_plan(ctx, session, started)


def _split_plan(ctx: SplitContext, session: SolveSession, started: float) -> Plan:
    """solve_split's work, with the context's pool open."""
    problem, options = ctx.problem, ctx.options
    candidates: list[Plan] = []
    details = {"modules": len(ctx.modules), "distinct_modules": len({m.signature for m in ctx.modules})}
    baselines = [b for b in session.baselines.values() if b is not None]
    baseline = session.best_baseline
    bound = session.bound_s if options.bound else 0.0
    if baseline is not None and proven(baseline.objective_s, bound, options.rel_gap):
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
        # moves between devices, from the best stage plan and from the best baseline (split.loads)
        starts = [min(found, key=lambda c: c.objective_s) for found in (candidates, baselines) if found]
        candidates += [better for plan in starts if (better := improve_loads(problem, plan, started)) is not None]
        candidates = [c for c in candidates if fits_steady_state(problem, c)]  # each is already: a guard (problem.fit)
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
        subproblems_not_optimal=sum(
            1 for s in ctx.cache.values() if s.method not in ("closed-form", "milp-optimal", "infeasible")
        ),
    )
    if not candidates and baseline is None:
        raise SolveError(f"milp-split found no plan that fits: {infeasibility_reason(problem)}")
    best = min(candidates, key=lambda p: p.objective_s) if candidates else None
    if best is None or (baseline is not None and baseline.objective_s < best.objective_s * (1 - 1e-12)):
        details["baseline_won"] = baseline.solver.name
        best = baseline
    return _finish(problem, options, best, bound, details, started)


def _one_shard_bases(problem: PlacementProblem, candidates: list[Plan], baselines: list[Plan]) -> list[list[int]]:
    """The assignments of the best one-shard plan among the candidates and among the baselines
    (split.pipeline_parallel.replicated_plans pipelines micro-batches over them)."""
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


def _finish(
    problem: PlacementProblem, options: SolveOptions, best: Plan, bound: float, details: dict, started: float
) -> Plan:
    """The plan as MILP-SPLIT's: its bound, status and solver details."""
    elapsed = time.perf_counter() - started
    status = gap_status(gap(best.objective_s, bound, maximize=False), options.rel_gap)
    return replace(
        best,
        lower_bound_s=float(min(bound, best.objective_s) if best.objective_s >= bound * (1 - 1e-9) else bound),
        solver=replace(
            best.solver, name="milp-split", status=status, time_s=elapsed, backend=options.backend, details=details
        ),
    )
