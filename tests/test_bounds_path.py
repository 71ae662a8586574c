"""The path LP (bounds/path_lp.py): exact on hand-solved cases, never above a brute-forced optimum;
and the partition bound over copies of the graph, one per shard."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_instances import problems
from test_bounds import GB, brute_force_optimum, explicit_problem
from test_milp import explicit_problem as milp_problem

from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.bounds.load import load_balance_bound
from llm_planner.placement.bounds.partition import count_partitions, partition_bound, partitions
from llm_planner.placement.bounds.path_lp import path_lp_at_shards, path_lp_bound
from llm_planner.placement.bounds.times import critical_path_bound

GPU_CPU = dict(kinds=(("gpu", "gpu", 10 * GB), ("cpu", "cpu", "unlimited")), devices={"gpu": 1, "cpu": 1})


def test_memory_on_a_chain_lengthens_the_path():
    """A chain of three 4 GB blocks, 1 s on the GPU (10 GB) and 3 s on the CPU.

    Two blocks fit on the GPU, so one runs on the CPU: the optimum is 1 + 1 + 3 = 5 s.
    The critical path (3 s, all on the GPU) and the load-balance LP (2.25 blocks on
    the GPU, 0.75 on the CPU: 2.25 s) both miss that the chain runs its blocks one after another;
    the path LP holds 2.5 blocks on the GPU and half a block on the CPU:
    2.5 x 1 + 0.5 x 3 = 4 s."""
    problem = explicit_problem([{"gpu": 1.0, "cpu": 3.0}] * 3, [(0, 1), (1, 2)], weights=[4 * GB] * 3, **GPU_CPU)
    assert critical_path_bound(problem) == pytest.approx(3.0)
    assert load_balance_bound(problem) == pytest.approx(2.25)
    assert path_lp_bound(problem, 1) == pytest.approx(4.0)
    assert path_lp_bound(problem, 1, memory=False) == pytest.approx(3.0)
    assert lower_bound(problem) == pytest.approx(4.0)
    assert brute_force_optimum(problem, orders=True) == pytest.approx(5.0)


def test_memory_on_a_chain_is_exact_when_blocks_fit_whole():
    """The same chain with 5 GB blocks: exactly two fit on the GPU, so the LP is integral: 5 s."""
    problem = explicit_problem([{"gpu": 1.0, "cpu": 3.0}] * 3, [(0, 1), (1, 2)], weights=[5 * GB] * 3, **GPU_CPU)
    assert lower_bound(problem) == pytest.approx(5.0) == pytest.approx(brute_force_optimum(problem, orders=True))


def test_transfers_charge_a_move_off_the_fast_device():
    """a -> b, 5 GB of weights each; a runs only on the GPU (5 GB, 1 s), b on the GPU (1 s) or the CPU (1.5 s).

    b must run on the CPU and a's tensor must cross the link (1 GB at 1 GB/s = 1 s):
    the optimum is 1 + 1 + 1.5 = 3.5 s, which the LP finds; without the transfer
    rows it would say 2.5 s. (Where fractions of both ends may move, the LP can keep
    them equal and pay no transfer: the rows bind only what the fractions force.)"""
    from planner_instances import kind, make_cluster

    from llm_planner.graph.ir import Edge, Task, TaskGraph
    from llm_planner.placement.problem import build_problem

    cluster = make_cluster(
        [
            kind("gpu", "gpu", flops=1e12, mem_bytes=5 * GB, mem_bw=1e11),
            kind("cpu", "cpu", flops=1e12, mem_bytes="unlimited", mem_bw=1e11),
        ],
        [{"gpu": 1, "cpu": 1}],
        bw=1 * GB,
        latency_s=0.0,
    )
    tasks = (
        Task(name="a", time_s_by_kind=(("gpu", 1.0),), weight_bytes=5 * GB),
        Task(name="b", time_s_by_kind=(("gpu", 1.0), ("cpu", 1.5)), weight_bytes=5 * GB),
    )
    graph = TaskGraph(name="pair", tasks=tasks, edges=(Edge(src="a", dst="b", bytes_per_sample=1 * GB),)).validate()
    problem = build_problem(graph, cluster, batch_size=1, max_shards=1)
    assert path_lp_bound(problem, 1) == pytest.approx(3.5)
    assert lower_bound(problem) == pytest.approx(3.5) == pytest.approx(brute_force_optimum(problem, orders=True))


def test_split_batch_keeps_the_whole_batch_in_memory():
    """A chain of two 4 GB blocks with 1 GB per sample, Q = 4 in at most 4 shards; the GPU (10 GB)
    takes 1 s a block, the CPU 3 s; both per shard, whatever its size.

    The largest shard alone (1 sample) would fit both blocks on the GPU (2 x 5 GB): 2 s.
    But the GPU holds the per-sample memory of every sample it runs, so with all four
    samples' blocks on it 2 x 4 + 4 x 2 = 16 GB > 10 GB: some samples run some block on
    the CPU, and no plan beats the brute-forced optimum, which the bound must not pass."""
    problem = explicit_problem(
        [{"gpu": 1.0, "cpu": 3.0}] * 2, [(0, 1)], weights=[4 * GB] * 2, batch=4, shards=4, **GPU_CPU
    )
    pieces = problem.time_pieces.copy()
    pieces[..., 0], pieces[..., 1] = problem.time_pieces[..., 1], 0.0  # the explicit seconds, fixed per shard
    problem = dataclasses.replace(problem, mem_bytes_per_sample=np.full(2, 1 * GB), time_pieces=pieces)
    assert problem.task_time(0, 0, 1) == pytest.approx(1.0) == pytest.approx(problem.task_time(0, 0, 4))
    naive = path_lp_bound(problem, 1, memory=False)
    whole = path_lp_at_shards(problem, 4)
    assert naive == pytest.approx(2.0)
    assert whole > naive + 0.1  # the batch's per-sample memory pushes work onto the CPU
    optimum = brute_force_optimum(problem)
    assert whole <= optimum * (1 + 1e-9)
    assert lower_bound(problem) <= optimum * (1 + 1e-9)


def test_largest_shard_need_not_hold_the_batch():
    """One task, 1 GB per sample, Q = 3 in up to 2 shards; GPU A (2 GB) takes 0.5 s a sample, GPU B
    (1 GB) 1 s a sample. Optimum: 2 samples on A and 1 on B, 1 s each. A bound that made
    the largest shard (>= 2 samples) hold all 3 samples' memory would keep 1/3 of it on B,
    at 2 s: 2/3 + 2/3 = 1.33 s, above the optimum; the whole-batch rows give 1 s."""
    kinds = (("a", "gpu", 2 * GB), ("b", "gpu", 1 * GB))
    problem = explicit_problem([{"a": 0.5, "b": 1.0}], kinds=kinds, devices={"a": 1, "b": 1}, batch=3, shards=2)
    problem = dataclasses.replace(problem, mem_bytes_per_sample=np.full(1, 1 * GB))
    assert brute_force_optimum(problem) == pytest.approx(1.0)
    assert path_lp_at_shards(problem, 2) == pytest.approx(1.0)
    assert lower_bound(problem) == pytest.approx(1.0)


@st.composite
def tight_memory_problems(draw, *, max_tasks: int, max_batch: int):
    """Latency problems whose capacities are scaled to a fraction of what the tasks need,
    so memory binds in most draws (devices of one kind keep one capacity)."""
    problem = draw(problems(max_tasks=max_tasks, max_devices=3, max_batch=max_batch, objective="latency"))
    need = float(np.sum(problem.weight_bytes + problem.mem_bytes_per_sample * problem.batch_size))
    factor = draw(st.floats(0.2, 1.2))
    kinds = [d.kind for d in problem.devices]
    caps = {k: draw(st.sampled_from([math.inf, factor * need, 0.5 * factor * need])) for k in sorted(set(kinds))}
    return dataclasses.replace(problem, mem_capacity=np.array([caps[k] for k in kinds]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=tight_memory_problems(max_tasks=4, max_batch=3))
def test_path_lp_below_exact_optimum_one_shard(problem):
    """<= 4 tasks, one shard, memory binding: every assignment x every device order."""
    from unittest import mock

    from llm_planner.placement.bounds import path_lp

    problem = dataclasses.replace(problem, max_shards=1)
    optimum = brute_force_optimum(problem, orders=True)
    if np.isfinite(optimum):
        assert path_lp_bound(problem, problem.batch_size) <= optimum * (1 + 1e-9)
        assert lower_bound(problem) <= optimum * (1 + 1e-9)
        with mock.patch.object(path_lp, "MAX_HEAD_TAIL_TERMS", 6):  # head and tail rows for every s-th task only
            assert path_lp_bound(problem, problem.batch_size) <= optimum * (1 + 1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=tight_memory_problems(max_tasks=3, max_batch=4))
@pytest.mark.heavy
def test_path_lp_below_every_split_plan(problem):
    """<= 3 tasks, up to 3 shards, memory binding: the bound is below every split and assignment that fits."""
    problem = dataclasses.replace(problem, max_shards=min(3, problem.batch_size))
    best = brute_force_optimum(problem)
    if np.isfinite(best):
        assert path_lp_at_shards(problem, problem.max_shards) <= best * (1 + 1e-9)
        assert lower_bound(problem) <= best * (1 + 1e-9)


def test_head_and_tail_rows_place_the_work_around_a_task(monkeypatch):
    """s -> {a, b} -> t: a and b run only on the GPU (1 s each), s and t take 1 s there and
    10 s on the CPU; transfers are free. The best plan keeps all four on the GPU: 4 s.
    Without rows (9)-(10) the LP moves a tenth of s and t to the CPU: the GPU's load drops
    to 3.9 s and the path grows to 3.9 s. With them, a's descendants on the GPU (b need not
    be one, t is) and s's (a, b, t) must run after s: T >= C_s + 3 - (t's CPU share), and
    the LP finds the optimum."""
    from llm_planner.placement.bounds import path_lp, path_refine

    times = [{"gpu": 1.0, "cpu": 10.0}, {"gpu": 1.0}, {"gpu": 1.0}, {"gpu": 1.0, "cpu": 10.0}]
    problem = explicit_problem(times, [(0, 1), (0, 2), (1, 3), (2, 3)], weights=[0.0] * 4, **GPU_CPU)
    assert path_lp_bound(problem, 1) == pytest.approx(4.0) == pytest.approx(brute_force_optimum(problem, orders=True))
    monkeypatch.setattr(path_refine, "ENERGY_THRESHOLDS", 0)  # no rows (11) either: they find the optimum too
    monkeypatch.setattr(path_lp, "MAX_HEAD_TAIL_TERMS", 1)  # a stride longer than the graph: no rows
    assert path_lp_bound(problem, 1) == pytest.approx(3.9)


def test_a_dense_stage_gets_the_path_lp(monkeypatch):
    """A randomly wired ER stage of 256 nodes has 6,491 edges, above MAX_PATH_LP_EDGES, but few enough
    tasks that tasks x edges stays within MAX_PATH_LP_SIZE: it gets the path LP (with thinned head and
    tail rows), above the load-balance LP; past both limits, the critical path alone."""
    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.bounds import path_lp
    from llm_planner.placement.inputs import problem_from_inputs

    specs = Path(__file__).resolve().parents[1] / "cluster_specs"
    problem = problem_from_inputs(
        cluster_path=str(specs / "cpu-two-gpus.yaml"),
        model=ModelSpec(name="rwnn-er-1x256"),
        objective="latency",
        batch_size=1,
    )
    assert problem.num_edges > path_lp.MAX_PATH_LP_EDGES
    assert path_lp_bound(problem, 1) > 1.05 * load_balance_bound(problem) > critical_path_bound(problem)
    monkeypatch.setattr(path_lp, "MAX_PATH_LP_SIZE", problem.num_tasks * problem.num_edges - 1)
    assert path_lp_bound(problem, 1) == pytest.approx(critical_path_bound(problem))


# -- the partition bound ----------------------------------------------------------------------


def test_partitions_are_listed_once_and_counted():
    for total in range(0, 11):
        for most in range(1, 6):
            listed = list(partitions(total, most))
            assert len(listed) == len(set(listed)) == count_partitions(total, most)
            assert all(sum(p) == total and len(p) <= most and list(p) == sorted(p, reverse=True) for p in listed)
    assert list(partitions(4, 2)) == [(4,), (3, 1), (2, 2)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=tight_memory_problems(max_tasks=3, max_batch=4))
@pytest.mark.heavy
def test_partition_bound_below_every_split_plan(problem):
    """<= 3 tasks, up to 3 shards, memory binding: below every split and assignment that fits,
    with the union LPs solved and with the partitions' lighter bounds only."""
    from unittest import mock

    from llm_planner.placement.bounds import partition

    problem = dataclasses.replace(problem, max_shards=min(3, problem.batch_size))
    best = brute_force_optimum(problem)
    if np.isfinite(best):
        assert partition_bound(problem) <= best * (1 + 1e-9)
        with mock.patch.object(partition, "MAX_PARTITION_LPS", 0):
            assert partition_bound(problem) <= best * (1 + 1e-9)
        with mock.patch.object(partition, "MAX_PARTITION_TASKS", 0):
            assert partition_bound(problem) <= best * (1 + 1e-9)
        with mock.patch.object(partition, "MAX_PARTITIONS", 0):  # one stand-in per shard count
            assert partition_bound(problem) <= best * (1 + 1e-9)


