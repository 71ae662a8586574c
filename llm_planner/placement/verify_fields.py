"""File-level checks of a plan file, beside llm_planner.placement.verify's checks of the plan against its problem.

What `verify PLAN` checks, field by field (docs/plan-format.md has the table):
  - reading (llm_planner.core.plan.load_plan): UTF-8, no duplicate keys, every field
    present, of its type and finite, no unknown field; the derived fields
    `gap`, `throughput_samples_per_s`, `batches_in_flight` (throughput),
    `batch_size`, `assignment` (shard 0's) and `device_order` (the schedule's
    order) equal to what the others give;
    a failure is bad input (PlanError: exit 2, the file and the field named);
  - `inputs`: the problem is rebuilt from them (hashes of the cluster, graph and
    profile compared), and every recorded input equals what the rebuilt problem
    records (`dtype`, `max_tp`, `max_shards`, ...): llm_planner.placement.verify_file
    rebuilds it, `check_inputs` here compares;
  - every primary number (`objective_s`, `lower_bound_s`, `max_load_s`, shard
    sizes, the schedule's times) against the problem: llm_planner.placement.verify;
  - `lower_bound_s`, `gap` and `solver.status` against the bound re-derived here
    (bounds.combined.lower_bound of the rebuilt problem, the planner's own
    deterministic procedure): the claimed bound at most the re-derived one, the gap
    at least what it leaves, `optimal` only when it proves the objective within the
    relative gap the plan was solved to (`inputs.options.rel_gap`, else the
    default): `check_bound` and `check_status` here.

Not re-derivable, and so checked for type and finiteness only: `solver.name`,
`solver.backend`, `solver.time_s`, `solver.details` (a solver's own dual bound
included: `solver_bound_s`, a record, never a proof), `inputs.options`.
"""

from __future__ import annotations

import dataclasses
import math

from llm_planner.core.gap import gap
from llm_planner.core.plan import Plan, PlanError, PlanInputs
from llm_planner.core.tensor_groups import GroupError, group_from_members, is_group_name, member_names
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem

# hashes are compared (with their own messages) by problem_inputs.problem_from_plan_inputs; options are a record
_NOT_COMPARED = ("options", "cluster_sha256", "graph_sha256", "profile_sha256", "model_file_sha256")


def check_inputs(plan: Plan, problem: PlacementProblem) -> list[str]:
    """Every recorded input equals the rebuilt problem's own record of it."""
    if problem.inputs is None:
        return []
    out = []
    for f in dataclasses.fields(PlanInputs):
        got, want = getattr(plan.inputs, f.name), getattr(problem.inputs, f.name)
        if f.name not in _NOT_COMPARED and got != want:
            out.append(f"inputs.{f.name}: the plan records {got!r}, but its inputs rebuild a problem with {want!r}")
    return out


def rederived_bound(plan: Plan, problem: PlacementProblem) -> float | None:
    """The bound verify re-derives (bounds.combined.lower_bound of the rebuilt problem, the
    planner's own deterministic procedure); None when the plan's objective is not one to bound
    (llm_planner.placement.verify names those)."""
    if plan.objective != problem.objective or not (math.isfinite(plan.objective_s) and plan.objective_s > 0):
        return None
    return lower_bound(problem)


def check_bound(plan: Plan, bound: float | None, *, rel_tol: float) -> list[str]:
    """`lower_bound_s` and `gap` against the re-derived `bound`: a bound is accepted only up to what
    the planner's deterministic procedure gives for these inputs (a solver's own dual bound, which
    depends on its search and time limit, cannot be re-derived and so proves nothing here)."""
    if bound is None:
        return []
    out = []
    if plan.lower_bound_s > bound * (1 + rel_tol) + 1e-15:
        out.append(
            f"lower_bound_s: the plan claims {plan.lower_bound_s:.6g} s, above the bound {bound:.6g} s that verify "
            "re-derives from its inputs (bounds.combined.lower_bound); a bound is accepted only up to that"
        )
    supported = gap(plan.objective_s, bound, maximize=False)
    if plan.gap < supported - rel_tol:
        out.append(
            f"gap: the plan claims {plan.gap:.4%}, but the bound verify re-derives ({bound:.6g} s) "
            f"proves only a gap of {supported:.4%}"
        )
    return out


def check_status(plan: Plan, bound: float | None, *, rel_tol: float) -> list[str]:
    """`optimal` is a claim about the gap: the re-derived `bound` proves the objective within the
    relative gap the plan was solved to."""
    if plan.solver.status != "optimal":
        return []
    rel_gap = plan.inputs.options.get("rel_gap", SolveOptions().rel_gap)
    if isinstance(rel_gap, bool) or not isinstance(rel_gap, (int, float)) or not 0 <= rel_gap < 1:
        return [f"inputs.options.rel_gap is {rel_gap!r}; a status `optimal` needs a relative gap in [0, 1)"]
    proven = plan.gap if bound is None else max(plan.gap, gap(plan.objective_s, bound, maximize=False))
    if proven > rel_gap * (1 + rel_tol) + rel_tol:
        return [
            f"solver.status: the plan claims `optimal`, but the gap its bound proves, {proven:.4%}, exceeds the "
            f"relative gap {rel_gap:.4%} it was solved to (inputs.options.rel_gap)"
        ]
    return []


def check_file_fields(plan: Plan, problem: PlacementProblem, *, rel_tol: float) -> list[str]:
    bound = rederived_bound(plan, problem)  # the costly part of verify: once
    out = check_inputs(plan, problem) + check_bound(plan, bound, rel_tol=rel_tol)
    out += check_status(plan, bound, rel_tol=rel_tol)
    if not (math.isfinite(plan.solver.time_s) and plan.solver.time_s >= 0):
        out.append(f"solver.time_s is {plan.solver.time_s}; it must be a finite number >= 0")
    return out


def check_groups_formable(plan: Plan, problem: PlacementProblem, source: str) -> None:
    """PlanError (bad input, not a wrong plan) for a group in the file that the cluster cannot form."""

    known = set(problem.device_names)
    for s, assignment in enumerate(plan.shard_assignments):
        for task, device in assignment.items():
            if is_group_name(device) and device not in known:
                try:
                    group_from_members(problem.cluster, member_names(device))
                except GroupError as exc:
                    raise PlanError(f"{source}: shards[{s}].assignment.{task}: {device!r}: {exc}") from None
                raise PlanError(
                    f"{source}: shards[{s}].assignment.{task}: group {member_names(device)} is larger than the "
                    f"plan's inputs.max_tp ({problem.max_tp}) or runs none of the model's tasks"
                )
