"""The exact MILP: hand-solved optima, brute force on random instances, backends, limits, workloads.

Every MILP plan here goes through solve.api.solve, so the independent verifier
checks it and its bound; `check_plan` adds: the verifier's simulated objective
equals the plan's, the MILP's own objective equals the plan's when optimal, and
lower bound <= MILP <= every baseline.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest
from conftest import WORKLOADS as DNN_PARTITIONING
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from milp_brute_force import brute_force, brute_throughput
from planner_instances import graphs, kind, make_cluster, problems

from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.mip import backends
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.milp import milp as milp_module
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem, ProblemError, build_problem
from llm_planner.placement.session import SolveSession
from llm_planner.placement.solve import SolveError, solve
from llm_planner.placement.verify import verify_plan

GB = 1e9
REL = 1e-6
EXACT = {"solver": "milp", "rel_gap": 1e-7, "time_limit_s": 60.0}
WORKLOADS = DNN_PARTITIONING / "throughput-inputs"
PROPERTY = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# -- instances -------------------------------------------------------------------------


def explicit_problem(
    times: dict[str, dict[str, float]],
    edges: list[str],
    devices: dict[str, int],
    *,
    comm_s: float = 0.5,
    mem: dict[str, float] | None = None,
    weights: dict[str, float] | None = None,
    **build,
) -> PlacementProblem:
    """Tasks with explicit seconds per sample per device kind; every edge moves 1 byte per sample over a
    link of 1 / comm_s bytes per second, so a cut edge costs comm_s per sample."""
    mem = mem or {}
    kinds = [kind(name, "gpu", flops=1e12, mem_bytes=mem.get(name, 1e15), mem_bw=1e12) for name in devices]
    cluster = make_cluster(kinds, [devices], bw=1.0 / comm_s, latency_s=0.0)
    tasks = tuple(
        Task(name=n, time_s_by_kind=tuple(t.items()), weight_bytes=(weights or {}).get(n, 0.0))
        for n, t in times.items()
    )
    graph = TaskGraph(
        name="hand", tasks=tasks, edges=tuple(Edge(src=e[0], dst=e[1], bytes_per_sample=1.0) for e in edges)
    ).validate()
    return build_problem(graph, cluster, **build)


def exact(problem: PlacementProblem, **options):
    plan = solve(problem, SolveOptions(**{**EXACT, **options}))
    check_plan(problem, plan)
    if options.get("contiguous"):
        assert is_contiguous(problem, plan)
    return plan


def is_contiguous(problem: PlacementProblem, plan) -> bool:
    """No path leaves a device's task set (per shard) and comes back into it."""
    graph = problem.graph.to_networkx()
    for assignment in plan.shard_assignments:
        for device in set(assignment.values()):
            inside = {t for t, d in assignment.items() if d == device}
            after = set().union(*(nx.descendants(graph, t) for t in inside)) - inside
            if any(nx.descendants(graph, t) & inside for t in after):
                return False
    return True


def check_plan(problem: PlacementProblem, plan) -> None:
    """Verified, objective re-simulated, and lower bound <= MILP <= every baseline the MILP could have
    returned (with --contiguous, the contiguous baseline plans)."""
    report = verify_plan(plan, problem)
    assert report.ok, report.violations
    assert report.simulated_objective_s == pytest.approx(plan.objective_s, rel=REL)
    if plan.solver.status == "optimal" and "stopped" not in plan.solver.details:  # else no model was solved
        assert plan.solver.details["milp_objective_s"] == pytest.approx(plan.objective_s, rel=1e-4, abs=1e-12)
    tol = REL * plan.objective_s + 1e-12
    assert lower_bound(problem) <= plan.objective_s + tol
    assert plan.lower_bound_s <= plan.objective_s + tol
    accuracy = 1e-4 * plan.objective_s + 1e-12  # the solvers' integrality tolerance times the big-M rows
    for name, base in SolveSession(problem).baselines.items():
        if base is not None and (not plan.solver.details["contiguous"] or is_contiguous(problem, base)):
            assert plan.objective_s <= base.objective_s + accuracy, f"baseline {name} beats the MILP"