def test_partition_bound_couples_the_shards_of_a_split_batch():
    """A randomly wired stage of 8 nodes on a CPU, an A100 and a T4, batch 4 in up to 4 shards.
    Apart, the largest shard's path LP and the shard-count LP each allow a plan that the other
    forbids; with one copy of the graph per shard, every shard's path and all their work on the
    shared devices must fit together. The bound rises and stays below MILP-SPLIT's plan."""
    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.bounds.shard_count import shard_count_bound
    from llm_planner.placement.inputs import problem_from_inputs
    from llm_planner.placement.options import SolveOptions
    from llm_planner.placement.solve import solve

    specs = Path(__file__).resolve().parents[1] / "cluster_specs"
    problem = problem_from_inputs(
        cluster_path=str(specs / "cpu-two-gpus.yaml"),
        model=ModelSpec(name="rwnn-ws-1x8"),
        objective="latency",
        batch_size=4,
    )
    assert problem.max_shards >= 2
    apart = max(shard_count_bound(problem), path_lp_at_shards(problem, problem.max_shards), load_balance_bound(problem))
    coupled = partition_bound(problem)
    assert coupled > 1.05 * apart
    assert partition_bound(problem, floor=2 * coupled) == 2 * coupled  # a floor above it is returned as is
    plan = solve(problem, SolveOptions(solver="milp-split"))
    assert coupled <= plan.objective_s * (1 + 1e-9)
    assert lower_bound(problem) >= coupled * (1 - 1e-9)


