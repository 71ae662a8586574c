"""MILP-SPLIT's heuristic path: the local search's evaluation equals the scheduler's,
moves (and the iterated search) never make a module worse, shared HEFT bounds stay valid,
seeding the DP with the best baseline's modules keeps the split at or below that baseline,
solutions carried between symmetric device pairs land on the pair asked for, and the
module chain bound of a batch that may be split stays below every plan."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_instances import clusters, graphs, kind, make_cluster
from test_bounds import brute_force_optimum
from test_bounds_path import tight_memory_problems
from test_split import diamond_chain

from llm_planner.placement.baselines.single import run_baseline
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import build_problem
from llm_planner.placement.schedule import asap_schedule
from llm_planner.placement.solve import solve
from llm_planner.placement.split.chain import assemble, latency_chain, seed_from_plan, shard_chain_bound
from llm_planner.placement.split.moves import ListMakespan, improve_by_moves
from llm_planner.placement.split.split_context import SplitContext
from llm_planner.placement.split.subproblem import build_subproblem

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _random_assignment(data, problem) -> list[int]:
    a = [data.draw(st.sampled_from(np.nonzero(problem.supported[i])[0].tolist())) for i in range(problem.num_tasks)]
    for group in problem.colocate_groups():
        k = data.draw(st.sampled_from([k for k in range(problem.num_devices) if problem.supported[group, k].all()]))
        for i in group:
            a[i] = k
    return a


@SETTINGS
@given(data=st.data(), cluster=clusters(max_devices=4), batch=st.integers(1, 8))
def test_list_makespan_equals_asap_schedule(data, cluster, batch):
    graph = data.draw(graphs(cluster, max_tasks=12))
    problem = build_problem(graph, cluster, objective="latency", batch_size=batch, max_shards=1)
    a = _random_assignment(data, problem)
    _, finish = asap_schedule(problem, [batch], [a])
    assert ListMakespan(problem)(a) == max(finish.values())


@SETTINGS
@given(data=st.data(), cluster=clusters(max_devices=4), batch=st.integers(1, 8))
def test_the_critical_chain_spans_the_makespan(data, cluster, batch):
    """The chain the iterated search moves tasks on: from a task that starts at 0 to the last to
    finish, each link either the device's previous task or the producer whose data came last;
    its task times and the transfers on its producer links add up to the makespan."""
    graph = data.draw(graphs(cluster, max_tasks=12))
    problem = build_problem(graph, cluster, objective="latency", batch_size=batch, max_shards=1)
    a = _random_assignment(data, problem)
    makespan = ListMakespan(problem)
    total = makespan(a)
    chain = makespan.critical()[::-1]
    times = task_times(problem, batch)
    span = sum(times[i, a[i]] for i in chain)
    for u, v in zip(chain, chain[1:]):
        if makespan.before[v] == u:
            assert a[u] == a[v]
        else:
            assert makespan.producer[v] == u
            edges = [e for e in range(problem.num_edges) if problem.edge_src[e] == u and problem.edge_dst[e] == v]
            span += (
                0.0
                if a[u] == a[v]
                else max(problem.comm_fixed[e, a[u], a[v]] + problem.comm_slope[e, a[u], a[v]] * batch for e in edges)
            )
    assert span == pytest.approx(total, rel=1e-9, abs=1e-12)


@SETTINGS
@given(data=st.data(), cluster=clusters(max_devices=3), batch=st.integers(1, 4), kicks=st.booleans())
def test_moves_never_worsen_and_keep_the_rules(data, cluster, batch, kicks):
    graph = data.draw(graphs(cluster, min_tasks=2, max_tasks=10, explicit=False))
    problem = build_problem(graph, cluster, objective="latency", batch_size=batch, max_shards=1)
    start = _random_assignment(data, problem)
    if np.any(problem.device_memory_used([batch], [start]) > problem.mem_capacity):
        return  # the search keeps memory within capacity only from a plan that fits
    moved = improve_by_moves(problem, start, max_evaluations=200, kicks=kicks)
    makespan = ListMakespan(problem)
    assert makespan(moved) <= makespan(start)
    if kicks:  # the iterated search spends its budget beyond the first descent and never ends above it
        assert makespan(moved) <= makespan(improve_by_moves(problem, start, max_evaluations=200))
        assert improve_by_moves(problem, start, max_evaluations=200, kicks=True) == moved  # seeded
    assert all(problem.supported[i, k] for i, k in enumerate(moved))
    for group in problem.colocate_groups():
        assert len({moved[i] for i in group}) == 1
    assert np.all(problem.device_memory_used([batch], [moved]) <= problem.mem_capacity * (1 + 1e-12))


def _two_kind_problem(widths: list[int], batch: int = 1):
    cluster = make_cluster(
        [
            kind("fast", "gpu", flops=1e14, mem_bytes="unlimited", mem_bw=1e12, overhead_s=1e-5),
            kind("slow", "gpu", flops=3e13, mem_bytes="unlimited", mem_bw=4e11, overhead_s=1e-5),
        ],
        [{"fast": 2, "slow": 1}],
        bw=5e9,
        latency_s=1e-5,
    )
    graph = diamond_chain(widths, [4e11, 1e11, 7e11, 2e11, 5e10], [1e6, 2e7, 4e6])
    return build_problem(graph, cluster, objective="latency", batch_size=batch, max_shards=1)


@pytest.mark.milp
def test_heft_modules_bounds_stay_below_the_exact_optimum():
    problem = _two_kind_problem([3, 2, 3])
    exact = solve(problem, SolveOptions(solver="milp", time_limit_s=60.0, rel_gap=1e-7))
    assert "optimal" in (exact.solver.status, exact.solver.details.get("solver_status"))
    for workers in (1, 2):  # HEFT path (modules above max_module_tasks), bounds shared over input devices
        split = solve(problem, SolveOptions(solver="milp-split", max_module_tasks=1, workers=workers))
        assert split.lower_bound_s <= exact.objective_s * (1 + 1e-9)
        assert split.objective_s >= exact.objective_s * (1 - 1e-9)


def test_one_run_starts_one_pool_and_ends_it(monkeypatch):
    from llm_planner.placement.split import pool

    started = []
    real = pool.make_executor

    def counting(options, num_jobs, problem):
        executor = real(options, num_jobs, problem)
        if executor is not None:
            started.append(executor)
        return executor

    monkeypatch.setattr(pool, "make_executor", counting)
    solve(_two_kind_problem([4, 3, 4, 2]), SolveOptions(solver="milp-split", max_module_tasks=1, workers=2))
    assert len(started) == 1  # the prefetch, the DP's later batches, the search and the bounds share it
    with pytest.raises(RuntimeError):  # and it was shut down at the end of the run
        started[0].submit(int)


def test_serial_and_pool_agree_on_the_heuristic_path():
    problem = _two_kind_problem([4, 3, 4, 2])
    serial = solve(problem, SolveOptions(solver="milp-split", max_module_tasks=1, workers=1))
    pooled = solve(problem, SolveOptions(solver="milp-split", max_module_tasks=1, workers=2))
    assert serial.shard_assignments == pooled.shard_assignments
    assert serial.objective_s == pooled.objective_s
    assert serial.lower_bound_s == pytest.approx(pooled.lower_bound_s, rel=1e-9)


def test_seeded_chain_is_never_above_the_seeding_plan(repo):
    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.inputs import problem_from_inputs

    # on this instance the subproblems' own HEFT + moves end above the whole-graph HEFT (measured)
    problem = problem_from_inputs(
        cluster_path=str(repo / "cluster_specs/four-gpus.yaml"), model=ModelSpec(name="rwnn-ws-3x16")
    )
    heft = run_baseline("heft", problem)
    ctx = SplitContext(problem, SolveOptions(solver="milp-split", max_module_tasks=1, workers=1))
    seed_from_plan(ctx, heft)
    assert ctx.seeds, "every multi-task module of the HEFT plan is offered to the DP"
    found = latency_chain(ctx, problem.batch_size, np.ones(problem.num_devices, dtype=bool))
    assert found is not None
    assert found[1] <= heft.objective_s * (1 + 1e-9)


def test_a_module_subproblem_pins_its_cut_devices():
    problem = _two_kind_problem([3])
    ctx = SplitContext(problem, SolveOptions(solver="milp-split"))
    module = next(m for m in ctx.modules if len(m.tasks) > 1)
    sub, local = build_subproblem(problem, module.tasks, module.input_task, 2, 1, np.ones(3, dtype=bool), 1)
    assert local[0] == module.input_task and sub.supported[0].tolist() == [False, False, True]
    assert sub.supported[-1].tolist() == [False, True, False]
    assert sub.time_pieces[0].max() == 0.0 and sub.weight_bytes[0] == 0.0


def test_solutions_land_on_the_pair_asked_for_and_searched_costs_are_their_schedules():
    problem = _two_kind_problem([4, 3, 4, 2])  # devices: fast:0, fast:1 (interchangeable), slow:0
    ctx = SplitContext(problem, SolveOptions(solver="milp-split", max_module_tasks=1, workers=1))
    allowed = np.ones(problem.num_devices, dtype=bool)
    ctx.prefetch(allowed, 1)  # solves (fast:0 -> fast:1) for the key that (fast:1 -> fast:0) shares
    for j, module in enumerate(ctx.modules):
        if module.input_task is None or len(module.tasks) == 1:
            continue
        for inputs in ([0, 1, 2], [1], [2, 1]):  # the DP drops inputs it cannot reach; any subset may come
            table = ctx.costs(j, allowed, 1, inputs)
            for k in inputs:
                for b, l in enumerate(table.outs):
                    assert table.solution(inputs.index(k), b).devices[-1] == l
    ctx.search = True
    found = latency_chain(ctx, 1, allowed)
    assert found is not None and ctx.intensified, "the DP's picks were searched"
    prev = None
    for module, sol in zip(ctx.modules, found[0]):
        if module.input_task is not None and sol.method.endswith("+ils"):
            sub, _ = build_subproblem(problem, module.tasks, module.input_task, prev, sol.devices[-1], allowed, 1)
            assert ListMakespan(sub)([prev, *sol.devices]) == pytest.approx(sol.cost_s, rel=1e-12)
        prev = sol.devices[-1]
    assign, _ = assemble(ctx, found[0])
    _, finish = asap_schedule(problem, [1], [assign])
    assert max(finish.values()) <= found[1] * (1 + 1e-9)


@pytest.mark.slow  # brute force over every split and assignment: minutes on 2 cores
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=tight_memory_problems(max_tasks=3, max_batch=4))
def test_shard_chain_bound_below_every_split_plan(problem):
    """<= 3 tasks, up to 3 shards, memory binding: below the best of every split and assignment that fits."""
    problem = dataclasses.replace(problem, max_shards=min(3, problem.batch_size))
    if problem.max_shards < 2:
        return
    from unittest import mock

    from llm_planner.placement.split import chain

    best = brute_force_optimum(problem)
    bound = shard_chain_bound(SplitContext(problem, SolveOptions(solver="milp-split", workers=1)))
    with mock.patch.object(
        chain, "MAX_CHAIN_BATCHES", 1
    ):  # the shard counts past the first chain count with LP(s) alone
        capped = shard_chain_bound(SplitContext(problem, SolveOptions(solver="milp-split", workers=1)))
    if np.isfinite(best):
        assert bound <= best * (1 + 1e-9)
        assert capped <= best * (1 + 1e-9)


@pytest.mark.heavy
def test_a_split_batch_carries_the_module_chain_bound(repo):
    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.inputs import problem_from_inputs

    # 34 tasks in 15 modules on a CPU, an A100 and a T4, batch 2 in up to 2 shards: here the
    # module bounds at one sample (s = 2) and two (s = 1) add up to more than any whole-graph bound
    problem = problem_from_inputs(
        cluster_path=str(repo / "cluster_specs/cpu-two-gpus.yaml"), model=ModelSpec(name="rwnn-ws-3x8"), batch_size=2
    )
    assert problem.max_shards == 2
    ctx = SplitContext(problem, SolveOptions(solver="milp-split", workers=1))
    chain, whole = shard_chain_bound(ctx), lower_bound(problem)
    assert chain > whole * (1 + 1e-3)
    plan = solve(problem, SolveOptions(solver="milp-split", workers=1))
    assert plan.solver.details["solver_bound_s"] >= chain * (1 - 1e-9)  # kept as a record beside lower_bound_s
    assert plan.lower_bound_s == pytest.approx(whole, rel=1e-12)  # what verify re-derives
