"""MILP-SPLIT's pipelined micro-batches (llm_planner.placement.split.pipeline_parallel)."""

from __future__ import annotations

import pytest
from planner_instances import kind, make_cluster

from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import build_problem
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.solve import solve
from llm_planner.placement.split.data_parallel import shard_sizes
from llm_planner.placement.split.pipeline_parallel import replicated_plans, run_estimate, run_orders
from llm_planner.placement.verify import verify_plan

GB = 1e9


def two_stage_problem(batch: int = 2):
    """Two 1 s-per-sample layers of 6 GB weights on two identical 8 GB GPUs: neither holds both layers, so
    a data-parallel copy per device cannot fit, and the batch can only go through A -> B."""
    cluster = make_cluster(
        [kind("g", "gpu", flops=1e12, mem_bytes=8 * GB, mem_bw=1e12)], [{"g": 2}], bw=1e15, latency_s=0.0
    )
    tasks = tuple(Task(name=n, time_s_by_kind=(("g", 1.0),), weight_bytes=6 * GB) for n in ("l1", "l2"))
    graph = TaskGraph(
        name="two-layers", tasks=tasks, edges=(Edge(src="l1", dst="l2", bytes_per_sample=1.0),)
    ).validate()
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
def test_the_run_estimate_is_exact_on_a_chain(micro_batches):
    """On a chain cut into whole stages the estimate that ranks candidates equals the scheduled makespan."""
    from llm_planner.graph.models import ModelSpec, build_model_graph

    cluster = make_cluster(
        [
            kind("a", "gpu", flops=3e14, mem_bytes=80 * GB, mem_bw=2e12),
            kind("b", "gpu", flops=1e14, mem_bytes=40 * GB, mem_bw=9e11),
        ],
        [{"a": 2}, {"b": 2}],
        bw=2e10,
        latency_s=1e-5,
    )
    problem = build_problem(
        build_model_graph(ModelSpec(name="gpt2")), cluster, objective="latency", batch_size=8, max_shards=8
    )
    topo = [problem.graph.index(n) for n in problem.graph.topological_order()]
    stage_of = [min(3, 4 * pos // len(topo)) for pos in range(len(topo))]  # four contiguous stages, one per device
    assign = [0] * problem.num_tasks
    for pos, i in enumerate(topo):
        assign[i] = stage_of[pos]
    sizes = shard_sizes(8, micro_batches)
    plan = make_plan(
        problem,
        sizes,
        [assign] * micro_batches,
        solver="x",
        status="heuristic",
        started_at=0.0,
        lower_bound_s=0.0,
        device_orders=run_orders([assign] * micro_batches, topo),
    )
    estimate = run_estimate(problem, lambda b: task_times(problem, b), [assign] * micro_batches, topo, sizes)
    assert estimate == pytest.approx(plan.objective_s, rel=1e-12)


def cpu_tail_problem():
    """A GPU layer then a CPU-only layer, on one GPU and two CPU sockets; batch 2."""
    cluster = make_cluster(
        [
            kind("g", "gpu", flops=1e12, mem_bytes=8 * GB, mem_bw=1e12),
            kind("c", "cpu", flops=1e11, mem_bytes=64 * GB, mem_bw=1e11),
        ],
        [{"g": 1, "c": 2}],
        bw=1e15,
        latency_s=0.0,
    )
    tasks = (
        Task(name="l1", time_s_by_kind=(("g", 1.0), ("c", 4.0)), weight_bytes=GB),
        Task(name="l2", time_s_by_kind=(("c", 3.0),), weight_bytes=GB),
    )
    graph = TaskGraph(name="cpu-tail", tasks=tasks, edges=(Edge(src="l1", dst="l2", bytes_per_sample=1.0),)).validate()
    return build_problem(graph, cluster, objective="latency", batch_size=2, max_shards=2)


def test_a_replicated_stage_takes_every_other_micro_batch():
    """Hand-solved: l1 takes 1 s per sample on the GPU, l2 3 s per sample on a CPU. One shard: 2 + 6 = 8 s;
    two micro-batches on one CPU: l2 runs 1..4 and 4..7, 7 s; with the second micro-batch's l2 on the idle
    second socket (which holds l2's weights too): 1..4 and 2..5, 5 s, the optimum."""
    from test_bounds import brute_force_optimum

    problem = cpu_tail_problem()
    gpu, cpu0, cpu1 = (problem.device_names.index(n) for n in ("node0/g:0", "node0/c:0", "node0/c:1"))
    plans = replicated_plans(problem, [[gpu, cpu0]], 0.0)
    best = min(plans, key=lambda p: p.objective_s)
    assert best.objective_s == pytest.approx(5.0) and best.shard_sizes == (1, 1)
    assert {a["l2"] for a in best.shard_assignments} == {"node0/c:0", "node0/c:1"}
    assert verify_plan(best, problem).ok
    assert brute_force_optimum(problem, orders=True) == pytest.approx(5.0)
    assert solve(problem, SolveOptions(solver="milp-split")).objective_s == pytest.approx(5.0)
    assert replicated_plans(problem, [[gpu, cpu0]], 0.0) and not replicated_plans(
        build_problem(problem.graph, problem.cluster, objective="latency", batch_size=2, max_shards=1),
        [[gpu, cpu0]],
        0.0,
    )


def test_run_orders_serve_every_first_visit_before_a_second():
    """A chain a -> b -> c with a and c on device 0, b on device 1 (a decoder's embedding and LM head on one
    GPU): device 0 runs both shards' a before either shard's c; with one run per device the order is
    GPipe's; the run estimate equals the scheduled makespan on this chain."""
    cluster = make_cluster(
        [kind("g", "gpu", flops=1e12, mem_bytes=8 * GB, mem_bw=1e12)], [{"g": 2}], bw=1e15, latency_s=0.0
    )
    tasks = tuple(Task(name=n, time_s_by_kind=(("g", t),)) for n, t in (("a", 1.0), ("b", 2.0), ("c", 1.0)))
    graph = TaskGraph(
        name="visit-twice", tasks=tasks, edges=(Edge(src="a", dst="b"), Edge(src="b", dst="c"))
    ).validate()
    problem = build_problem(graph, cluster, objective="latency", batch_size=2, max_shards=2)
    topo = [problem.graph.index(n) for n in problem.graph.topological_order()]
    assign = [0, 1, 0]
    orders = run_orders([assign, assign], topo)
    assert orders[0] == [(0, 0), (1, 0), (0, 2), (1, 2)] and orders[1] == [(0, 1), (1, 1)]
    assert run_orders([[0, 1, 1]] * 3, topo) == {
        0: [(0, 0), (1, 0), (2, 0)],
        1: [(s, i) for s in range(3) for i in (1, 2)],
    }  # GPipe's
    plan = make_plan(
        problem,
        [1, 1],
        [assign, assign],
        solver="x",
        status="heuristic",
        started_at=0.0,
        lower_bound_s=0.0,
        device_orders=orders,
    )
    gpipe = make_plan(
        problem,
        [1, 1],
        [assign, assign],
        solver="x",
        status="heuristic",
        started_at=0.0,
        lower_bound_s=0.0,
        device_orders={0: [(0, 0), (0, 2), (1, 0), (1, 2)], 1: [(0, 1), (1, 1)]},
    )
    assert plan.objective_s == pytest.approx(6.0) and gpipe.objective_s == pytest.approx(
        8.0
    )  # a a c c vs a c a c on device 0
    assert run_estimate(problem, lambda b: task_times(problem, b), [assign, assign], topo, [1, 1]) == pytest.approx(6.0)
