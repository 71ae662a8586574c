"""Lower bounds: exact on hand-solved instances, never above a brute-forced optimum."""

from __future__ import annotations

import dataclasses
import itertools
import time

import networkx as nx
import numpy as np
import pytest
import scipy.optimize
from hypothesis import HealthCheck, given, settings
from planner_instances import kind, make_cluster, problems

from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.bounds.load import load_balance_bound
from llm_planner.placement.bounds.times import critical_path_bound, per_sample_rates
from llm_planner.placement.problem import PlacementProblem, build_problem
from llm_planner.placement.schedule import make_plan

GB = 1e9


def explicit_problem(
    times,
    edges=(),
    *,
    kinds=(("g", "gpu", 40 * GB),),
    devices=None,
    batch=1,
    shards=1,
    objective="latency",
    weights=None,
):
    """Tasks with explicit seconds per sample per kind; zero-latency, zero-byte links (free transfers)."""
    cluster = make_cluster(
        [kind(name, type_, flops=1e12, mem_bytes=mem, mem_bw=1e11) for name, type_, mem in kinds],
        [devices or {kinds[0][0]: 2}],
        latency_s=0.0,
    )
    tasks = tuple(
        Task(name=f"t{i}", time_s_by_kind=tuple(t.items()), weight_bytes=(weights or [0.0] * len(times))[i])
        for i, t in enumerate(times)
    )
    graph = TaskGraph(
        name="hand", tasks=tasks, edges=tuple(Edge(src=f"t{u}", dst=f"t{v}") for u, v in edges)
    ).validate()
    return build_problem(graph, cluster, objective=objective, batch_size=batch, max_shards=shards)


# -- brute force ------------------------------------------------------------------------


def _feasible(problem: PlacementProblem, sizes, assigns) -> bool:
    for a in assigns:
        if any(len({a[i] for i in g}) > 1 for g in problem.colocate_groups()):
            return False
    return bool(np.all(problem.device_memory_used(sizes, assigns) <= problem.mem_capacity))


def _compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [bounds[j + 1] - bounds[j] for j in range(parts)]


def _shard_assignments(problem: PlacementProblem):
    choices = [[k for k in range(problem.num_devices) if problem.supported[i, k]] for i in range(problem.num_tasks)]
    return [list(a) for a in itertools.product(*choices)]


def brute_force_optimum(problem: PlacementProblem, *, orders: bool = False) -> float:
    """Best objective over every split, assignment (and, with `orders`, every device order) that fits."""
    best = np.inf
    per_shard = _shard_assignments(problem)
    topo_orders = list(nx.all_topological_sorts(problem.graph.to_networkx())) if orders else [None]
    for num in range(1, problem.max_shards + 1):
        for sizes in _compositions(problem.batch_size, num):
            for assigns in itertools.product(per_shard, repeat=num):
                if not _feasible(problem, sizes, list(assigns)):
                    continue
                for topo in topo_orders:
                    device_orders = None
                    if topo is not None:
                        device_orders = {}
                        for s in range(num):
                            for name in topo:
                                i = problem.graph.index(name)
                                device_orders.setdefault(assigns[s][i], []).append((s, i))
                    plan = make_plan(
                        problem,
                        sizes,
                        list(assigns),
                        solver="brute",
                        status="optimal",
                        started_at=time.perf_counter(),
                        lower_bound_s=0.0,
                        device_orders=device_orders,
                    )
                    best = min(best, plan.objective_s)
    return best


# -- hand-solved instances ------------------------------------------------------------------


def test_chain_on_two_identical_devices():
    times = [{"g": 1.0}, {"g": 2.0}, {"g": 3.0}]
    latency = explicit_problem(times, [(0, 1), (1, 2)])
    assert critical_path_bound(latency) == pytest.approx(6.0)
    assert load_balance_bound(latency) == pytest.approx(3.0)
    assert lower_bound(latency) == pytest.approx(6.0) == pytest.approx(brute_force_optimum(latency))
    throughput = explicit_problem(times, [(0, 1), (1, 2)], objective="throughput")
    assert critical_path_bound(throughput) == pytest.approx(3.0)  # the longest task
    assert load_balance_bound(throughput) == pytest.approx(3.0)  # 6 s of work on 2 devices
    assert lower_bound(throughput) == pytest.approx(3.0) == pytest.approx(brute_force_optimum(throughput))


