"""One solver interface: `solve(problem, options) -> Plan`, solvers chosen by name.

Every plan leaves here with the lower bound that `verify` re-derives from the
plan's inputs alone (bounds.combined.lower_bound: deterministic LPs, no
time limit), with the status `optimal` only when that bound proves it within the
relative gap (a baseline or heuristic plan included), and, unless options.verify
is off, after the independent verifier accepted it: a plan that fails
verification is a bug and raises.

A solver's own stronger bound (the MILP's dual bound, MILP-SPLIT's chain bound)
depends on its search and time limit, so `verify` cannot redo it: it is kept as a
record, `solver.details.solver_bound_s`, and a status `optimal` that only it
proves becomes `feasible`, with `solver.details.solver_status: optimal`.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from llm_planner.plan import Plan
from llm_planner.problem.options import SolveOptions
from llm_planner.problem.placement import PlacementProblem
from llm_planner.solve.errors import SolveError, VerificationError

log = logging.getLogger(__name__)

BASELINES = ("single-device", "even-split", "memory-greedy", "heft", "data-parallel", "megatron", "tp-replicas")
SOLVERS = ("milp", "milp-split", "best-baseline", *BASELINES)


def solve(problem: PlacementProblem, options: SolveOptions | None = None) -> Plan:
    options = (options or SolveOptions()).check()
    plan = _dispatch(problem, options)
    from llm_planner.bounds.combined import lower_bound

    plan = verifiable_bound(plan, lower_bound(problem), options.rel_gap)
    # the gap a status `optimal` is judged against (verify_fields.check_status)
    plan = replace(plan, inputs=replace(plan.inputs, options={**plan.inputs.options, "rel_gap": options.rel_gap}))
    if options.verify:
        from llm_planner.verify import verify_plan

        report = verify_plan(plan, problem)
        if not report.ok:
            raise VerificationError(
                f"solver {options.solver!r} returned an invalid plan:\n" + "\n".join(report.violations)
            )
    return plan


def verifiable_bound(plan: Plan, bound_s: float, rel_gap: float) -> Plan:
    """The plan with `bound_s` (what verify re-derives) as its lower bound and the status that
    bound supports; the solver's own bound and status, where they claim more, kept as records."""
    details = dict(plan.solver.details)
    if plan.lower_bound_s > bound_s * (1 + 1e-9):
        details["solver_bound_s"] = float(plan.lower_bound_s)
    proven = plan.objective_s <= bound_s * (1 + rel_gap)
    status = plan.solver.status
    if proven and status == "heuristic":
        status = "optimal"  # the bound proves it, within the gap
    elif not proven and status == "optimal":
        details["solver_status"] = "optimal"  # proven by the solver's own bound only: not re-derivable
        status = "feasible"
    return replace(
        plan,
        lower_bound_s=float(min(bound_s, plan.objective_s)),
        solver=replace(plan.solver, status=status, details=details),
    )


def _dispatch(problem: PlacementProblem, options: SolveOptions) -> Plan:
    name = options.solver
    if name == "milp":
        from llm_planner.solve.milp.milp import solve_milp

        return solve_milp(problem, options)
    if name == "milp-split":
        from llm_planner.solve.split.tp import solve_split_tp

        return solve_split_tp(problem, options)
    from llm_planner.problem.fit import infeasibility_reason
    from llm_planner.solve.baselines import baseline_set

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
