"""Every baseline a plan is compared with: the single-device layouts of solve/baselines/single.py
and, on a problem with tensor-parallel groups, the layouts of solve/baselines/tensor_parallel.py.
A solve runs them once, in its session (solve.session: `baselines`, `best_baseline`)."""

from __future__ import annotations

from llm_planner.core.plan import Plan
from llm_planner.placement.baselines.single import BASELINE_NAMES, run_baseline
from llm_planner.placement.baselines.tensor_parallel import TP_BASELINES, run_tp_baseline
from llm_planner.placement.problem import PlacementProblem

ALL_BASELINES = BASELINE_NAMES + TP_BASELINES


def run_any_baseline(name: str, problem: PlacementProblem) -> Plan | None:
    """The plan of baseline `name`, or None when it finds none that fits."""
    if name in TP_BASELINES:
        return run_tp_baseline(name, problem)
    return run_baseline(name, problem)
