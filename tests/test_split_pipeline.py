"""MILP-SPLIT's pipelined micro-batches (llm_planner.solve.split_pipeline)."""

from __future__ import annotations

import pytest
from planner_instances import kind, make_cluster

from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.solve.api import solve
from llm_planner.solve.options import SolveOptions
from llm_planner.solve.problem import build_problem
from llm_planner.solve.schedule import make_plan
from llm_planner.solve.split_groups import shard_sizes
from llm_planner.solve.bounds import task_times
from llm_planner.solve.split_pipeline import gpipe_orders, pipeline_estimate
from llm_planner.verify import verify_plan

GB = 1e9


def two_stage_problem(batch: int = 2):
    """Two 1 s-per-sample layers of 6 GB weights on two identical 8 GB GPUs: neither holds both layers, so
    a data-parallel copy per device cannot fit, and the batch can only go through A -> B."""
    cluster = make_cluster([kind("g", "gpu", flops=1e12, mem_bytes=8 * GB, mem_bw=1e12)], [{"g": 2}], bw=1e15, latency_s=0.0)
    tasks = tuple(Task(name=n, time_s_by_kind=(("g", 1.0),), weight_bytes=6 * GB) for n in ("l1", "l2"))
    graph = TaskGraph(name="two-layers", tasks=tasks, edges=(Edge(src="l1", dst="l2", bytes_per_sample=1.0),)).validate()
    return build_problem(graph, cluster, objective="latency", batch_size=batch, max_shards=batch)


def test_two_micro_batches_through_two_stages_beat_one_shard():
    """Hand-solved: one shard of 2 takes 2 + 2 = 4 s; two micro-batches of 1 overlap (l1 of the second runs
    while l2 of the first does): 1 + 1 + 1 = 3 s, the optimum (each device is busy 2 s, and l2 cannot start
    before 1 s)."""
    problem = two_stage_problem()
    plan = solve(problem, SolveOptions(solver="milp-split"))
    assert plan.objective_s == pytest.approx(3.0)
    assert plan.shard_sizes == (1, 1) and verify_plan(plan, problem).ok
    exact = solve(problem, SolveOptions(solver="milp", rel_gap=1e-7))
    assert exact.objective_s == pytest.approx(3.0)


@pytest.mark.parametrize("micro_batches", [1, 2, 3, 5, 8])
def test_the_stage_estimate_is_exact_on_a_chain(micro_batches):
    """On a chain cut into whole stages the estimate that ranks candidates equals the scheduled makespan."""
    from llm_planner.graph.models import ModelSpec, build_model_graph

    cluster = make_cluster([kind("a", "gpu", flops=3e14, mem_bytes=80 * GB, mem_bw=2e12),
                            kind("b", "gpu", flops=1e14, mem_bytes=40 * GB, mem_bw=9e11)], [{"a": 2}, {"b": 2}], bw=2e10, latency_s=1e-5)
    problem = build_problem(build_model_graph(ModelSpec(name="gpt2")), cluster, objective="latency", batch_size=8, max_shards=8)
    topo = [problem.graph.index(n) for n in problem.graph.topological_order()]
    stage_of = [min(3, 4 * pos // len(topo)) for pos in range(len(topo))]  # four contiguous stages, one per device
    assign = [0] * problem.num_tasks
    for pos, i in enumerate(topo):
        assign[i] = stage_of[pos]
    sizes = shard_sizes(8, micro_batches)
    plan = make_plan(problem, sizes, [assign] * micro_batches, solver="x", status="heuristic", started_at=0.0, lower_bound_s=0.0,
                     device_orders=gpipe_orders([assign] * micro_batches, topo))
    assert pipeline_estimate(problem, lambda b: task_times(problem, b), assign, topo, sizes) == pytest.approx(plan.objective_s, rel=1e-12)
