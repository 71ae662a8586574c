"""A bound that cannot be forged: `verify` re-derives a plan's lower bound with the planner's own
deterministic procedure (bounds.combined.lower_bound) and accepts `lower_bound_s`, `gap` and
`solver.status: optimal` only as far as that bound supports them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from plan_files import verify_outcome, write_inputs

from llm_planner.cli.commands import _status_text
from llm_planner.cli.main import main
from llm_planner.core.plan import load_plan, save_plan
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.inputs import problem_from_inputs
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.solve import solve
from llm_planner.placement.verify_file import rebuild_problem


def edit(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def solved(folder: Path, solver: str, objective: str = "latency") -> tuple[Path, object]:
    """(plan file, problem) of the diamond instance of tests/plan_files.py solved by `solver`."""
    problem = write_inputs(folder, objective)
    plan = solve(problem, SolveOptions(solver=solver, time_limit_s=60))
    path = folder / f"{solver}.yaml"
    save_plan(plan, path)
    return path, problem


def forge(data: dict) -> None:
    """The issue's forgery: the bound raised to the objective, no gap, proven optimal."""
    data.update(lower_bound_s=data["objective_s"], gap=0.0)
    data["solver"]["status"] = "optimal"


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_the_forged_example_fails_naming_each_field(tmp_path, capsys, objective):
    path, _ = solved(tmp_path, "heft", objective)
    exact, _ = solved(tmp_path, "milp", objective)
    heft, optimum = load_plan(path), load_plan(exact)
    assert heft.objective_s > optimum.objective_s * 1.1  # not optimal: more than 10% above the MILP's optimum
    edit(path, forge)
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"invalid plan {path}" in out
    for field in ("lower_bound_s: the plan claims", "gap: the plan claims 0.0000%", "solver.status: the plan claims"):
        assert field in out, out


def test_a_bound_above_the_rederived_one_is_refused_and_one_at_or_below_it_accepted(tmp_path):
    path, problem = solved(tmp_path, "heft")
    bound = lower_bound(problem)
    objective = load_plan(path).objective_s

    def claim(value: float):
        edit(path, lambda d: d.update(lower_bound_s=value, gap=max(0.0, (objective - value) / objective)))
        return verify_outcome(path)

    code, messages = claim(bound * (1 + 1e-4))
    assert code == 1 and any(m.startswith("lower_bound_s: the plan claims") for m in messages), messages
    assert claim(bound) == (0, [])
    assert claim(bound / 2) == (0, [])  # a weaker bound is still a bound


def test_a_milp_plan_carries_the_rederived_bound_and_its_own_proof_as_a_record(tmp_path):
    path, problem = solved(tmp_path, "milp")
    plan = load_plan(path)
    bound = lower_bound(problem)
    assert plan.lower_bound_s == bound < plan.objective_s * (1 - 1e-4)  # the re-derived bound does not prove it
    assert plan.solver.status == "feasible" and plan.solver.details["solver_status"] == "optimal"
    assert plan.solver.details["solver_bound_s"] == pytest.approx(plan.objective_s, rel=1e-4)
    assert _status_text(plan).startswith("feasible (solver: optimal, bound ")  # what `plan` prints
    assert verify_outcome(path) == (0, [])
    edit(path, lambda d: d["solver"]["details"].update(solver_bound_s=123.0))  # a record, proves nothing
    assert verify_outcome(path) == (0, [])
    edit(path, lambda d: d["solver"].__setitem__("status", "optimal"))
    code, messages = verify_outcome(path)
    assert code == 1 and any(m.startswith("solver.status: the plan claims `optimal`") for m in messages), messages


def one_gpu_inputs(folder: Path):
    """A diamond on one GPU: the load-balance bound is the sum of the task times, the makespan of any plan."""
    tasks = tuple(Task(name=n, flops_per_sample=f) for n, f in [("a", 2e12), ("b", 1e12), ("c", 3e12), ("d", 1e12)])
    edges = tuple(Edge(src=s, dst=d, bytes_per_sample=1e6) for s, d in [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    graph_path, cluster_path = folder / "g.json", folder / "c.yaml"
    graph_path.write_text(TaskGraph(name="diamond", tasks=tasks, edges=edges).validate().to_json())
    kind = {"name": "g", "type": "gpu", "peak_flops": {"fp16": 1e14}, "mem_bytes": "unlimited"}
    kind["mem_bw_bytes_per_s"] = 1e12
    cluster = {"name": "one", "device_kinds": [kind], "nodes": [{"name": "n", "devices": {"g": 1}}]}
    cluster["links"] = {"intra_node_default": {"bw_bytes_per_s": 1e10, "latency_s": 1e-6}}
    cluster_path.write_text(yaml.safe_dump(cluster))
    return problem_from_inputs(cluster_path=str(cluster_path), graph_path=str(graph_path), batch_size=2, max_shards=1)


def test_optimal_proven_by_the_rederived_bound_verifies(tmp_path):
    problem = one_gpu_inputs(tmp_path)
    plan = solve(problem, SolveOptions(solver="heft"))
    assert plan.solver.status == "optimal" and plan.gap <= 1e-4
    save_plan(plan, tmp_path / "plan.yaml")
    assert verify_outcome(tmp_path / "plan.yaml") == (0, [])


def test_the_rederived_bound_is_the_same_from_every_rebuild(tmp_path):
    path, _ = solved(tmp_path, "heft", "throughput")
    plan = load_plan(path)
    first, second = (lower_bound(rebuild_problem(plan, str(path), check_hashes=True)) for _ in range(2))
    assert first == second == plan.lower_bound_s