def test_shard_copies_hold_the_weights_of_what_any_copy_runs():
    """A chain of two 5 GB blocks, 1 s per sample on a 6 GB GPU and 3 s on the CPU; batch 2 in up
    to 2 shards. The GPU holds one block's weights, so the best plan runs block 0 on the GPU and
    block 1 on the CPU, pipelining two one-sample shards: 7 s. In the (1, 1) union LP the GPU
    may hold 1.2 blocks' weights over both copies: each copy's path is 2 x 1 + 0.8 x 3 = 3.6 s
    and the CPU runs 0.8 blocks of each, 4.8 s; the (2) LP is 7.2 s. With the weights on copy 0
    alone, copy 1 would run every block on the GPU for free: 3.6 s."""
    from llm_planner.placement.bounds.partition import shard_copies

    problem = explicit_problem(
        [{"gpu": 1.0, "cpu": 3.0}] * 2,
        [(0, 1)],
        weights=[5 * GB] * 2,
        kinds=(("gpu", "gpu", 6 * GB), ("cpu", "cpu", "unlimited")),
        devices={"gpu": 1, "cpu": 1},
        batch=2,
        shards=2,
    )
    assert brute_force_optimum(problem, orders=True) == pytest.approx(7.0)
    assert path_lp_bound(shard_copies(problem, (2,)), 1) == pytest.approx(7.2)
    assert path_lp_bound(shard_copies(problem, (1, 1)), 1, copies=2) == pytest.approx(4.8)
    assert partition_bound(problem) == pytest.approx(4.8)