def on(plan, task: str, shard: int = 0) -> str:
    return plan.shard_assignments[shard][task].split("/")[1].split(":")[0]


# -- hand-solved optima ------------------------------------------------------------------

CHAIN = {"a": {"f": 1.0, "s": 5.0}, "b": {"f": 5.0, "s": 1.0}, "c": {"f": 1.0, "s": 5.0}}


def test_chain_on_two_devices_latency():
    # all on f: 7; a f, b s, c f: 1 + 0.5 + 1 + 0.5 + 1 = 4 (the other six placements: >= 7)
    plan = exact(explicit_problem(CHAIN, ["ab", "bc"], {"f": 1, "s": 1}))
    assert plan.objective_s == pytest.approx(4.0, rel=REL)
    assert [on(plan, t) for t in "abc"] == ["f", "s", "f"]
    # proven by the MILP's own dual bound (a record: plan.lower_bound_s is what verify re-derives)
    assert plan.solver.details["solver_status"] == "optimal"
    assert plan.solver.details["solver_bound_s"] == pytest.approx(4.0)


def test_chain_on_two_devices_throughput():
    # f: a + c + two cut edges charged at both ends = 1 + 1 + 0.5 + 0.5 = 3; s: 1 + 1 = 2
    plan = exact(explicit_problem(CHAIN, ["ab", "bc"], {"f": 1, "s": 1}, objective="throughput"))
    assert plan.objective_s == pytest.approx(3.0, rel=REL)
    assert plan.max_load_s == pytest.approx(3.0, rel=REL)


FORK = {"a": {"g": 1.0}, "b": {"g": 4.0}, "c": {"g": 4.0}, "d": {"g": 1.0}}


def test_fork_join_split_across_devices_wins():
    # one device: 10. a, c on g0 and b, d on g1: b starts at 1.5, ends 5.5; d starts at
    # max(5 + 0.5, 5.5) = 5.5 and ends 6.5; the path a-b-d alone is 6 plus a transfer.
    problem = explicit_problem(FORK, ["ab", "ac", "bd", "cd"], {"g": 2})
    plan = exact(problem)
    assert plan.objective_s == pytest.approx(6.5, rel=REL)
    assert on(plan, "b") == on(plan, "c") and plan.shard_assignments[0]["b"] != plan.shard_assignments[0]["c"]
    assert exact(
        dataclasses.replace(problem, supported=problem.supported & np.array([True, False]))
    ).objective_s == pytest.approx(10.0)


def test_fork_join_throughput():
    # {a, b} | {c, d}: 5 of work plus two cut edges at 0.5 each on both devices = 6
    plan = exact(explicit_problem(FORK, ["ab", "ac", "bd", "cd"], {"g": 2}, objective="throughput"))
    assert plan.objective_s == pytest.approx(6.0, rel=REL)


ONE = {"t": {"f": 1.0, "s": 3.0}}


@pytest.mark.parametrize("objective, split, whole", [("latency", 3.0, 4.0), ("throughput", 0.75, 1.0)])
def test_batch_of_four_data_parallelism_wins(objective, split, whole):
    # 3 samples on f (3 s) and 1 on s (3 s) beat 4 on f (4 s); throughput: max load 3 per 4 samples
    plan = exact(explicit_problem(ONE, [], {"f": 1, "s": 1}, objective=objective, batch_size=4))
    assert plan.objective_s == pytest.approx(split, rel=REL)
    assert sorted(plan.shard_sizes, reverse=True) == [3, 1]
    single = exact(explicit_problem(ONE, [], {"f": 1, "s": 1}, objective=objective, batch_size=4, max_shards=1))
    assert single.objective_s == pytest.approx(whole, rel=REL) and single.shard_sizes == (4,)


