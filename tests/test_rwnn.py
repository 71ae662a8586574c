"""Randomly wired networks: the analytic graph, its wiring, names, and the runnable module."""

from __future__ import annotations

import subprocess
import sys

import networkx as nx
import pytest

from llm_planner.graph import rwnn
from llm_planner.graph.ir import GraphError

GENERATORS = ("ws", "er", "ba")


def _stage_tasks(graph, stage: int) -> list[str]:
    return [t.name for t in graph.tasks if t.name.startswith(f"s{stage}_n")]


@pytest.mark.parametrize("generator", GENERATORS)
def test_dag_with_requested_sizes(generator):
    graph = rwnn.build_rwnn_graph(generator, 3, 16, seed=1)
    g = graph.to_networkx()
    assert nx.is_directed_acyclic_graph(g)
    assert graph.num_tasks == 1 + 1 + 3 * (16 + 2) + 1 + 1  # images, stem, stages, head, output
    assert [n for n in g if g.in_degree(n) == 0] == ["images"]
    assert [n for n in g if g.out_degree(n) == 0] == ["output"]
    assert graph.task("images").kind == "input" and graph.task("output").kind == "output"
    for s in range(3):
        nodes = _stage_tasks(graph, s)
        assert nodes == [f"s{s}_n{j}" for j in range(16)]
        inner = g.subgraph(nodes)
        dag = rwnn.stage_dag(generator, 16, seed=1, stage=s)
        assert {(f"s{s}_n{u}", f"s{s}_n{v}") for u, v in dag.edges} == set(inner.edges)
        assert all(u < v for u, v in dag.edges)  # oriented from lower to higher index
        sources = {n for n in nodes if inner.in_degree(n) == 0}
        sinks = {n for n in nodes if inner.out_degree(n) == 0}
        assert set(g.successors(f"s{s}_in")) == sources
        assert set(g.predecessors(f"s{s}_out")) == sinks
    # the chain between stages
    assert list(g.predecessors("stem")) == ["images"] and list(g.successors("stem")) == ["s0_in"]
    assert list(g.predecessors("s1_in")) == ["s0_out"] and list(g.predecessors("s2_in")) == ["s1_out"]
    assert list(g.predecessors("head")) == ["s2_out"] and list(g.predecessors("output")) == ["head"]


def test_generator_parameters():
    ws = rwnn.stage_dag("ws", 32, seed=0, stage=0)
    assert ws.number_of_edges() == 32 * 4 // 2  # rewiring keeps the ring lattice's edge count
    ba = rwnn.stage_dag("ba", 32, seed=0, stage=0)
    assert ba.number_of_edges() == (32 - 5) * 5
    er = rwnn.stage_dag("er", 200, seed=0, stage=0)
    assert 0.15 < er.number_of_edges() / (200 * 199 / 2) < 0.25


