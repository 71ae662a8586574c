"""MILP-SPLIT: equals the exact MILP where the decomposition is exact, solves identical
modules once, gives the same plan serially and in parallel, and its plans verify."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_instances import clusters, kind, make_cluster

from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import build_problem
from llm_planner.placement.solve import solve
from llm_planner.placement.split.modules import find_cut_tasks, split_modules

EXACT = dict(time_limit_s=60.0, rel_gap=1e-7)


def diamond_chain(widths: list[int], costs: list[float], bytes_: list[float]) -> TaskGraph:
    """cut0 -> (width parallel tasks) -> cut1 -> ... : the only single-task cuts are the joins."""
    tasks = [Task(name="c0", flops_per_sample=costs[0])]
    edges = []
    n = 1
    for m, width in enumerate(widths):
        join = f"c{m + 1}"
        for w in range(width):
            name = f"m{m}w{w}"
            tasks.append(Task(name=name, flops_per_sample=costs[n % len(costs)]))
            edges.append(Edge(src=f"c{m}", dst=name, bytes_per_sample=bytes_[n % len(bytes_)]))
            edges.append(Edge(src=name, dst=join, bytes_per_sample=bytes_[(n + 1) % len(bytes_)]))
            n += 1
        tasks.append(Task(name=join, flops_per_sample=costs[n % len(costs)]))
        n += 1
    return TaskGraph(name="diamonds", tasks=tuple(tasks), edges=tuple(edges)).validate()


def test_cuts_of_a_diamond_chain():
    g = diamond_chain([2, 3], [1e12], [1e6])
    cluster = make_cluster([kind("g", "gpu", flops=1e14, mem_bytes="unlimited", mem_bw=1e12)], [{"g": 2}])
    p = build_problem(g, cluster)
    names = [g.tasks[i].name for i in find_cut_tasks(p)]
    assert names == ["c0", "c1", "c2"]
    modules = split_modules(p, max_module_tasks=100)
    assert [len(m.tasks) for m in modules] == [1, 3, 4]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=clusters(max_devices=3),
    widths=st.lists(st.integers(1, 2), min_size=1, max_size=3),
    costs=st.lists(st.floats(1e10, 2e12), min_size=3, max_size=6),
    bytes_=st.lists(st.floats(0, 2e8), min_size=2, max_size=4),
)
@pytest.mark.milp
def test_split_equals_exact_milp_on_single_cut_graphs(cluster, widths, costs, bytes_):
    graph = diamond_chain(widths, costs, bytes_)
    # no memory limit: weights and per-sample memory are zero in diamond_chain
    problem = build_problem(graph, cluster, objective="latency", batch_size=1, max_shards=1)
    exact = solve(problem, SolveOptions(solver="milp", **EXACT))
    split = solve(problem, SolveOptions(solver="milp-split", workers=1, **EXACT))
    assert "optimal" in (exact.solver.status, exact.solver.details.get("solver_status"))
    assert split.objective_s == pytest.approx(exact.objective_s, rel=1e-5)
    assert split.lower_bound_s <= split.objective_s * (1 + 1e-9)


def test_split_equals_exact_on_a_small_fixed_instance():
    cluster = make_cluster(
        [
            kind("fast", "gpu", flops=1e14, mem_bytes="unlimited", mem_bw=1e12),
            kind("slow", "cpu", flops=2e13, mem_bytes="unlimited", mem_bw=2e11),
        ],
        [{"fast": 1, "slow": 1}],
        bw=5e9,
    )
    graph = diamond_chain([2, 2], [4e11, 3e11, 6e11, 2e11], [1e6, 5e7])
    problem = build_problem(graph, cluster, objective="latency", batch_size=1, max_shards=1)
    exact = solve(problem, SolveOptions(solver="milp", **EXACT))
    split = solve(problem, SolveOptions(solver="milp-split", workers=1, **EXACT))
    assert split.objective_s == pytest.approx(exact.objective_s, rel=1e-6)
    # the chain bound of per-module bounds closes the gap (a record: verify re-derives only bounds.combined)
    assert split.solver.details["solver_status"] == "optimal"
    assert split.solver.details["solver_bound_s"] == pytest.approx(split.objective_s, rel=1e-4)


def _identical_problem(num_modules: int):
    cluster = make_cluster(
        [
            kind("a", "gpu", flops=1e14, mem_bytes="unlimited", mem_bw=1e12),
            kind("b", "gpu", flops=5e13, mem_bytes="unlimited", mem_bw=1e12),
        ],
        [{"a": 1, "b": 1}],
        bw=5e9,
    )
    graph = diamond_chain([2] * num_modules, [3e11], [1e7])
    return build_problem(graph, cluster, objective="latency", batch_size=1, max_shards=1)


def test_identical_modules_are_solved_once():
    few, many = _identical_problem(2), _identical_problem(6)
    plan_few = solve(few, SolveOptions(solver="milp-split", workers=1))
    plan_many = solve(many, SolveOptions(solver="milp-split", workers=1))
    solved_few = plan_few.solver.details["subproblems_solved"]
    solved_many = plan_many.solver.details["subproblems_solved"]
    # every diamond after the first has the same signature: 2 x 2 device pairs, solved once for all of them
    assert solved_many == solved_few == 4
    assert plan_many.solver.details["subproblems_requested"] > plan_few.solver.details["subproblems_requested"]


def test_symmetric_devices_share_subproblems():
    cluster = make_cluster([kind("g", "gpu", flops=1e14, mem_bytes="unlimited", mem_bw=1e12)], [{"g": 3}], bw=5e9)
    graph = diamond_chain([2, 2], [3e11], [1e7])
    problem = build_problem(graph, cluster, objective="latency", batch_size=1, max_shards=1)
    plan = solve(problem, SolveOptions(solver="milp-split", workers=1))
    # 3 x 3 device pairs of interchangeable devices: only "same device" and "other device" differ
    assert plan.solver.details["subproblems_solved"] == 2
    exact = solve(problem, SolveOptions(solver="milp", **EXACT))
    assert plan.objective_s == pytest.approx(exact.objective_s, rel=1e-6)


def test_parallel_and_serial_give_the_same_plan():
    problem = _identical_problem(3)
    serial = solve(problem, SolveOptions(solver="milp-split", workers=1))
    parallel = solve(problem, SolveOptions(solver="milp-split", workers=2))
    assert serial.shard_assignments == parallel.shard_assignments
    assert serial.objective_s == parallel.objective_s


@pytest.mark.parametrize("objective", ["latency", "throughput"])
@pytest.mark.parametrize("batch", [1, 8])
def test_gpt_plans_verify_and_beat_baselines(objective, batch, repo):
    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.inputs import problem_from_inputs
    from llm_planner.placement.session import SolveSession

    problem = problem_from_inputs(
        cluster_path=str(repo / "cluster_specs/four-gpus.yaml"),
        model=ModelSpec(name="gpt2-xl"),
        objective=objective,
        batch_size=batch,
    )
    plan = solve(problem, SolveOptions(solver="milp-split"))  # solve() runs the verifier
    baseline = SolveSession(problem).best_baseline
    assert plan.objective_s <= baseline.objective_s * (1 + 1e-9)
    assert plan.lower_bound_s <= plan.objective_s * (1 + 1e-9)


class _CountingIndex(np.ndarray):
    """An array that counts the elements read through indexing (a measure of work, not of seconds)."""

    reads = 0

    def __getitem__(self, key):
        _CountingIndex.reads += 1
        return super().__getitem__(key)


def test_module_signatures_read_each_edge_a_bounded_number_of_times_on_a_long_chain():
    # each module hashes only the edges into its own tasks; scanning every edge per module made a
    # 50,000-task chain (50,000 modules) take 7 minutes: n modules would read about n^2 / 2 edges
    n = 4_000
    tasks = tuple(Task(name=f"t{i}", flops_per_sample=1e9) for i in range(n))
    edges = tuple(Edge(src=f"t{i - 1}", dst=f"t{i}", bytes_per_sample=1e6) for i in range(1, n))
    cluster = make_cluster([kind("g", "gpu", flops=1e14, mem_bytes="unlimited", mem_bw=1e12)], [{"g": 2}])
    problem = build_problem(TaskGraph(name="chain", tasks=tasks, edges=edges), cluster, max_shards=1)
    for name in ("edge_src", "edge_dst"):
        object.__setattr__(problem, name, getattr(problem, name).view(_CountingIndex))
    _CountingIndex.reads = 0
    modules = split_modules(problem, max_module_tasks=100)
    assert 0 < _CountingIndex.reads <= 4 * n  # linear in the edges, never per module over all edges
    assert len(modules) == n
    assert len({m.signature for m in modules[1:]}) == 1  # every task after the first: one edge in, same costs
