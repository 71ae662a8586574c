"""A plan file checked on its own (`llm-planner verify`, and `launch` before it starts anything).

The file is read (llm_planner.core.plan.load_plan), its problem rebuilt from the recorded inputs
through the same builders as `plan` (llm_planner.placement.inputs), then checked by
llm_planner.placement.verify (the plan against its problem) and llm_planner.placement.verify_fields (the file's
fields: recorded inputs, bound, gap and status). The loading lives here, above the checks, so
that the solvers, which verify every plan they return, never reach a file loader.

Errors in reading the inputs (PlanError, InputError, SpecError, GraphError, ProblemError: all
ValueError) propagate: "the plan is wrong" (a report with ok False) and "the plan cannot be
checked" (an exception whose message names the file and field) stay distinct; the CLI prints
either.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llm_planner.core.plan import Plan, PlanError, load_plan
from llm_planner.placement.inputs import problem_from_plan_inputs
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.verify import VerifyReport, verify_plan
from llm_planner.placement.verify_fields import check_file_fields, check_groups_formable


def rebuild_problem(plan: Plan, source: str, *, check_hashes: bool) -> PlacementProblem:
    """The problem the plan's inputs describe; PlanError for inputs of a kind no problem is built from."""
    try:
        return problem_from_plan_inputs(plan.inputs, check_hashes=check_hashes)
    except ValueError as exc:  # the input errors (SpecError, GraphError, InputError, ...): say which plan's inputs
        raise PlanError(f"{source}: inputs: {exc}") from None
    except (TypeError, AttributeError) as exc:  # a value that passed the type check of its field but not its use
        raise PlanError(f"{source}: inputs: no problem can be built from these inputs ({exc})") from None


def verify_plan_file(path: str | Path, *, rel_tol: float = 1e-6, check_hashes: bool = True) -> VerifyReport:
    """Load a plan file, rebuild its problem from the recorded inputs and verify it, with the
    file-level checks of llm_planner.placement.verify_fields (the solver's status against the gap).

    Input errors propagate (see the module docstring).
    """
    plan = load_plan(path)
    problem = rebuild_problem(plan, str(path), check_hashes=check_hashes)
    check_groups_formable(plan, problem, str(path))
    report = verify_plan(plan, problem, rel_tol=rel_tol)
    violations = (*report.violations, *check_file_fields(plan, problem, rel_tol=rel_tol))
    return dataclasses.replace(report, ok=not violations, violations=violations)
