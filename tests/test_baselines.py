"""Baseline planners: hand-checked placements, HEFT's published example, and on random DAGs every
baseline plan verifies and sits above the lower bound."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from planner_instances import kind, make_cluster, problems

from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.baselines.baseline_set import ALL_BASELINES, run_any_baseline
from llm_planner.placement.baselines.single import BASELINE_NAMES, run_baseline
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.fit import infeasibility_reason
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import build_problem
from llm_planner.placement.session import SolveSession
from llm_planner.placement.solve import SolveError, solve
from llm_planner.placement.verify import verify_plan

GB = 1e9


def problem_of(
    kinds, devices, times, edges=(), *, weights=None, batch=1, shards=1, objective="latency", bw=10e9, groups=None
):
    """Explicit per-kind task times (s per sample); `kinds` = [(name, type, mem_bytes)], `devices` = {kind: count}."""
    cluster = make_cluster(
        [kind(n, t, flops=1e12, mem_bytes=m, mem_bw=1e11) for n, t, m in kinds], [devices], bw=bw, latency_s=0.0
    )
    n = len(times)
    tasks = tuple(
        Task(
            name=f"t{i}",
            time_s_by_kind=tuple(times[i].items()),
            weight_bytes=(weights or [0.0] * n)[i],
            colocate_group=(groups or [""] * n)[i],
        )
        for i in range(n)
    )
    graph = TaskGraph(
        name="hand", tasks=tasks, edges=tuple(Edge(src=f"t{u}", dst=f"t{v}", bytes_per_sample=c) for u, v, c in edges)
    )
    return build_problem(graph.validate(), cluster, objective=objective, batch_size=batch, max_shards=shards)


def devices_of(plan) -> list[str]:
    return [plan.assignment[f"t{i}"] for i in range(len(plan.assignment))]


# -- HEFT on the example of Topcuoglu, Hariri and Wu (IEEE TPDS 2002, Fig. 2) ------------------

HEFT_TIMES = [
    (14, 16, 9),
    (13, 19, 18),
    (11, 13, 19),
    (13, 8, 17),
    (12, 13, 10),
    (13, 16, 9),
    (7, 15, 11),
    (5, 11, 14),
    (18, 12, 20),
    (21, 7, 16),
]
HEFT_EDGES = [
    (1, 2, 18),
    (1, 3, 12),
    (1, 4, 9),
    (1, 5, 11),
    (1, 6, 14),
    (2, 8, 19),
    (2, 9, 16),
    (3, 7, 23),
    (4, 8, 27),
    (4, 9, 23),
    (5, 9, 13),
    (6, 8, 15),
    (7, 10, 17),
    (8, 10, 11),
    (9, 10, 13),
]


def test_heft_reproduces_the_published_schedule_length():
    """Three processors, communication cost = bytes over a 1 B/s link; the paper's HEFT makespan is 80."""
    kinds = [(f"p{j}", "gpu", 1e12) for j in (1, 2, 3)]
    times = [{f"p{j + 1}": float(c[j]) for j in range(3)} for c in HEFT_TIMES]
    edges = [(u - 1, v - 1, float(c)) for u, v, c in HEFT_EDGES]
    problem = problem_of(kinds, {"p1": 1, "p2": 1, "p3": 1}, times, edges, bw=1.0)
    plan = run_baseline("heft", problem)
    assert plan is not None and plan.solver.name == "baseline:heft" and plan.solver.status == "heuristic"
    assert plan.objective_s == pytest.approx(80.0)
    assert verify_plan(plan, problem).ok
    # the paper's first decisions: n1 on P3 (finish 9), n10 last, on P2 (finish 80)
    assert plan.assignment["t0"] == "node0/p3:0"
    assert plan.assignment["t9"] == "node0/p2:0"


# -- hand-checked placements -----------------------------------------------------------------------

CPU_GPUS = [("cpu", "cpu", "unlimited"), ("fast", "gpu", 10 * GB), ("slow", "gpu", 10 * GB)]
SPEED = {"cpu": 10.0, "fast": 1.0, "slow": 2.0}