def test_fixed_cost_per_shard_is_exact():
    # t_f(b) = max(1 + 0.25 b, 0.5 b), t_s = 2 t_f: 4 on f = 2.0; 3 + 1 = max(1.75, 2.5); 2 + 2 = max(1.5, 3)
    problem = explicit_problem(ONE, [], {"f": 1, "s": 1}, batch_size=4)
    pieces = np.array([[[1.0, 0.25], [0.0, 0.5]], [[2.0, 0.5], [0.0, 1.0]]])[None]
    problem = dataclasses.replace(problem, time_pieces=pieces)
    plan = exact(problem)
    assert plan.objective_s == pytest.approx(2.0, rel=REL) and plan.shard_sizes == (4,)
    assert exact(dataclasses.replace(problem, objective="throughput")).objective_s == pytest.approx(0.5, rel=REL)


PAIR = {"a": {"f": 1.0, "s": 2.0}, "b": {"f": 1.0, "s": 2.0}}


def test_memory_limit_forces_a_split():
    # 10 GB each; f holds 16 GB: one task per device, 1 + 0.5 + 2 = 3.5 (2.0 without the limit)
    weights = {"a": 10 * GB, "b": 10 * GB}
    free = exact(explicit_problem(PAIR, ["ab"], {"f": 1, "s": 1}, weights=weights))
    assert free.objective_s == pytest.approx(2.0, rel=REL)
    plan = exact(explicit_problem(PAIR, ["ab"], {"f": 1, "s": 1}, weights=weights, mem={"f": 16 * GB}))
    assert plan.objective_s == pytest.approx(3.5, rel=REL)
    assert {on(plan, "a"), on(plan, "b")} == {"f", "s"}


def test_infeasible_task_names_device_and_shortfall():
    problem = explicit_problem(
        PAIR, ["ab"], {"f": 1, "s": 1}, weights={"a": 10 * GB, "b": 1 * GB}, mem={"f": 8 * GB, "s": 9 * GB}
    )
    with pytest.raises(SolveError, match=r"'a'.*node0/s:0.*short by 1 GB"):
        solve(problem, SolveOptions(**EXACT))


def test_infeasible_packing_is_proved_by_the_milp():
    # three 5 GB tasks, two 8 GB devices: each fits, 15 <= 16 in total, but no packing exists
    tasks = {n: {"f": 1.0} for n in "abc"}
    problem = explicit_problem(tasks, ["ab", "bc"], {"f": 2}, weights={n: 5 * GB for n in "abc"}, mem={"f": 8 * GB})
    with pytest.raises(
        SolveError, match=r"no placement fits in device memory.*no assignment packs.*node0/f:0 7.45 GiB"
    ):
        solve(problem, SolveOptions(**EXACT))


def test_contiguous_needs_throughput():
    with pytest.raises(ProblemError, match="throughput objective only"):
        solve(explicit_problem(CHAIN, ["ab", "bc"], {"f": 1, "s": 1}), SolveOptions(**EXACT, contiguous=True))


# -- brute force, written independently of the MILP ---------------------------------------


def _on_a_memory_edge(problem: PlacementProblem, contiguous: bool) -> bool:
    """Whether the optimum changes when every capacity moves by 1e-5 of itself: the solvers
    accept a binary within 1e-6 of integral, so a placement filling a device to within that
    may be taken or refused (hypothesis shrinks memory to exactly such edges)."""
    values = [
        brute_force(dataclasses.replace(problem, mem_capacity=problem.mem_capacity * f), contiguous=contiguous)
        for f in (1 - 1e-5, 1 + 1e-5)
    ]
    return values[0] != pytest.approx(values[1], rel=1e-9, abs=1e-15)


