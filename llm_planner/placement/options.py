"""Solver options: one typed dataclass for every solver and backend."""

from __future__ import annotations

from dataclasses import dataclass

from llm_planner.core.gap import DEFAULT_REL_GAP

SYMMETRY_CHOICES = ("none", "batch", "task", "time", "first", "solver")


CONTIGUOUS_SOLVERS = ("milp",)  # the solver that applies --contiguous (a row of its MILP)


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    solver: str = "heft"  # "milp", "milp-split", or a baseline name (see solve.api.SOLVERS)
    backend: str = "highs"  # MILP backend: "highs" (default, no licence) or "gurobi"
    allow_backend_fallback: bool = False  # gurobi unusable (licence) -> use highs instead of failing
    time_limit_s: float = 60.0  # wall-clock limit of one MILP solve
    rel_gap: float = DEFAULT_REL_GAP  # stop when (incumbent - bound) / incumbent <= rel_gap
    threads: int = 0  # solver threads; 0 = the backend's default
    seed: int = 0  # solver random seed
    symmetry: str = "solver"  # symmetry breaking: one of SYMMETRY_CHOICES; "solver" = the backend's own detection
    contiguous: bool = False  # throughput: each device's task set is contiguous
    workers: int = 0  # MILP-SPLIT: processes for subproblems; 0 = all cores
    max_module_tasks: int = (
        20  # MILP-SPLIT: larger modules are planned by HEFT + local search instead of the exact MILP
    )
    verify: bool = True  # run the independent verifier on the plan before returning it
    bound: bool = True  # MILP-SPLIT: compute its own lower bound (the layout search of split.tp solves without)

    def check(self) -> "SolveOptions":
        if self.symmetry not in SYMMETRY_CHOICES:
            raise ValueError(f"symmetry must be one of {SYMMETRY_CHOICES}, got {self.symmetry!r}")
        if self.backend not in ("highs", "gurobi"):
            raise ValueError(f"backend must be 'highs' or 'gurobi', got {self.backend!r}")
        if self.time_limit_s <= 0:
            raise ValueError(f"time limit must be > 0 s, got {self.time_limit_s}")
        if not 0 <= self.rel_gap < 1:
            raise ValueError(f"relative gap must be in [0, 1), got {self.rel_gap}")
        if self.contiguous and self.solver not in CONTIGUOUS_SOLVERS:
            raise ValueError(
                f"--contiguous: solver {self.solver!r} does not keep each device's tasks contiguous; "
                f"use --solver {' or '.join(CONTIGUOUS_SOLVERS)}"
            )
        return self
