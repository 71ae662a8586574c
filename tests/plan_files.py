"""Plan files on disk for the plan-file tests: a diamond graph on a CPU and two GPUs, written as a
cluster spec and a graph file, and plans of it saved as YAML."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import yaml
from test_verify import cluster_dict, diamond_problem

from llm_planner.core.atomic import WriteError
from llm_planner.core.plan import Plan, PlanError, save_plan
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.inputs import problem_from_inputs
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.verify_file import verify_plan_file

DEVICES = ("node0/cpu:0", "node0/fast:0", "node0/small:0")


def write_inputs(folder: Path, objective: str = "latency"):
    """(problem rebuilt from files in `folder`) for the diamond instance, batch 4, up to 2 shards."""
    graph_path, cluster_path = folder / "g.json", folder / "c.yaml"
    template = diamond_problem(objective=objective)
    graph_path.write_text(template.graph.to_json())
    cluster_path.write_text(yaml.safe_dump(cluster_dict(template)))
    return problem_from_inputs(
        cluster_path=str(cluster_path),
        graph_path=str(graph_path),
        objective=objective,
        batch_size=4,
        max_shards=2,
        options={"rel_gap": 1e-4},
    )


def a_plan(problem, sizes=(3, 1), assigns=((1, 1, 2, 1), (0, 0, 1, 0)), bound_fraction=0.8) -> Plan:
    plan = make_plan(
        problem,
        list(sizes),
        [list(a) for a in assigns],
        solver="test",
        status="heuristic",
        started_at=time.perf_counter(),
        lower_bound_s=0.0,
    )
    # a fraction of the bound verify re-derives (a claimed bound above it is a violation)
    return dataclasses.replace(plan, lower_bound_s=min(lower_bound(problem), plan.objective_s) * bound_fraction)


def written_plan(folder: Path, objective: str = "latency", name: str = "plan.yaml", **kw) -> Path:
    path = folder / name
    save_plan(a_plan(write_inputs(folder, objective), **kw), path)
    return path


def verify_outcome(path: Path) -> tuple[int, list[str]]:
    """(exit code the CLI gives, its messages): 0 valid, 1 violations, 2 bad input; anything else raises."""
    from llm_planner.cli.main import _input_errors

    try:
        report = verify_plan_file(path)
    except _input_errors() as exc:
        return 2, [str(exc)]
    return (0 if report.ok else 1), list(report.violations)


__all__ = ["DEVICES", "PlanError", "WriteError", "a_plan", "verify_outcome", "write_inputs", "written_plan"]