def assert_matches_brute_force(problem: PlacementProblem, **options) -> None:
    assume(not _on_a_memory_edge(problem, options.get("contiguous", False)))
    expected = brute_force(problem, contiguous=options.get("contiguous", False))
    if math.isinf(expected):
        with pytest.raises(SolveError, match="no placement fits"):
            solve(problem, SolveOptions(**{**EXACT, **options}))
        return
    plan = exact(problem, **options)
    assert plan.objective_s == pytest.approx(expected, rel=1e-4, abs=1e-12)


@PROPERTY
@given(problems(max_tasks=6, max_devices=3, max_batch=1))
def test_random_single_sample_matches_brute_force(problem):
    assert_matches_brute_force(problem)


@PROPERTY
@given(problems(max_tasks=3, max_devices=2, max_batch=3))
def test_random_data_parallel_matches_brute_force(problem):
    assert_matches_brute_force(problem)


@PROPERTY
@given(problems(max_tasks=6, max_devices=3, max_batch=1, objective="throughput"))
def test_random_contiguous_throughput_matches_brute_force(problem):
    assert_matches_brute_force(problem, contiguous=True)


def steady_state_problem() -> PlacementProblem:
    """Host-staged throughput on two GPUs (2 GB) and a CPU (3.4 GB): t4 (3.15 GB of weights, 0.14 GB per
    sample, counted everywhere) fits only the CPU, and there one batch only. The best plans for one batch
    (0.0451 s) need two batches in flight; the best that needs one is 0.051 s."""
    kinds = [kind(n, t, flops=1e12, mem_bytes=m * GB, mem_bw=1e12) for n, t, m in GPU_GPU_CPU]
    ms = {"t0": (10, 74, 45), "t1": (47, 17, 20), "t2": (20, 22, 1), "t3": (33, 27, 20), "t4": (87, 35, 25)}
    ms["t5"] = (73, 61, 0.1)
    tasks = tuple(
        Task(
            name=n,
            time_s_by_kind=tuple((k[0], t / 1000) for k, t in zip(GPU_GPU_CPU, times)),
            mem_device_types=() if n == "t4" else ("gpu", "accelerator"),
            weight_bytes=3.15 * GB if n == "t4" else 0.0,
            mem_bytes_per_sample=0.14 * GB if n == "t4" else 0.0,
        )
        for n, times in ms.items()
    )
    edges = (
        Edge(src="t0", dst="t1", bytes_per_sample=0.0, hop_s_per_sample=0.012),
        Edge(src="t0", dst="t4", bytes_per_sample=0.0, hop_s_per_sample=0.0001),
    )
    graph = TaskGraph(name="steady", tasks=tasks, edges=edges).validate()
    cluster = make_cluster(kinds, [{"g0": 1, "g1": 1, "c": 1}], latency_s=0.0)
    return build_problem(graph, cluster, objective="throughput", batch_size=1, max_shards=1)


GPU_GPU_CPU = [("g0", "gpu", 2.0), ("g1", "gpu", 2.0), ("c", "cpu", 3.4)]


def test_throughput_optimum_is_over_plans_whose_steady_state_fits(monkeypatch):
    problem = steady_state_problem()
    one_batch = dataclasses.replace(problem, mem_bytes_per_sample=problem.mem_bytes_per_sample * 0)
    assert brute_force(one_batch) == pytest.approx(0.0451) and brute_force(problem) == pytest.approx(0.051)
    # the MILP cuts off each plan whose steady state does not fit and solves again
    plan = exact(problem)
    assert plan.objective_s == pytest.approx(0.051) and plan.batches_in_flight == 1
    assert plan.solver.details["excluded_plans"] >= 1
    # without the cuts the memory of two batches fits no plan, and the warm start (heft, 0.056 s) is kept,
    # its details complete (contiguous: false)
    monkeypatch.setattr(milp_module, "MAX_EXCLUDED", 0)
    plan = exact(problem)
    assert plan.objective_s == pytest.approx(0.056) and plan.solver.details["contiguous"] is False