@pytest.mark.parametrize("generator", GENERATORS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_tiny_stages(generator, n):
    graph = rwnn.build_rwnn_graph(generator, 2, n, seed=0)
    assert len(_stage_tasks(graph, 0)) == n and len(_stage_tasks(graph, 1)) == n
    assert nx.is_directed_acyclic_graph(graph.to_networkx())


@pytest.mark.parametrize("generator", GENERATORS)
def test_same_seed_same_graph_other_seed_other_graph(generator):
    a = rwnn.build_rwnn_graph(generator, 3, 32, seed=5)
    b = rwnn.build_rwnn_graph(generator, 3, 32, seed=5)
    c = rwnn.build_rwnn_graph(generator, 3, 32, seed=6)
    assert a == b and a.sha256() == b.sha256()
    assert set(a.edges) != set(c.edges)
    # stages of one network are wired independently
    assert {(u, v) for u, v in rwnn.stage_dag(generator, 32, seed=5, stage=0).edges} != {
        (u, v) for u, v in rwnn.stage_dag(generator, 32, seed=5, stage=1).edges
    }


def test_numbers_by_hand():
    """C=4, 32 px: stem 3->2 ch at 16 px, 2->4 ch at 8 px; stage 0 at 4x4 (HW = 16), stage 1 (8 ch) at 2x2."""
    graph = rwnn.build_rwnn_graph("ws", 2, 3, seed=0, channels=4, image_size=32, dtype="fp16", num_classes=10)
    # stem: 2*9*(3*2*256 + 2*4*64) FLOPs; weights (27*2 + 9*2*4 + 4*2 + 4*4) halves + 2 int64 counters
    stem = graph.task("stem")
    assert stem.flops_per_sample == 2 * 9 * (3 * 2 * 256 + 2 * 4 * 64) == 36864
    assert stem.weight_bytes == (54 + 72 + 8 + 16) * 2 + 16
    assert stem.bytes_per_sample == (3 * 32 * 32 + 4 * 64) * 2
    # ws with n = 3 is a triangle: 0 -> 1, 0 -> 2, 1 -> 2
    n2 = graph.task("s0_n2")
    assert n2.flops_per_sample == 2 * (9 * 4 + 4 * 4) * 16 == 1664
    assert n2.weight_bytes == (2 + 36 + 16 + 16) * 2 + 8  # 2 aggregation weights
    assert n2.bytes_per_sample == (2 + 1) * 4 * 16 * 2
    s1_in = graph.task("s1_in")
    assert s1_in.flops_per_sample == 2 * 9 * 4 * 8 * 4
    assert s1_in.weight_bytes == (9 * 4 * 8 + 4 * 8) * 2 + 8
    assert graph.task("s0_out").flops_per_sample == 0 and graph.task("s0_out").weight_bytes == 0
    head = graph.task("head")
    assert head.flops_per_sample == 2 * 8 * 10 and head.weight_bytes == (8 + 1) * 10 * 2
    edge = {(e.src, e.dst): e.bytes_per_sample for e in graph.edges}
    assert edge[("s0_n1", "s0_n2")] == 4 * 16 * 2
    assert edge[("images", "stem")] == 3 * 32 * 32 * 2
    assert edge[("head", "output")] == 10 * 2
    fp32 = rwnn.build_rwnn_graph("ws", 2, 3, seed=0, channels=4, image_size=32, dtype="fp32", num_classes=10)
    assert fp32.task("s0_n2").bytes_per_sample == 2 * n2.bytes_per_sample


def test_names_and_presets():
    assert rwnn.is_rwnn_name("rwnn-ws-3x32") and rwnn.is_rwnn_name("rwnn-nonsense")
    assert not rwnn.is_rwnn_name("resnet50")
    assert rwnn.parse_rwnn_name("rwnn-ba-4x2500") == ("ba", 4, 2500)
    for bad in ("rwnn-ws-3", "rwnn-xx-3x32", "rwnn-ws-0x32", "rwnn-ws-3x0", "rwnn-WS-3x32"):
        with pytest.raises(GraphError, match=rf"model {bad!r}"):
            rwnn.parse_rwnn_name(bad)
    presets = rwnn.preset_descriptions()
    assert [name for name, _ in presets] == [f"rwnn-{g}-3x{n}" for g in GENERATORS for n in (32, 64, 128, 256)]
    graph = rwnn.build_rwnn_graph_from_name("rwnn-er-3x64", seed=2, dtype="fp32")
    assert graph == rwnn.build_rwnn_graph("er", 3, 64, seed=2, dtype="fp32")
    assert graph.meta_dict()["generator"] == "er" and graph.meta_dict()["seed"] == 2


def test_bad_arguments():
    with pytest.raises(GraphError, match="unknown generator 'xx'"):
        rwnn.build_rwnn_graph("xx", 3, 32, seed=0)
    with pytest.raises(GraphError, match="unknown dtype 'fp64'"):
        rwnn.build_rwnn_graph("ws", 3, 32, seed=0, dtype="fp64")
    with pytest.raises(GraphError, match="num_stages must be >= 1"):
        rwnn.build_rwnn_graph("ws", 0, 32, seed=0)
    with pytest.raises(GraphError, match="num_stages must be at most 8"):
        rwnn.build_rwnn_graph("ws", 600, 4, seed=0)  # the channels double a stage: a float overflowed
    with pytest.raises(GraphError, match="exceed the 50,000 tasks"):
        rwnn.build_rwnn_graph("ws", 1, 60000, seed=0)  # refused before the stage is wired


def test_paper_scale():
    """The small regime's totals are near the paper's (RandWire-WS small: 583 M mult-adds, 5.6 M params)."""
    graph = rwnn.build_rwnn_graph("ws", 3, 32, seed=0, dtype="fp32")
    macs = sum(t.flops_per_sample for t in graph.tasks) / 2
    params = (graph.total_weight_bytes() - 8 * (2 + 3 + 3 * 32)) / 4  # minus BN counters, 4 bytes each
    assert 0.5e9 < macs < 0.8e9
    assert 4.5e6 < params < 6.5e6


def test_ten_thousand_tasks_build():
    graph = rwnn.build_rwnn_graph_from_name("rwnn-ws-4x2500", seed=0)
    assert graph.num_tasks >= 10_000


def test_analytic_builder_does_not_import_torch():
    code = (
        "import sys\n"
        "from llm_planner.graph import rwnn\n"
        "rwnn.build_rwnn_graph('ba', 2, 8, seed=0)\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ----------------------------------------------------------------------------
# The runnable module (torch)


@pytest.fixture
def torch():
    """torch, with one intra-op thread (two spin-wait on a busy 2-core machine)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(threads)


@pytest.mark.parametrize("generator", GENERATORS)
def test_traced_graph_equals_analytic_graph(generator, torch):
    from llm_planner.graph import rwnn_torch

    name = f"rwnn-{generator}-2x12"
    module, gm, traced, example = rwnn_torch.build_rwnn(name, seed=3, channels=8, image_size=32, num_classes=10)
    analytic = rwnn.build_rwnn_graph(generator, 2, 12, seed=3, channels=8, image_size=32, num_classes=10)
    assert [t.name for t in traced.tasks] == [t.name for t in analytic.tasks]
    assert [n.name for n in gm.graph.nodes] == [t.name for t in analytic.tasks]
    # every number too: the analytic formulas are what the measured trace gives
    assert traced.tasks == analytic.tasks
    assert set(traced.edges) == set(analytic.edges)
    with torch.no_grad():
        eager = module(example)
        assert eager.shape == (1, 10)
        assert torch.allclose(gm(example), eager, rtol=1e-5, atol=1e-6)


def test_module_same_seed_same_wiring_and_weights(torch):
    from llm_planner.graph import rwnn_torch

    a = rwnn_torch.build_rwnn("rwnn-ba-2x10", seed=4, channels=4, image_size=16)
    b = rwnn_torch.build_rwnn("rwnn-ba-2x10", seed=4, channels=4, image_size=16)
    c = rwnn_torch.build_rwnn("rwnn-ba-2x10", seed=5, channels=4, image_size=16)
    assert a[2] == b[2] and set(a[2].edges) != set(c[2].edges)
    with torch.no_grad():
        assert torch.equal(a[0](a[3]), b[0](b[3]))


def test_model_registry_builds_rwnn_presets():
    from llm_planner.graph.models import ModelSpec, build_model_graph, list_models

    listed = {name for name, family, _ in list_models() if family == "rwnn"}
    assert listed == {name for name, _ in rwnn.preset_descriptions()}
    graph = build_model_graph(ModelSpec(name="rwnn-ba-3x32", seed=3, dtype="fp32"))
    assert graph == rwnn.build_rwnn_graph("ba", 3, 32, seed=3, dtype="fp32")
    with pytest.raises(GraphError, match="rwnn-ba-3"):
        build_model_graph(ModelSpec(name="rwnn-ba-3"))
