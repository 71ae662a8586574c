"""Symmetry classes from cluster specs, and the canonical permutation that satisfies each criterion."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_instances import kind

from llm_planner.core.spec import load_cluster, parse_cluster
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.milp.symmetry import (
    CRITERIA,
    apply_permutation,
    canonical_permutation,
    satisfies,
    symmetry_classes,
)
from llm_planner.placement.problem import build_problem


def small_cluster():
    """2 identical servers of 2 identical GPUs, plus one different server."""
    return parse_cluster(
        {
            "name": "sym",
            "device_kinds": [
                kind("g", "gpu", flops=1e14, mem_bytes="80 GB", mem_bw=2e12),
                kind("h", "gpu", flops=5e13, mem_bytes="40 GB", mem_bw=1e12),
            ],
            "nodes": [{"name": "twin", "count": 2, "devices": {"g": 2}}, {"name": "other", "devices": {"h": 1}}],
            "links": {
                "intra_node_default": {"bw_bytes_per_s": 1e11, "latency_s": 2e-6},
                "inter_node": {"bw_bytes_per_s": 1e10, "latency_s": 1e-5},
            },
        }
    )


def test_classes_of_the_small_cluster():
    classes = symmetry_classes(small_cluster())
    assert classes.devices == ((0, 1), (2, 3))
    assert classes.servers == (((0, 1), (2, 3)),)
    assert classes.num_rows == 3


def test_classes_of_the_six_server_cluster(repo):
    classes = symmetry_classes(load_cluster(repo / "cluster_specs/gpt3-six-servers.yaml"))
    assert len(classes.servers) == 3 and all(len(c) == 2 for c in classes.servers)
    assert len(classes.devices) == 6 and all(len(c) == 8 for c in classes.devices)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), criterion=st.sampled_from(CRITERIA))
def test_canonical_permutation_satisfies_and_keeps_the_objective(data, criterion):
    cluster = small_cluster()
    n = data.draw(st.integers(1, 6))
    tasks = tuple(Task(name=f"t{i}", flops_per_sample=data.draw(st.floats(1e9, 1e12))) for i in range(n))
    edges = tuple(Edge(src=f"t{i}", dst=f"t{i + 1}", bytes_per_sample=1e6) for i in range(n - 1))
    problem = build_problem(TaskGraph(name="c", tasks=tasks, edges=edges), cluster, batch_size=4, max_shards=2)
    sizes = data.draw(st.sampled_from([[4], [3, 1], [2, 2]]))
    assignments = [[data.draw(st.integers(0, 4)) for _ in range(n)] for _ in sizes]
    classes = symmetry_classes(cluster)
    perm = canonical_permutation(problem, classes, criterion, sizes, assignments)
    assert sorted(perm.tolist()) == list(range(5))
    moved = apply_permutation(assignments, perm)
    assert satisfies(problem, classes, criterion, sizes, moved)
    from llm_planner.placement.schedule import device_loads

    before = sorted(device_loads(problem, sizes, assignments).round(12))
    after = sorted(device_loads(problem, sizes, moved).round(12))
    assert before == pytest.approx(after)


def test_problem_classes_split_members_that_hold_different_tasks():
    import dataclasses

    from llm_planner.placement.milp.symmetry import problem_classes

    tasks = (Task(name="a", flops_per_sample=1e9), Task(name="b", flops_per_sample=1e9))
    problem = build_problem(TaskGraph(name="ab", tasks=tasks, edges=()), small_cluster())
    assert problem_classes(problem) == symmetry_classes(small_cluster())
    supported = problem.supported.copy()
    supported[0, 3] = False  # device 3 (second GPU of the second twin) may not hold task a
    classes = problem_classes(dataclasses.replace(problem, supported=supported))
    assert classes.devices == ((0, 1),)  # (2, 3) is no longer a class, and the twins differ
    assert classes.servers == ()