def test_partition_bound_on_a_decoder_too_large_for_its_gpus():
    """GPT-3 175B decoding a batch of 8 on four A100s and two CPU sockets: a quarter of the blocks
    must run on a CPU. Counting the weights on copy 0 alone, the (3, 3, 2) union LP lets the third
    shard keep more blocks on the GPUs than fit, and is the least over the partitions; with the
    weights held wherever any shard runs a block it rises by more than 10%, and the partition
    bound with it, staying below the plan HEFT finds."""
    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.baselines.single import run_baseline
    from llm_planner.placement.bounds.partition import shard_copies
    from llm_planner.placement.inputs import problem_from_inputs

    specs = Path(__file__).resolve().parents[1] / "cluster_specs"
    problem = problem_from_inputs(
        cluster_path=str(specs / "four-gpus.yaml"), model=ModelSpec(name="gpt3-175b"), objective="latency", batch_size=8
    )
    copies = shard_copies(problem, (3, 3, 2))
    shared, copy0 = path_lp_bound(copies, 1, head_tail=False, copies=3), path_lp_bound(copies, 1, head_tail=False)
    assert shared > 1.1 * copy0
    bound = partition_bound(problem)
    assert bound > copy0 * (1 + 1e-6)
    assert bound <= run_baseline("heft", problem).objective_s * (1 + 1e-9)


