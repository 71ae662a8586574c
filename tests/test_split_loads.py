"""MILP-SPLIT's moves between devices for the throughput objective (llm_planner.placement.split.loads):
a move's load change equals a recomputation from scratch under both throughput models, plans only
improve and verify, memory is respected, hand-solved chains get their optima (one by a single move,
one only through the kicks), and the search repeats itself."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_instances import problems, random_assignment
from test_milp import explicit_problem

from llm_planner.placement.options import SolveOptions
from llm_planner.placement.schedule import device_loads, make_plan
from llm_planner.placement.solve import solve
from llm_planner.placement.split.loads import _Shard, improve_loads
from llm_planner.placement.verify import verify_plan

PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


@PROPERTY
@given(st.data())
def test_the_loads_after_moves_are_the_loads_recomputed(data):
    problem = data.draw(problems(max_tasks=8, max_devices=4, objective="throughput"))
    sizes, assigns = random_assignment(data.draw, problem)
    shard = _Shard(
        problem, sizes[0], assigns[0], np.ones(problem.num_devices, dtype=bool), np.zeros(problem.num_devices)
    )
    for _ in range(5):  # arbitrary moves, memory aside, through the same delta as the search
        n = data.draw(st.integers(0, len(shard.groups) - 1))
        able = np.flatnonzero(problem.supported[shard.groups[n]].all(axis=0))
        k = int(data.draw(st.sampled_from(able.tolist())))
        before = shard._part(n)
        shard._set(n, k)
        shard.load = shard.load - before + shard._part(n)
        np.testing.assert_allclose(
            shard.load, device_loads(problem, [sizes[0]], [shard.a]), rtol=1e-9, atol=1e-12
        )  # incremental sums: rounding of order 1e-15 s


@PROPERTY
@given(st.data())
def test_moves_never_make_a_plan_worse_and_it_verifies(data):
    problem = data.draw(problems(max_tasks=8, max_devices=4, objective="throughput"))
    sizes, assigns = random_assignment(data.draw, problem)
    if np.any(problem.device_memory_used(sizes, assigns) > problem.mem_capacity):
        return  # the search starts from plans that fit
    start = make_plan(problem, sizes, assigns, solver="test", status="heuristic", started_at=0.0, lower_bound_s=0.0)
    better = improve_loads(problem, start, 0.0)
    if better is None:
        return
    assert better.objective_s <= start.objective_s * (1 + 1e-9)
    assert verify_plan(better, problem).ok


CHAIN = {"a": {"f": 1.0, "s": 3.0}, "b": {"f": 1.0, "s": 1.5}}


def test_a_chain_moves_its_second_task_to_the_slow_device():
    # all on f: 2; b on s: f = 1 + 0.2, s = 1.5 + 0.2 (the transfer charged at both ends) = 1.7, the optimum
    problem = explicit_problem(CHAIN, ["ab"], {"f": 1, "s": 1}, comm_s=0.2, objective="throughput")
    start = make_plan(problem, [1], [[0, 0]], solver="test", status="heuristic", started_at=0.0, lower_bound_s=0.0)
    better = improve_loads(problem, start, 0.0)
    assert better is not None and better.objective_s == pytest.approx(1.7)
    assert better.shard_assignments[0]["b"].split("/")[1].startswith("s")
    assert solve(problem, SolveOptions(solver="milp-split")).objective_s == pytest.approx(1.7)


def test_the_kicks_move_two_tasks_that_no_single_move_would():
    # a -> b -> c -> d all on f: 4 (a and d run on f only). Moving b or c alone to s cuts two edges:
    # f = 3 + 2 x 0.6 = 4.2, worse, so the descent stops at 4. Both on s: f = 2 + 2 x 0.6 = 3.2, s = 2.2.
    times = {"a": {"f": 1.0}, "b": {"f": 1.0, "s": 0.5}, "c": {"f": 1.0, "s": 0.5}, "d": {"f": 1.0}}
    problem = explicit_problem(times, ["ab", "bc", "cd"], {"f": 1, "s": 1}, comm_s=0.6, objective="throughput")
    start = make_plan(
        problem, [1], [[0, 0, 0, 0]], solver="test", status="heuristic", started_at=0.0, lower_bound_s=0.0
    )
    better = improve_loads(problem, start, 0.0)
    assert better is not None and better.objective_s == pytest.approx(3.2)
    assert improve_loads(problem, start, 0.0).shard_assignments == better.shard_assignments  # seeded


def test_a_move_needs_memory_on_the_device():
    problem = explicit_problem(
        CHAIN,
        ["ab"],
        {"f": 1, "s": 1},
        comm_s=0.2,
        objective="throughput",
        mem={"f": 100.0, "s": 5.0},
        weights={"a": 1.0, "b": 10.0},
    )
    start = make_plan(problem, [1], [[0, 0]], solver="test", status="heuristic", started_at=0.0, lower_bound_s=0.0)
    assert improve_loads(problem, start, 0.0) is None