def test_single_device_picks_the_fastest_that_fits():
    chain = [(i, i + 1, 0.0) for i in range(3)]
    roomy = problem_of(CPU_GPUS, {"cpu": 1, "fast": 1, "slow": 1}, [SPEED] * 4, chain, weights=[2 * GB] * 4)
    assert devices_of(run_baseline("single-device", roomy)) == ["node0/fast:0"] * 4
    tight = problem_of(CPU_GPUS, {"cpu": 1, "fast": 1, "slow": 1}, [SPEED] * 4, chain, weights=[3 * GB] * 4)
    plan = run_baseline("single-device", tight)  # 12 GB fits on neither GPU
    assert devices_of(plan) == ["node0/cpu:0"] * 4 and plan.objective_s == pytest.approx(40.0)


def test_memory_greedy_fills_accelerators_in_spec_order_then_cpus():
    problem = problem_of(
        CPU_GPUS,
        {"cpu": 1, "slow": 1, "fast": 1},
        [SPEED] * 5,
        [(i, i + 1, 0.0) for i in range(4)],
        weights=[4 * GB] * 5,
    )
    plan = run_baseline("memory-greedy", problem)
    assert devices_of(plan) == ["node0/slow:0", "node0/slow:0", "node0/fast:0", "node0/fast:0", "node0/cpu:0"]
    assert verify_plan(plan, problem).ok


def test_memory_greedy_skips_a_device_that_cannot_run_a_task_without_moving_on():
    times = [SPEED, {"cpu": 10.0}, SPEED]  # t1 runs only on the CPU
    problem = problem_of(CPU_GPUS, {"cpu": 1, "fast": 1}, times, [(0, 1, 0.0), (1, 2, 0.0)], weights=[1 * GB] * 3)
    assert devices_of(run_baseline("memory-greedy", problem)) == ["node0/fast:0", "node0/cpu:0", "node0/fast:0"]


def test_even_split_cuts_equal_stages_over_accelerators_fastest_first():
    problem = problem_of(CPU_GPUS, {"cpu": 1, "slow": 1, "fast": 1}, [SPEED] * 5, [(i, i + 1, 0.0) for i in range(4)])
    plan = run_baseline("even-split", problem)
    assert devices_of(plan) == ["node0/fast:0"] * 3 + ["node0/slow:0"] * 2


def test_data_parallel_splits_over_identical_fast_devices():
    problem = problem_of(CPU_GPUS, {"cpu": 1, "fast": 2}, [SPEED] * 2, [(0, 1, 0.0)], batch=4, shards=3)
    plan = run_baseline("data-parallel", problem)
    assert sorted(plan.shard_sizes) == [2, 2]
    assert {a["t0"] for a in plan.shard_assignments} == {"node0/fast:0", "node0/fast:1"}
    assert plan.objective_s == pytest.approx(4.0)  # two samples x two tasks x 1 s, in parallel
    assert verify_plan(plan, problem).ok


def test_data_parallel_balances_unlike_devices_by_time_not_speed(repo):
    """An 8-node RWNN, batch 8, on a CPU, an A100 and a T4. At the full batch the A100 takes
    0.18 ms and the T4 0.33 ms, so shards proportional to speed would be 5 + 3; but most of a
    node's time is its fixed cost, so the T4 is best given a single sample: 7 + 1."""
    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.baselines.common import whole_graph_objective as _whole_graph_objective
    from llm_planner.placement.inputs import problem_from_inputs

    problem = problem_from_inputs(
        cluster_path=str(repo / "cluster_specs/cpu-two-gpus.yaml"), model=ModelSpec(name="rwnn-ws-1x8"), batch_size=8
    )
    plan = run_baseline("data-parallel", problem)
    a100, t4 = (problem.device_names.index(name) for name in ("workstation/a100-40g-pcie:0", "workstation/t4:0"))
    assert plan.shard_sizes == (7, 1)
    assert plan.objective_s < _whole_graph_objective(problem, [5, 3], [a100, t4]) * (1 - 1e-3)
    assert verify_plan(plan, problem).ok


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(max_tasks=5, max_devices=3, max_batch=6))
def test_data_parallel_sizes_are_the_best_split_over_its_devices(problem):
    """No other split of the batch over the plan's devices (each >= 1 sample, whole graph per
    device, fitting in memory) has a smaller makespan."""
    import itertools

    from llm_planner.placement.baselines.common import fits as _fits
    from llm_planner.placement.baselines.common import whole_graph_objective as _whole_graph_objective

    plan = run_baseline("data-parallel", problem)
    if plan is None:
        return
    index = {name: k for k, name in enumerate(problem.device_names)}
    devices = [index[next(iter(a.values()))] for a in plan.shard_assignments]
    n, q = problem.num_tasks, problem.batch_size
    for cuts in itertools.combinations(range(1, q), len(devices) - 1):
        sizes = [b - a for a, b in zip((0, *cuts), (*cuts, q))]
        if _fits(problem, sizes, [[k] * n for k in devices]):
            assert plan.objective_s <= _whole_graph_objective(problem, sizes, devices) * (1 + 1e-9)


