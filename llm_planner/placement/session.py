"""One solve of one problem: what the solver, the plan's lower bound and status, and the table of
baselines beside it share, each computed once.

A `plan` command used to run the baselines two or three times (the solver's candidates or warm
start, `best-baseline`, the table) and the lower bound twice (the solver, then `solve.api`), the
second time found in a process-wide cache keyed by the problem's id. A `SolveSession` holds them
instead, for as long as the command holds it:

- `baseline(name)`, `baselines`: each baseline's plan (solve.baselines.baseline_set), run on first use;
- `best_baseline`: the feasible one with the lowest objective (the one answer to "best baseline");
- `bound_s`: bounds.combined.lower_bound, the bound `verify` re-derives, computed on first use;
- `judged(plan)`: the plan with that bound and the status it supports (the one status decision);
- `timings_s`: the seconds the baselines and the bound took, measured where they ran (records the CLI prints).

The gap is the plan file's, llm_planner.core.gap's: (objective - bound) / objective; a plan is proven
optimal when that is within the options' relative gap (`core.gap.proven`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from llm_planner.core.gap import proven
from llm_planner.core.plan import Plan
from llm_planner.placement.baselines.baseline_set import ALL_BASELINES, run_any_baseline
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem


class SolveSession:
    """The baselines, bound and status of one problem under one set of options (module docstring)."""

    def __init__(self, problem: PlacementProblem, options: SolveOptions | None = None):
        self.problem = problem
        self.options = (options or SolveOptions()).check()
        self._baselines: dict[str, Plan | None] = {}
        self._bound_s: float | None = None
        self._lock = threading.Lock()  # split.tp derives the bound in a thread beside its search
        self.timings_s = {"baselines": 0.0, "lower_bound": 0.0}  # wall time of each, where it ran (records)

    def baseline(self, name: str) -> Plan | None:
        """Baseline `name`'s plan (run on first use), or None when it finds none that fits."""
        if name not in self._baselines:
            start = time.perf_counter()
            self._baselines[name] = run_any_baseline(name, self.problem)
            self.timings_s["baselines"] += time.perf_counter() - start
        return self._baselines[name]

    @property
    def baselines(self) -> dict[str, Plan | None]:
        """Every baseline's plan (ALL_BASELINES order), or None for one that finds none that fits."""
        return {name: self.baseline(name) for name in ALL_BASELINES}

    @property
    def best_baseline(self) -> Plan | None:
        """The feasible baseline plan with the lowest objective (the first of equals, in
        ALL_BASELINES order); None when no baseline fits."""
        plans = [p for p in self.baselines.values() if p is not None]
        return min(plans, key=lambda p: p.objective_s, default=None)

    @property
    def bound_s(self) -> float:
        """bounds.combined.lower_bound of the problem: what verify re-derives from the inputs."""
        with self._lock:
            if self._bound_s is None:
                start = time.perf_counter()
                self._bound_s = lower_bound(self.problem)
                self.timings_s["lower_bound"] += time.perf_counter() - start
            return self._bound_s

    def proven(self, objective_s: float, bound_s: float | None = None) -> bool:
        """Whether `bound_s` (default: the session's) proves `objective_s` optimal within the options' gap."""
        return proven(objective_s, self.bound_s if bound_s is None else bound_s, self.options.rel_gap)

    def judged(self, plan: Plan) -> Plan:
        """The plan with the session's bound (what verify re-derives) as its lower bound and the status
        that bound supports; the solver's own bound and status, where they claim more, kept as records:
        `solver.details.solver_bound_s`, and `solver.details.solver_status: optimal` when only the
        solver's bound proves it (its status becomes `feasible`)."""
        bound_s = self.bound_s
        details = dict(plan.solver.details)
        if plan.lower_bound_s > bound_s * (1 + 1e-9):
            details["solver_bound_s"] = float(plan.lower_bound_s)
        status = plan.solver.status
        if self.proven(plan.objective_s):
            if status in ("heuristic", "time_limit", "interrupted"):
                if status != "heuristic":
                    details["proven_by"] = "lower bound"  # the solver stopped short; the bound proves it
                status = "optimal"
        elif status == "optimal":
            details["solver_status"] = "optimal"  # proven by the solver's own bound only: not re-derivable
            status = "feasible"
        return replace(
            plan,
            lower_bound_s=float(min(bound_s, plan.objective_s)),
            solver=replace(plan.solver, status=status, details=details),
        )
