"""Symmetry breaking never changes the optimum, only the search; it removes mirrored optima.

Small cluster: two identical servers of two identical GPUs, plus one different
server (5 devices, one server class of 2, two device classes of 2)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from milp_brute_force import brute_force
from test_symmetry_classes import small_cluster

from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.milp.symmetry import CRITERIA, satisfies, symmetry_classes
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import build_problem
from llm_planner.placement.solve import solve

CHOICES = ("none", "batch", "task", "time", "first", "solver")


def tiny_gpt_like(num_blocks: int, weight_gb: float = 30.0) -> TaskGraph:
    """embed -> blocks -> head, blocks heavy enough in memory that they must spread over GPUs."""
    tasks = [Task(name="embed", flops_per_sample=1e9, weight_bytes=1e9, bytes_per_sample=1e6)]
    tasks += [
        Task(
            name=f"block.{i}",
            flops_per_sample=2e11 * (1 + i % 2),
            weight_bytes=weight_gb * 1e9,
            bytes_per_sample=5e7,
            mem_bytes_per_sample=1e9,
        )
        for i in range(num_blocks)
    ]
    tasks += [Task(name="lm_head", flops_per_sample=5e10, weight_bytes=2e9, bytes_per_sample=1e6)]
    names = [t.name for t in tasks]
    edges = [Edge(src=a, dst=b, bytes_per_sample=4e6) for a, b in zip(names, names[1:])]
    return TaskGraph(name="tiny-gpt", tasks=tuple(tasks), edges=tuple(edges)).validate()


@pytest.mark.parametrize("objective", ["latency", "throughput"])
@pytest.mark.parametrize("batch, shards", [(1, 1), pytest.param(2, 2, marks=pytest.mark.milp)])
def test_every_criterion_reaches_the_brute_force_optimum(objective, batch, shards):
    problem = build_problem(tiny_gpt_like(2), small_cluster(), objective=objective, batch_size=batch, max_shards=shards)
    best = brute_force(problem)
    for criterion in CHOICES:
        for solver in ("milp", "milp-split"):
            plan = solve(problem, SolveOptions(solver=solver, symmetry=criterion, time_limit_s=60, rel_gap=1e-7))
            if solver == "milp":
                assert "optimal" in (plan.solver.status, plan.solver.details.get("solver_status")), criterion
                assert plan.objective_s == pytest.approx(best, rel=1e-6), (criterion, solver)
            else:
                assert plan.objective_s >= best * (1 - 1e-6)


def _optimal_assignments(problem):
    """Every single-shard assignment whose objective is optimal (the plan's own schedule decides)."""
    from llm_planner.placement.schedule import make_plan

    best, optima = None, []
    choices = [np.flatnonzero(problem.supported[i]).tolist() for i in range(problem.num_tasks)]
    for combo in itertools.product(*choices):
        used = problem.device_memory_used([problem.batch_size], [list(combo)])
        if (used > problem.mem_capacity).any():
            continue
        plan = make_plan(
            problem, [problem.batch_size], [list(combo)], solver="enum", status="h", started_at=0.0, lower_bound_s=0.0
        )
        value = round(plan.objective_s, 15)
        if best is None or value < best - 1e-15:
            best, optima = value, [list(combo)]
        elif abs(value - best) <= 1e-15:
            optima.append(list(combo))
    return optima


@pytest.mark.parametrize("criterion", CRITERIA)
def test_symmetry_rows_keep_one_of_the_mirrored_optima(criterion):
    # one heavy task that fits only on the big GPUs: its 4 mirrored optima differ only by which
    # interchangeable GPU of which interchangeable server holds it
    task = Task(name="only", flops_per_sample=1e12, weight_bytes=60e9)
    problem = build_problem(TaskGraph(name="one", tasks=(task,), edges=()), small_cluster(), objective="throughput")
    optima = _optimal_assignments(problem)
    assert len(optima) == 4
    classes = symmetry_classes(problem.cluster)
    kept = [a for a in optima if satisfies(problem, classes, criterion, [1], [a])]
    assert len(kept) == 1 and kept[0] == [0]
    plan = solve(problem, SolveOptions(solver="milp", symmetry=criterion, time_limit_s=30))
    assert plan.assignment["only"] == problem.device_names[0]


def test_mirrored_pairs_of_tasks():
    # two heavy tasks in a chain: placements on (server, gpu) pairs are mirrored; rows keep the ones
    # that load the first GPU of the first server most
    problem = build_problem(tiny_gpt_like(2, weight_gb=50.0), small_cluster(), objective="throughput")
    optima = _optimal_assignments(problem)
    classes = symmetry_classes(problem.cluster)
    assert len(optima) > 1
    for criterion in CRITERIA:
        kept = [a for a in optima if satisfies(problem, classes, criterion, [1], [a])]
        assert 1 <= len(kept) < len(optima), criterion


def _mirror_group(problem):
    """Every permutation of the small cluster's symmetry group (order 8): swap the GPUs inside
    either twin server, and swap the two twin servers."""
    perms = []
    for swap_servers, swap_a, swap_b in itertools.product((False, True), repeat=3):
        perm = list(range(problem.num_devices))
        if swap_a:
            perm[0], perm[1] = perm[1], perm[0]
        if swap_b:
            perm[2], perm[3] = perm[3], perm[2]
        if swap_servers:
            perm = [{0: 2, 1: 3, 2: 0, 3: 1}.get(k, k) for k in perm]
        perms.append(perm)
    return perms


def test_every_orbit_of_mirrored_optima_keeps_a_plan_and_first_keeps_exactly_one():
    problem = build_problem(tiny_gpt_like(2, weight_gb=50.0), small_cluster(), objective="throughput")
    optima = {tuple(a) for a in _optimal_assignments(problem)}
    group = _mirror_group(problem)
    orbits = {frozenset(tuple(perm[k] for k in a) for perm in group) for a in optima}
    assert all(orbit <= optima for orbit in orbits) and len(optima) > len(orbits)
    classes = symmetry_classes(problem.cluster)
    for criterion in CRITERIA:
        for orbit in orbits:
            kept = [a for a in orbit if satisfies(problem, classes, criterion, [1], [list(a)])]
            assert kept, (criterion, sorted(orbit))  # the rows never remove a whole orbit
            if criterion == "first":
                assert len(kept) == 1, sorted(orbit)


@pytest.mark.parametrize("criterion", CRITERIA)
def test_pinned_devices_are_not_treated_as_interchangeable(criterion):
    # a MILP-SPLIT subproblem whose input and output are pinned to the second GPU of the second
    # twin server: the rows must not force work onto the first GPU of the first server
    import numpy as np

    from llm_planner.placement.milp.milp import solve_milp
    from llm_planner.placement.milp.symmetry import problem_classes
    from llm_planner.placement.split.subproblem import build_subproblem

    problem = build_problem(tiny_gpt_like(3, weight_gb=10.0), small_cluster(), objective="latency")
    sub, _ = build_subproblem(problem, (2, 3), 1, 3, 3, np.ones(problem.num_devices, dtype=bool), 1)
    # devices 0 and 1 stay interchangeable; 2 and 3, and the two twin servers, no longer are
    assert problem_classes(sub).devices == ((0, 1),) and problem_classes(sub).servers == ()
    reference = solve_milp(sub, SolveOptions(solver="milp", time_limit_s=30, rel_gap=1e-7))
    plan = solve_milp(sub, SolveOptions(solver="milp", symmetry=criterion, time_limit_s=30, rel_gap=1e-7))
    assert plan.solver.status == reference.solver.status == "optimal"
    assert plan.objective_s == pytest.approx(reference.objective_s, rel=1e-6)