def test_data_parallel_latency_bound_is_exact():
    """One task of 1 s per sample, batch 4 on two identical devices: two shards of 2 take 2 s."""
    problem = explicit_problem([{"g": 1.0}], batch=4, shards=2)
    assert critical_path_bound(problem) == pytest.approx(2.0)  # a shard of ceil(4 / 2) = 2 samples
    assert load_balance_bound(problem) == pytest.approx(2.0)
    assert brute_force_optimum(problem) == pytest.approx(2.0)
    single = explicit_problem([{"g": 1.0}], batch=4, shards=1)
    assert critical_path_bound(single) == pytest.approx(4.0)


def test_memory_rows_tighten_the_load_balance_bound():
    """Two 6 GB tasks; the fast GPU (1 s) holds 10 GB, the CPU (10 s) is unlimited.

    Without memory the LP puts 20/11 tasks on the GPU (T = 20/11); with memory at most
    10/6 of them fit, leaving 1/3 of a task for the CPU (T = 10/3)."""
    problem = explicit_problem(
        [{"gpu": 1.0, "cpu": 10.0}] * 2,
        [(0, 1)],
        kinds=(("gpu", "gpu", 10 * GB), ("cpu", "cpu", "unlimited")),
        devices={"gpu": 1, "cpu": 1},
        weights=[6 * GB, 6 * GB],
    )
    assert load_balance_bound(problem, memory=False) == pytest.approx(20 / 11)
    assert load_balance_bound(problem) == pytest.approx(10 / 3)
    assert lower_bound(problem) <= brute_force_optimum(problem, orders=True) == pytest.approx(11.0)


def test_memory_rows_dropped_when_nothing_fits():
    problem = explicit_problem([{"g": 1.0}], kinds=(("g", "gpu", 1 * GB),), weights=[5 * GB])
    assert load_balance_bound(problem) == pytest.approx(load_balance_bound(problem, memory=False)) == pytest.approx(0.5)


def test_negative_intercepts_fall_back_to_valid_rates():
    """t(b) = max(b - 0.5, 0.1 b): t(4) / 4 = 0.875 but t(1) / 1 = 0.5, so the naive rate would be too high."""
    base = explicit_problem([{"g": 1.0}], batch=4, shards=4, objective="throughput")
    pieces = np.array([[[[-0.5, 1.0], [0.0, 0.1]]] * 2])
    problem = dataclasses.replace(base, time_pieces=pieces)
    assert problem.task_time(0, 0, 1) == pytest.approx(0.5) and problem.task_time(0, 0, 4) == pytest.approx(3.5)
    assert per_sample_rates(problem)[0, 0] == pytest.approx(0.5)
    optimum = brute_force_optimum(problem)  # four shards of one sample, two per device: load 1 s per batch
    assert optimum == pytest.approx(0.25)
    assert lower_bound(problem) == pytest.approx(0.25)


# -- the merged LP is the full LP ------------------------------------------------------------


def full_lp(problem: PlacementProblem, memory: bool = True) -> float:
    """The load-balance LP over every device separately (no merging), dense, in objective units."""
    n, k = problem.num_tasks, problem.num_devices
    work = per_sample_rates(problem) * problem.batch_size
    scale = np.max(work[np.isfinite(work)])  # rows scaled to O(1): HiGHS misjudges 1e-5 s next to 1e10 B
    if scale == 0:
        return 0.0
    pairs = [(i, d) for i in range(n) for d in range(k) if np.isfinite(work[i, d])]
    cost = np.zeros(len(pairs) + 1)
    cost[-1] = 1
    a_eq = np.zeros((n, len(pairs) + 1))
    a_ub, b_ub = [], []
    for d in range(k):
        row = np.zeros(len(pairs) + 1)
        row[-1] = -1
        mem = np.zeros(len(pairs) + 1)
        for x, (i, dd) in enumerate(pairs):
            if dd == d:
                row[x] = work[i, d] / scale
                need = problem.weight_bytes[i] + problem.mem_bytes_per_sample[i] * problem.batch_size
                mem[x] = need / problem.mem_capacity[d] if problem.mem_counts[i, d] else 0.0
        a_ub.append(row)
        b_ub.append(0.0)
        if memory and np.isfinite(problem.mem_capacity[d]):
            a_ub.append(mem)
            b_ub.append(1.0)
    for x, (i, _) in enumerate(pairs):
        a_eq[i, x] = 1
    res = scipy.optimize.linprog(
        cost, A_ub=np.array(a_ub), b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(n), bounds=(0, None), method="highs"
    )
    if res.status == 2:
        return full_lp(problem, memory=False)
    assert res.status == 0, res.message
    return res.fun * scale / (problem.batch_size if problem.objective == "throughput" else 1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(max_tasks=8))