def test_heft_puts_a_colocation_group_where_its_first_member_goes():
    times = [SPEED, SPEED, {"cpu": 10.0, "fast": 1.0, "slow": 100.0}]
    problem = problem_of(
        CPU_GPUS, {"cpu": 1, "fast": 1, "slow": 1}, times, [(0, 1, 0.0), (0, 2, 0.0)], groups=["", "g", "g"]
    )
    plan = run_baseline("heft", problem)
    assert plan.assignment["t1"] == plan.assignment["t2"]
    assert verify_plan(plan, problem).ok


def run_all_baselines(problem):
    """The single-device baselines, each run on its own."""
    return {name: run_baseline(name, problem) for name in BASELINE_NAMES}


def test_best_baseline_is_the_lowest_of_every_baseline_tensor_parallel_ones_included():
    """One task that shards over a pair of GPUs: megatron's group halves its time, which no
    single-device baseline matches; the session's best baseline (what `--solver best-baseline`
    returns and the solvers start from) is the lowest of every baseline, each run on its own."""
    gpu = kind("g", "gpu", flops=1e12, mem_bytes=100 * GB, mem_bw=1e12)
    cluster = make_cluster([gpu], [{"g": 2}], bw=100e9, latency_s=0.0)
    task = Task(name="t0", flops_per_sample=1e12, tp_divides=(2,), tp_allreduces=1, tp_allreduce_bytes_per_sample=1e3)
    problem = build_problem(TaskGraph(name="one", tasks=(task,), edges=()).validate(), cluster, max_tp=2)
    each = {name: run_any_baseline(name, problem) for name in ALL_BASELINES}
    single = min(p.objective_s for name, p in each.items() if name in BASELINE_NAMES and p is not None)
    lowest = min(p.objective_s for p in each.values() if p is not None)
    assert lowest < 0.6 * single  # the group wins
    best = SolveSession(problem).best_baseline
    assert best.objective_s == lowest and best.solver.name in ("baseline:megatron", "baseline:tp-replicas")
    plan = solve(problem, SolveOptions(solver="best-baseline"))
    assert plan.objective_s == lowest and plan.solver.name == best.solver.name


def test_unknown_baseline():
    problem = problem_of(CPU_GPUS, {"fast": 1}, [SPEED])
    with pytest.raises(ValueError, match="unknown baseline 'random'"):
        run_baseline("random", problem)


# -- infeasible memory ---------------------------------------------------------------------------


def test_a_task_larger_than_every_device():
    kinds = [("big", "gpu", 40 * GB), ("small", "gpu", 16 * GB)]
    problem = problem_of(
        kinds, {"big": 1, "small": 1}, [{"big": 1.0, "small": 2.0}] * 2, [(0, 1, 0.0)], weights=[50 * GB, 1 * GB]
    )
    assert all(plan is None for plan in run_all_baselines(problem).values())
    assert SolveSession(problem).best_baseline is None
    reason = infeasibility_reason(problem)
    assert "task 't0' needs 50 GB" in reason and "'node0/big:0', holds 40 GB (short by 10 GB)" in reason