TWO_NODES = make_cluster(
    [
        kind("a", "gpu", flops=1e14, mem_bytes=1e12, mem_bw=1e12),
        kind("b", "gpu", flops=5e13, mem_bytes=1e12, mem_bw=5e11),
    ],
    [{"a": 1, "b": 1}, {"a": 2}],
    bw=1e9,
    latency_s=2e-5,
)


@PROPERTY
@given(graphs(TWO_NODES, max_tasks=5), st.sampled_from(["latency", "throughput"]))
def test_link_dependent_transfers_on_two_nodes_match_brute_force(graph, objective):
    """Four devices on two nodes: a device's partners fall into groups of one link cost (the rows of (5)
    and (10) are written per group, not per device pair), and the optimum is still exact."""
    assert_matches_brute_force(build_problem(graph, TWO_NODES, objective=objective, batch_size=1, max_shards=1))


def test_cost_groups_gather_the_partners_of_one_link_cost():
    from llm_planner.placement.milp.cost_terms import cost_groups

    fixed = np.array([[0, 1, 2, 2], [1, 0, 2, 2], [2, 2, 0, 1], [2, 2, 1, 0]], dtype=float)
    slope = np.where(fixed > 0, 0.5, 0.0)
    assert cost_groups(fixed, slope, [0, 2], [0, 1, 2, 3]) == [
        (0, 1.0, 0.5, [1]),
        (0, 2.0, 0.5, [2, 3]),
        (2, 2.0, 0.5, [0, 1]),
        (2, 1.0, 0.5, [3]),
    ]
    assert cost_groups(fixed, slope, [1], [1]) == []  # only itself: nothing to charge
    free = np.zeros((2, 2))
    assert cost_groups(free, free, [0], [1]) == []  # a free link has no charge


def chain_problem() -> PlacementProblem:
    times = {f"l{j}": {"f": f, "s": s} for j, (f, s) in enumerate([(2, 3), (5, 6), (1, 4), (3, 3), (4, 9), (2, 2.5)])}
    return explicit_problem(
        times, [(f"l{j}", f"l{j + 1}") for j in range(5)], {"f": 2, "s": 1}, comm_s=0.25, objective="throughput"
    )


def contiguous_splits_optimum(p: PlacementProblem) -> float:
    """Every way to cut the chain into at most K intervals, each on its own device."""
    n, best = p.num_tasks, math.inf
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, n), c) for c in range(p.num_devices)):
        bounds = [0, *cuts, n]
        for devices in itertools.permutations(range(p.num_devices), len(bounds) - 1):
            assign = np.repeat(devices, np.diff(bounds))
            best = min(best, brute_throughput(p, (1,), assign[None]))
    return best


def test_chain_throughput_equals_contiguous_splits():
    problem = chain_problem()
    expected = contiguous_splits_optimum(problem)
    plan = exact(problem, contiguous=True)
    assert plan.objective_s == pytest.approx(expected, rel=1e-6)
    assert plan.solver.details["contiguous"] is True
    free = exact(problem)
    assert free.objective_s <= expected + 1e-9
    assert free.objective_s == pytest.approx(brute_force(problem), rel=1e-6)


# -- backends ----------------------------------------------------------------------------


@PROPERTY
@given(problems(max_tasks=5, max_devices=3, max_batch=2))
def test_highs_and_gurobi_agree(problem):
    pytest.importorskip("gurobipy")
    try:
        highs = solve(problem, SolveOptions(**EXACT))
    except SolveError:
        with pytest.raises(SolveError):
            solve(problem, SolveOptions(**EXACT, backend="gurobi"))
        return
    gurobi = solve(problem, SolveOptions(**EXACT, backend="gurobi"))
    assert gurobi.solver.backend == "gurobi" and highs.solver.backend == "highs"
    assert (
        gurobi.solver.details.get("num_vars", 0) <= backends.GUROBI_SIZE_LIMIT
    )  # no model when the warm start is proven
    assert gurobi.objective_s == pytest.approx(highs.objective_s, rel=1e-4, abs=1e-12)