def test_merged_lp_equals_full_lp(problem):
    assert load_balance_bound(problem) == pytest.approx(full_lp(problem), rel=1e-5, abs=1e-12)


# -- never above the optimum -------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(max_tasks=4, max_devices=3, max_batch=3, objective="latency"))
def test_latency_bound_below_exact_optimum_one_shard(problem):
    """<= 4 tasks, one shard: every assignment x every device order is the exact optimum."""
    problem = dataclasses.replace(problem, max_shards=1)
    optimum = brute_force_optimum(problem, orders=True)
    if np.isfinite(optimum):
        assert lower_bound(problem) <= optimum * (1 + 1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(max_tasks=5, max_devices=3, max_batch=4))
def test_bound_below_every_single_shard_plan(problem):
    """<= 5 tasks on 2-3 devices: the bound is below every list-scheduled assignment that fits."""
    problem = dataclasses.replace(problem, max_shards=1)
    best = brute_force_optimum(problem)
    if np.isfinite(best):
        assert lower_bound(problem) <= best * (1 + 1e-9)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(max_tasks=3, max_devices=2, max_batch=4))
def test_bound_below_every_data_parallel_plan(problem):
    """<= 3 tasks, 2 devices, up to 2 shards: every split and assignment (exact for throughput)."""
    problem = dataclasses.replace(problem, max_shards=min(2, problem.batch_size))
    best = brute_force_optimum(problem)
    if np.isfinite(best):
        assert lower_bound(problem) <= best * (1 + 1e-9)
        assert critical_path_bound(problem) <= best * (1 + 1e-9)
        assert load_balance_bound(problem) <= best * (1 + 1e-9)


def test_shard_count_bound_beats_both_bounds_when_shards_pay_fixed_costs():
    """Chain a -> b on 2 identical devices, t(b) = 1 s (weights read) + 1 s per sample, Q = 4, S = 4.
    Hand-solved optimum: 2 shards of 2, one per device, 3 + 3 = 6 s (1 shard: 10 s; 4 shards:
    8 items of 2 s on 2 devices >= 8 s). The critical path of a 1-sample shard says 4 s and the
    load-balance LP 5 s; min over s of max(CP(s), LP(s)) is 6 s, at s = 2."""
    from llm_planner.placement.bounds.load import shard_lp_bound
    from llm_planner.placement.bounds.shard_count import shard_count_bound

    cluster = make_cluster([kind("g", "gpu", flops=1e19, mem_bytes=1e15, mem_bw=1e11)], [{"g": 2}], latency_s=0.0)
    tasks = tuple(Task(name=n, flops_per_sample=1.0, weight_bytes=1e11, bytes_per_sample=1e11) for n in "ab")
    graph = TaskGraph(name="chain", tasks=tasks, edges=(Edge(src="a", dst="b"),)).validate()
    problem = build_problem(graph, cluster, batch_size=4, max_shards=4)
    assert critical_path_bound(problem) == pytest.approx(4.0)
    assert load_balance_bound(problem) == pytest.approx(5.0)
    assert [shard_lp_bound(problem, s) for s in (1, 2, 3, 4)] == pytest.approx([5.0, 6.0, 7.0, 8.0])
    assert shard_count_bound(problem) == pytest.approx(6.0)
    assert lower_bound(problem) == pytest.approx(6.0) == pytest.approx(brute_force_optimum(problem, orders=True))
    throughput = dataclasses.replace(problem, objective="throughput")
    assert lower_bound(throughput) <= brute_force_optimum(throughput) * (1 + 1e-9)
