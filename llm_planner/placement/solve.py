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

The baselines, the bound and that status are computed once per solve, in a
`solve.session.SolveSession`, which a caller may pass in to show the same
baselines beside the plan.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from llm_planner.core.plan import Plan
from llm_planner.placement.baselines.baseline_set import ALL_BASELINES
from llm_planner.placement.errors import SolveError, VerificationError
from llm_planner.placement.fit import infeasibility_reason
from llm_planner.placement.milp.milp import solve_milp
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.session import SolveSession
from llm_planner.placement.split.tp import solve_split_tp
from llm_planner.placement.verify import verify_plan

log = logging.getLogger(__name__)

BASELINES = ALL_BASELINES
SOLVERS = ("milp", "milp-split", "best-baseline", *BASELINES)


def solve(problem: PlacementProblem, options: SolveOptions | None = None, session: SolveSession | None = None) -> Plan:
    """The plan of the solver `options.solver` names, judged against the bound verify re-derives
    and verified (module docstring). `session`: the one a caller shares with its table of baselines
    (it must hold this problem); a new one otherwise."""
    session = session or SolveSession(problem, options)
    if session.problem is not problem:
        raise ValueError("solve: the session holds another problem")
    options = session.options
    plan = session.judged(_dispatch(session))
    # the gap a status `optimal` is judged against (verify_fields.check_status)
    plan = replace(plan, inputs=replace(plan.inputs, options={**plan.inputs.options, "rel_gap": options.rel_gap}))
    if options.verify:
        report = verify_plan(plan, problem)
        if not report.ok:
            raise VerificationError(
                f"solver {options.solver!r} returned an invalid plan:\n" + "\n".join(report.violations)
            )
    return plan


def _dispatch(session: SolveSession) -> Plan:
    name, problem = session.options.solver, session.problem
    if name == "milp":
        return solve_milp(problem, session.options, session)
    if name == "milp-split":
        return solve_split_tp(problem, session.options, session)
    if name == "best-baseline":
        plan = session.best_baseline
    elif name in BASELINES:
        plan = session.baseline(name)
    else:
        raise SolveError(f"unknown solver {name!r}; choose one of {', '.join(SOLVERS)}")
    if plan is None:
        reasons = infeasibility_reason(problem)
        raise SolveError(f"solver {name!r} found no feasible plan: {reasons}")
    return plan