def wide_problem(num_tasks: int = 700) -> PlacementProblem:
    """Independent tasks on three devices: 3 * num_tasks assignment variables."""
    return explicit_problem(
        {f"t{j}": {"f": 1.0 + j % 3, "s": 2.0} for j in range(num_tasks)}, [], {"f": 2, "s": 1}, objective="throughput"
    )


def test_gurobi_size_limited_licence_is_reported():
    pytest.importorskip("gurobipy")
    with pytest.raises(
        SolveError,
        match=r"gurobi refused the model: it has \d+ variables.*size-limited licence.*--allow-backend-fallback",
    ):
        solve(wide_problem(), SolveOptions(**{**EXACT, "rel_gap": 1e-2}, backend="gurobi"))


def test_gurobi_falls_back_to_highs_when_allowed():
    plan = solve(
        wide_problem(), SolveOptions(**{**EXACT, "rel_gap": 1e-2}, backend="gurobi", allow_backend_fallback=True)
    )
    assert plan.solver.backend == "highs"
    assert "gurobi" in plan.solver.details["backend_note"]
    assert plan.solver.details["num_vars"] > backends.GUROBI_SIZE_LIMIT


def test_missing_gurobipy_is_an_actionable_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_gurobi(name, *args, **kwargs):
        if name == "gurobipy":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gurobi)
    problem = explicit_problem(CHAIN, ["ab", "bc"], {"f": 1, "s": 1})
    with pytest.raises(SolveError, match="needs the gurobipy package"):
        solve(problem, SolveOptions(**EXACT, backend="gurobi"))
    assert solve(
        problem, SolveOptions(**EXACT, backend="gurobi", allow_backend_fallback=True)
    ).objective_s == pytest.approx(4.0)