# -- pinned windows ------------------------------------------------------------------------------


def test_a_device_waits_for_the_input_of_a_pinned_task_and_stops_before_the_output():
    """u (pinned to f, no time) feeds a, b and c, which feed v (pinned to f, 2 s); a takes 1 s on
    f and 2 s on g, b 2 s on either, c 1 s on either; every transfer 1 s. Best plan: c on g (it
    starts after u's output has travelled, at 1, ends at 2, its output arrives at 3), a and b on
    f until 3, v from 3 to 5. g can start no earlier than 1 and must stop 1 + 2 s before the end,
    so it works at most T - 4; f's 6 s of work shrink by at most 1 s per second g takes over (c),
    so T >= 10 - T: 5. Without that window the LP finds 4.41."""
    from llm_planner.placement.bounds import path_lp, path_refine

    times = {
        "u": {"f": 0.0},
        "a": {"f": 1.0, "g": 2.0},
        "b": {"f": 2.0, "g": 2.0},
        "c": {"f": 1.0, "g": 1.0},
        "v": {"f": 2.0},
    }
    problem = milp_problem(
        times, ["ua", "ub", "uc", "av", "bv", "cv"], {"f": 1, "g": 1}, comm_s=1.0, objective="latency"
    )
    assert path_lp_bound(problem, 1) == pytest.approx(5.0) == pytest.approx(brute_force_optimum(problem, orders=True))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(path_lp, "windows", lambda problem, head, tail, classes, floor: np.zeros(len(classes)))
        mp.setattr(path_refine, "ENERGY_THRESHOLDS", 0)  # rows (11) know the windows too
        assert path_lp_bound(problem, 1) == pytest.approx(4.4118, abs=1e-4)


@st.composite
def pinned_problems(draw, *, max_tasks: int):
    """One-shard latency problems with their first and last tasks (in topological order) pinned to
    one device each that can run them, as MILP-SPLIT's module subproblems pin their cuts."""
    problem = draw(problems(max_tasks=max_tasks, max_devices=3, max_batch=3, objective="latency"))
    order = [problem.graph.index(name) for name in problem.graph.topological_order()]
    supported = problem.supported.copy()
    for i in {order[0], order[-1]}:
        k = draw(st.sampled_from(np.flatnonzero(supported[i]).tolist()))
        supported[i] = False
        supported[i, k] = True
    return dataclasses.replace(problem, supported=supported, max_shards=1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=pinned_problems(max_tasks=5))
def test_pinned_windows_stay_below_the_exact_optimum(problem):
    """<= 5 tasks with pinned ends: every assignment x every device order."""
    optimum = brute_force_optimum(problem, orders=True)
    if np.isfinite(optimum):
        assert path_lp_bound(problem, problem.batch_size) <= optimum * (1 + 1e-9)


def test_energy_rows_count_the_work_that_must_fit_between_a_head_and_a_tail(monkeypatch):
    """s -> {a, b, c} -> t, 1 s each, on two identical devices, transfers free. a, b and c cannot
    start before 1 (s runs first) and must end by T - 1 (t runs last): 3 s of work on two devices
    in T - 2, so T >= 3.5. The path (3 s), the load (2.5 s) and the head and tail rows (C_t >=
    4 / 2 + 1, T >= C_s + 4 / 2: 3 s) see less. The optimum is 4 s (one of a, b, c waits)."""
    from llm_planner.placement.bounds import path_refine

    times = [{"g": 1.0}] * 5
    problem = explicit_problem(times, [(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 4)])
    assert path_lp_bound(problem, 1) == pytest.approx(3.5)
    assert brute_force_optimum(problem, orders=True) == pytest.approx(4.0)
    monkeypatch.setattr(path_refine, "ENERGY_THRESHOLDS", 0)
    assert path_lp_bound(problem, 1) == pytest.approx(3.0)
