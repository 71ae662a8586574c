"""Which devices are interchangeable: (server template, kind, degree), one answer for every solver.

A tensor-parallel pair and a single GPU of the same kind in the same server are not: the pair
runs a sharded task in about half the time. MILP-SPLIT's subproblem cache once keyed a pair
and a single alike (template, kind) and carried one's solution over to the other, so its DP
read the single's span for the pair (and the other way round)."""

from __future__ import annotations

import numpy as np
import pytest
from test_tensor_parallel import gpu_cluster

from llm_planner.core.tensor_groups import device_class
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import build_problem, restrict_devices
from llm_planner.placement.split import subsolve
from llm_planner.placement.split.data_parallel import device_groups
from llm_planner.placement.split.split_context import SplitContext


def fork_join() -> TaskGraph:
    """Two sharded source tasks joined by a third: one module of three tasks, no input cut."""
    tasks = tuple(
        Task(
            name=name,
            flops_per_sample=flops,
            bytes_per_sample=2e7,
            weight_bytes=1e9,
            tp_divides=(2,),
            tp_allreduces=1,
            tp_allreduce_bytes_per_sample=1e5,
        )
        for name, flops in (("a", 4e10), ("b", 3e10), ("join", 5e10))
    )
    edges = (Edge(src="a", dst="join", bytes_per_sample=2e7), Edge(src="b", dst="join", bytes_per_sample=2e7))
    return TaskGraph(name="fork-join", tasks=tasks, edges=edges).validate()


def mixed_layout():
    """Four GPUs of one server cut as the pair 2-3 beside the single devices 0 and 1 (the
    mixed layout solve/split/tp.py tries), restricted so MILP-SPLIT sees three devices."""
    problem = build_problem(fork_join(), gpu_cluster(4), objective="latency", max_tp=2)
    names = [d.name for d in problem.devices]
    keep = [names.index("node0/g:0"), names.index("node0/g:1"), names.index("node0/g:2-3")]
    return restrict_devices(problem, keep)


def test_a_pair_and_a_single_are_different_classes():
    sub = mixed_layout()
    single, other, pair = sub.devices
    assert device_class(single) == device_class(other) == (single.node_template, "g", 1)
    assert device_class(pair) == (single.node_template, "g", 2)
    classes = subsolve.device_classes(sub)
    assert subsolve.pair_key(sub, classes, None, 0) == subsolve.pair_key(sub, classes, None, 1)
    assert subsolve.pair_key(sub, classes, None, 0) != subsolve.pair_key(sub, classes, None, 2)
    assert subsolve.pair_key(sub, classes, 2, 0) != subsolve.pair_key(sub, classes, 1, 0)


def test_the_pair_costs_what_it_runs_in():
    """Every span in MILP-SPLIT's table is the span of that very pair, solved on its own."""
    sub = mixed_layout()
    options = SolveOptions(solver="milp-split", workers=1)
    allowed = np.ones(sub.num_devices, dtype=bool)
    task = sub.graph.index("join")
    assert sub.task_time(task, 2, 1) < 0.75 * sub.task_time(task, 0, 1)  # the pair is much faster
    with SplitContext(sub, options) as ctx:
        module = next(j for j, m in enumerate(ctx.modules) if len(m.tasks) > 1 and m.input_task is None)
        table = ctx.costs(module, allowed, sub.batch_size, [None])
        for b, l in enumerate(table.outs):
            alone = subsolve.solve_subproblem(sub, ctx.modules[module], None, l, allowed, sub.batch_size, options)
            assert table.cost[0, b] == pytest.approx(alone.cost_s, rel=1e-9), sub.devices[l].name
            assert table.solutions[(None, l)].devices[-1] == l


def test_a_pair_is_not_dealt_out_as_a_single():
    """Data-parallel groups are alike position by position: the pair is never one group's device
    where another group has a single."""
    sub = mixed_layout()
    for g in (2, 3):
        groups = device_groups(sub, g)
        if groups is None:
            continue
        for members in zip(*groups):
            assert len({device_class(sub.devices[k]) for k in members}) == 1, members