def test_milp_modules_import_without_torch_mpi_or_gurobi():
    code = (
        "import sys, llm_planner.placement.milp.milp, llm_planner.placement.milp.warm, llm_planner.mip.backends\n"
        "bad = [m for m in ('torch', 'mpi4py', 'transformers', 'gurobipy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_model_builder_names_and_bounds():
    mb = backends.ModelBuilder()
    x = mb.add_vars("x", (2, 2), upper=1, integer=True, cost=[[-1, -2], [-3, -4]])
    mb.add_rows("cap", [0, 0, 0, 0], x.ravel(), [1, 1, 1, 1], [-math.inf], [2])
    model = mb.build()
    assert model.col_names() == ["x[0,0]", "x[0,1]", "x[1,0]", "x[1,1]"] and model.row_names() == ["cap[0]"]
    for threads in (1, 2, 0, 1):  # HiGHS keeps one thread pool per process: changing its size must work
        result = backends.solve_model(model, "highs", backends.BackendOptions(threads=threads, seed=threads))
        assert result.status == "optimal" and result.objective == pytest.approx(-7.0)
        assert result.values.tolist() == pytest.approx([0, 0, 1, 1])


# -- limits --------------------------------------------------------------------------------


def test_time_limit_returns_best_plan_with_dual_bound():
    # 12 independent equal tasks on 2 + 1 devices with 4 samples in up to 3 shards: far from solved in 0.5 s
    times = {f"t{j}": {"f": 1.0 + 0.1 * j, "s": 2.5 + 0.1 * j} for j in range(12)}
    problem = explicit_problem(times, [("t0", "t5"), ("t1", "t7"), ("t2", "t9")], {"f": 2, "s": 1}, batch_size=4)
    plan = solve(problem, SolveOptions(**{**EXACT, "time_limit_s": 0.5}))
    assert plan.solver.status == "time_limit"
    assert 0 < plan.lower_bound_s < plan.objective_s and plan.gap > 0
    check_plan(problem, plan)


def test_a_warm_start_that_meets_the_bound_is_returned_without_a_model(monkeypatch):
    from llm_planner.placement.milp import milp

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built for a proven warm start")

    monkeypatch.setattr(milp, "Formulation", no_model)
    # both tasks fastest on f, and a transfer costs more than any gain: all on f = the critical path bound, 2
    plan = exact(explicit_problem({"a": {"f": 1.0, "s": 5.0}, "b": {"f": 1.0, "s": 5.0}}, ["ab"], {"f": 1, "s": 1}))
    assert plan.objective_s == pytest.approx(2.0) and plan.lower_bound_s == pytest.approx(2.0)
    assert plan.solver.name == "milp" and plan.solver.status == "optimal"
    assert plan.solver.details["stopped"] == "the warm start meets the lower bound"
    with pytest.raises(
        AssertionError, match="model was built"
    ):  # not where the bound (6) is below the warm start (6.5)
        exact(explicit_problem(FORK, ["ab", "ac", "bd", "cd"], {"g": 2}))


def test_a_plan_stopped_by_the_time_limit_that_meets_the_bound_is_optimal(monkeypatch):
    from llm_planner.placement.milp import milp

    real = milp.solve_model

    def stopped(*args):
        return dataclasses.replace(real(*args), status="time_limit")

    monkeypatch.setattr(milp, "solve_model", stopped)
    monkeypatch.setattr(milp, "_warm_start_plan", lambda problem: None)  # else the warm start is returned at once
    # two independent unit tasks on two devices: 1 s, which the load bound proves
    plan = exact(explicit_problem({"a": {"g": 1.0}, "b": {"g": 1.0}}, [], {"g": 2}))
    assert plan.objective_s == pytest.approx(1.0)
    assert plan.solver.status == "optimal" and plan.solver.details["proven_by"] == "lower bound"
    worse = exact(explicit_problem(FORK, ["ab", "ac", "bd", "cd"], {"g": 2}))  # 6.5 against a bound of 6
    assert worse.solver.status == "time_limit" and "proven_by" not in worse.solver.details


# -- the dnn-partitioning throughput inputs ----------------------------------------------------


@pytest.mark.milp
@pytest.mark.parametrize("name, dp_optimum", [("bert24_inference.json", 17.7899), ("resnet50_inference.json", 33.7747)])
def test_workload_contiguous_reaches_the_dynamic_program(name, dp_optimum):
    from llm_planner.placement.inputs import load_graph_file

    if not (WORKLOADS / "LayerGraphs" / name).is_file():
        pytest.skip("the dnn-partitioning workloads are not present")
    graph, cluster = load_graph_file(WORKLOADS / "LayerGraphs" / name)
    problem = build_problem(graph, cluster, objective="throughput", batch_size=1)
    contiguous = solve(problem, SolveOptions(solver="milp", contiguous=True, time_limit_s=60))
    assert contiguous.objective_s <= dp_optimum * 1.01
    assert contiguous.lower_bound_s <= dp_optimum * (1 + 1e-4)  # the DP's optimum is feasible for this model
    free = solve(problem, SolveOptions(solver="milp", time_limit_s=60))
    assert free.objective_s <= contiguous.objective_s * (1 + 1e-9)
    assert free.objective_s <= dp_optimum * (1 + 1e-4)
    check_plan(problem, free)


def test_contiguous_split_warm_start_is_the_best_split_of_a_chain():
    from llm_planner.placement.milp.warm import contiguous_split

    problem = chain_problem()  # a chain has one topological order, and its dynamic program is exact
    plan = contiguous_split(problem)
    assert is_contiguous(problem, plan) and verify_plan(plan, problem).ok
    assert plan.objective_s == pytest.approx(contiguous_splits_optimum(problem), rel=1e-9)
    assert contiguous_split(dataclasses.replace(problem, objective="latency")) is None
