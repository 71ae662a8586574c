"""One solver interface: `solve(problem, options) -> Plan`, solvers chosen by name.

Every plan leaves here with the best lower bound known for the instance (the
solver's own, the critical path and the load-balance LP of solve.bounds), with
the status `optimal` when that bound proves it within the relative gap (a
baseline or heuristic plan included), and,
unless options.verify is off, after the independent verifier accepted it: a
plan that fails verification is a bug and raises.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from llm_planner.plan import Plan
from llm_planner.solve.errors import SolveError, VerificationError
from llm_planner.solve.options import SolveOptions
from llm_planner.solve.problem import PlacementProblem
from llm_planner.solve.schedule import with_bound

log = logging.getLogger(__name__)

BASELINES = ("single-device", "even-split", "memory-greedy", "heft", "data-parallel", "megatron", "tp-replicas")
SOLVERS = ("milp", "milp-split", "best-baseline", *BASELINES)


def solve(problem: PlacementProblem, options: SolveOptions | None = None) -> Plan:
    options = (options or SolveOptions()).check()
    plan = _dispatch(problem, options)
    from llm_planner.solve.bounds.combined import lower_bound

    plan = with_bound(plan, lower_bound(problem))
    # the gap a status `optimal` is judged against (verify_fields.check_status)
    plan = replace(plan, inputs=replace(plan.inputs, options={**plan.inputs.options, "rel_gap": options.rel_gap}))
    if plan.solver.status == "heuristic" and plan.objective_s <= plan.lower_bound_s * (1 + options.rel_gap):
        plan = replace(plan, solver=replace(plan.solver, status="optimal"))  # the bound proves it, within the gap
    if options.verify:
        from llm_planner.verify import verify_plan

        report = verify_plan(plan, problem)
        if not report.ok:
            raise VerificationError(
                f"solver {options.solver!r} returned an invalid plan:\n" + "\n".join(report.violations)
            )
    return plan


def _dispatch(problem: PlacementProblem, options: SolveOptions) -> Plan:
    name = options.solver
    if name == "milp":
        from llm_planner.solve.milp.milp import solve_milp

        return solve_milp(problem, options)
    if name == "milp-split":
        from llm_planner.solve.split.tp import solve_split_tp

        return solve_split_tp(problem, options)
    from llm_planner.solve.baselines import baseline_set
    from llm_planner.solve.fit import infeasibility_reason

    if name == "best-baseline":
        plan = baseline_set.best_of_all(problem)
    elif name in BASELINES:
        plan = baseline_set.run_any_baseline(name, problem)
    else:
        raise SolveError(f"unknown solver {name!r}; choose one of {', '.join(SOLVERS)}")
    if plan is None:
        reasons = infeasibility_reason(problem)
        raise SolveError(f"solver {name!r} found no feasible plan: {reasons}")
    return plan