def test_total_memory_shortfall():
    kinds = [("g", "gpu", 10 * GB)]
    problem = problem_of(kinds, {"g": 2}, [{"g": 1.0}] * 4, [(i, i + 1, 0.0) for i in range(3)], weights=[6 * GB] * 4)
    assert all(plan is None for plan in run_all_baselines(problem).values())
    reason = infeasibility_reason(problem)
    assert reason == "the tasks need at least 24 GB of device memory in all but the devices hold 20 GB (short by 4 GB)"


def test_packing_failure_is_explained():
    """Each 6 GB task fits a 10 GB device and 18 GB fit in 20 GB, but no device holds two."""
    problem = problem_of(
        [("g", "gpu", 10 * GB)], {"g": 2}, [{"g": 1.0}] * 3, [(0, 1, 0.0), (1, 2, 0.0)], weights=[6 * GB] * 3
    )
    assert all(plan is None for plan in run_all_baselines(problem).values())
    reason = infeasibility_reason(problem)
    assert "the total need (18 GB) is within the total capacity (20 GB)" in reason
    assert "on one device the model needs 18 GB but the roomiest, 'node0/g:0', holds 10 GB (short by 8 GB)" in reason


def test_solve_api_reports_the_reason():
    problem = problem_of(
        [("g", "gpu", 10 * GB)], {"g": 2}, [{"g": 1.0}] * 4, [(i, i + 1, 0.0) for i in range(3)], weights=[6 * GB] * 4
    )
    with pytest.raises(SolveError, match="short by 4 GB"):
        solve(problem, SolveOptions(solver="heft"))


# -- properties on random DAGs ------------------------------------------------------------------------


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_every_baseline_plan_verifies_and_respects_the_bound(problem):
    bound = lower_bound(problem)
    plans = run_all_baselines(problem)
    for name, plan in plans.items():
        if plan is None:
            continue
        assert plan.solver.name == f"baseline:{name}"
        assert plan.shard_sizes == (problem.batch_size,) or name == "data-parallel"
        report = verify_plan(plan, problem)
        assert report.ok, (name, report.violations)
        assert bound <= plan.objective_s * (1 + 1e-9), (name, bound, plan.objective_s)
        assert verify_plan(dataclasses.replace(plan, lower_bound_s=bound), problem).ok
        if name in ("single-device", "data-parallel"):  # chosen by a closed form: each shard whole on its own device
            busiest = max(
                sum(problem.task_time(i, problem.device_names.index(a["t0"]), b) for i in range(problem.num_tasks))
                for b, a in zip(plan.shard_sizes, plan.shard_assignments)
            )
            assert plan.objective_s == pytest.approx(
                busiest / (problem.batch_size if problem.objective == "throughput" else 1)
            )
    feasible = [p for p in plans.values() if p is not None]
    if feasible:  # the best baseline is the lowest of every baseline, each run on its own, the groups' included
        every = [p for p in (run_any_baseline(name, problem) for name in ALL_BASELINES) if p is not None]
        assert SolveSession(problem).best_baseline.objective_s == min(p.objective_s for p in every)
    else:
        reason = infeasibility_reason(problem)
        assert "short by" in reason or "no device can run" in reason or "no placement that fits" in reason, reason


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(max_tasks=8))
def test_solve_returns_verified_baseline_plans(problem):
    try:
        plan = solve(problem, SolveOptions(solver="best-baseline"))
    except SolveError as exc:
        assert "GB" in str(exc) or "device" in str(exc)
        return
    assert plan.lower_bound_s == pytest.approx(lower_bound(problem))
    assert 0 <= plan.gap <= 1


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_the_hand_layouts_verify_on_random_dags(problem):
    """megatron and tp-replicas keep colocation, device support and memory on any graph (the
    exact MILP takes the best baseline as its warm start unverified)."""
    from llm_planner.placement.baselines.tensor_parallel import TP_BASELINES, run_tp_baseline

    bound = lower_bound(problem)
    for name in TP_BASELINES:
        plan = run_tp_baseline(name, problem)
        if plan is not None:
            report = verify_plan(plan, problem)
            assert report.ok, (name, report.violations)
            assert bound <= plan.objective_s * (1 + 1e-9)
