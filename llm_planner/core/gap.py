"""The gap between a plan's objective and its bound, and the status that gap supports: one rule for
every planner and verifier.

    minimise (placement: seconds, against a lower bound):   gap = (value - bound) / value   (0 for value <= 0)
    maximise (serving: tokens/s, against an upper bound):   gap = 1 - value / bound         (1 for bound <= 0)

both at least 0: the share of the objective the bound still leaves open, as MILP solvers state
theirs. A plan is `optimal` when its gap is within the relative gap it was solved to, `heuristic`
otherwise (a solver may say more of its own plans: placement.session).

The tolerance, once: a placement solve stops at `--gap` (DEFAULT_REL_GAP, 1e-4, the MIP gap of the
solver; the plan records it as inputs.options.rel_gap and `verify` judges `optimal` against that);
the serving planner has no solver gap to choose, so it calls a plan optimal only when it meets its
bound to rounding (SERVING_REL_GAP, 1e-6).
"""

from __future__ import annotations

DEFAULT_REL_GAP = 1e-4  # a placement solve's relative gap unless --gap says otherwise
SERVING_REL_GAP = 1e-6  # a serving plan within this share of its upper bound is optimal


def gap(value: float, bound: float, *, maximize: bool) -> float:
    """The relative gap of `value` to `bound` (module docstring)."""
    if maximize:
        return max(0.0, 1.0 - value / bound) if bound > 0 else 1.0
    if value <= 0:
        return 0.0
    return max(0.0, (value - bound) / value)


def status(gap_value: float, rel_gap: float) -> str:
    """ "optimal" when the gap is within `rel_gap`, "heuristic" otherwise."""
    return "optimal" if gap_value <= rel_gap else "heuristic"


def proven(value: float, bound: float, rel_gap: float, *, maximize: bool = False) -> bool:
    """Whether `bound` proves `value` optimal within the relative gap `rel_gap`."""
    return status(gap(value, bound, maximize=maximize), rel_gap) == "optimal"
