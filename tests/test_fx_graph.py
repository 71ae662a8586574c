"""torch.fx builder: a tiny module measured exactly, and ResNet-50 / ResNet-18 from transformers."""

from __future__ import annotations

import networkx as nx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from llm_planner.graph import fx  # noqa: E402
from llm_planner.graph.ir import Edge, GraphError, graph_from_dict  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Two intra-op threads on a busy 2-core machine spin-wait: one is 30x faster there."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.drop = nn.Identity()
        self.fc2 = nn.Linear(8, 3)
        self.scale = nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):
        h = self.drop(torch.relu(self.fc1(x)))
        return self.fc2(h) * self.scale + x[:, :3]


def test_tiny_module_traced_exactly():
    module = Tiny()
    x = torch.randn(2, 4)  # batch of 2: every number below is per sample
    gm, graph = fx.trace_module(module, (x,), name="tiny", dtype="fp32")
    assert torch.allclose(gm(x), module(x))
    # the Identity is gone, the get_attr `scale` is folded into its user `mul`
    assert [n.name for n in gm.graph.nodes] == ["x", "fc1", "relu", "fc2", "scale", "mul", "getitem", "add", "output"]
    rows = [(t.name, t.kind, t.flops_per_sample, t.bytes_per_sample, t.weight_bytes) for t in graph.tasks]
    assert rows == [
        ("x", "input", 0, 0, 0),
        ("fc1", "Linear", 2 * 4 * 8, (4 + 8) * 4, (4 * 8 + 8) * 4),
        ("relu", "relu", 0, (8 + 8) * 4, 0),
        ("fc2", "Linear", 2 * 8 * 3, (8 + 3) * 4, (8 * 3 + 3) * 4),
        ("mul", "mul", 0, (3 + 3) * 4, 3 * 4),
        ("getitem", "getitem", 0, (4 + 3) * 4, 0),
        ("add", "add", 0, (3 + 3 + 3) * 4, 0),
        ("output", "output", 0, 0, 0),
    ]
    assert set(graph.edges) == {
        Edge(src="x", dst="fc1", bytes_per_sample=16),
        Edge(src="fc1", dst="relu", bytes_per_sample=32),
        Edge(src="relu", dst="fc2", bytes_per_sample=32),
        Edge(src="fc2", dst="mul", bytes_per_sample=12),
        Edge(src="x", dst="getitem", bytes_per_sample=16),
        Edge(src="mul", dst="add", bytes_per_sample=12),
        Edge(src="getitem", dst="add", bytes_per_sample=12),
        Edge(src="add", dst="output", bytes_per_sample=12),
    }
    assert graph.task("relu").labels == (("fx_op", "call_function"), ("fx_target", "torch.relu"))
    assert graph.task("fc1").labels == (("fx_op", "call_module"), ("fx_target", "fc1"))
    # per-sample numbers do not depend on the batch; fp16 halves every float byte count
    _, single = fx.trace_module(module, (x[:1],), name="tiny", dtype="fp32")
    assert single.tasks == graph.tasks and set(single.edges) == set(graph.edges)
    _, half = fx.trace_module(module, (x,), name="tiny", dtype="fp16")
    for t32, t16 in zip(graph.tasks, half.tasks):
        assert (t16.bytes_per_sample, t16.weight_bytes, t16.flops_per_sample) == (
            t32.bytes_per_sample / 2,
            t32.weight_bytes / 2,
            t32.flops_per_sample,
        )
    # the graph survives its JSON form
    assert graph_from_dict(graph.to_dict()) == graph


class Branchy(nn.Module):
    """Data-dependent control flow: fx cannot trace through it."""

    def forward(self, x):
        return x * 2 if x.sum() > 0 else x - 1


class WithBranchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Branchy()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(self.inner(x))


def test_leaf_modules_make_untraceable_modules_traceable():
    x = torch.ones(1, 3)
    with pytest.raises(GraphError, match=r"model 'branchy': torch\.fx cannot trace it .*leaf_modules"):
        fx.trace_module(WithBranchy(), (x,), name="branchy")
    module = WithBranchy()
    gm, graph = fx.trace_module(module, (x,), name="branchy", leaf_modules=(Branchy,))
    assert [t.name for t in graph.tasks] == ["x", "inner", "fc", "output"]
    assert graph.task("inner").kind == "Branchy"
    assert torch.allclose(gm(x), module(x)) and torch.allclose(gm(-x), module(-x))


def test_bad_arguments():
    with pytest.raises(GraphError, match="unknown dtype 'fp64'"):
        fx.trace_module(Tiny(), (torch.randn(1, 4),), name="tiny", dtype="fp64")
    with pytest.raises(GraphError, match="example_inputs must be a tuple"):
        fx.trace_module(Tiny(), torch.randn(1, 4), name="tiny")
    with pytest.raises(GraphError, match="unknown ResNet 'resnet34'"):
        fx.build_resnet_graph("resnet34")


@pytest.fixture(scope="module")
def resnet50():
    return fx.build_resnet("resnet50", seed=0)


def test_resnet50_graph_module_matches_the_model(resnet50):
    model, gm, _, example = resnet50
    assert not model.training
    with torch.no_grad():
        expected = model(example).logits
        got = gm(example)
    assert got.shape == (1, 1000)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_resnet50_task_graph_shape(resnet50):
    _, gm, graph, _ = resnet50
    graph.validate()
    g = graph.to_networkx()
    assert nx.is_directed_acyclic_graph(g)
    sources = [n for n in g if g.in_degree(n) == 0]
    sinks = [n for n in g if g.out_degree(n) == 0]
    assert sources == ["pixel_values"] and graph.task("pixel_values").kind == "input"
    assert sinks == ["output"] and graph.task("output").kind == "output"
    assert [t.name for t in graph.tasks] == [n.name for n in gm.graph.nodes]  # no get_attr nodes here
    kinds = [t.kind for t in graph.tasks]
    assert 100 <= graph.num_tasks <= 500
    assert kinds.count("Conv2d") == 53 and kinds.count("BatchNorm2d") == 53 and kinds.count("add") == 16
    assert "Identity" not in kinds


def test_resnet50_numbers(resnet50):
    model, _, graph, _ = resnet50
    total_flops = sum(t.flops_per_sample for t in graph.tasks)
    assert total_flops == pytest.approx(8.2e9, rel=0.10)  # ~4.1 G multiply-adds per 224x224 image
    state_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    assert graph.total_weight_bytes() == state_bytes  # fp32: every parameter and buffer, once
    first = graph.edges[0]
    assert (first.src, first.bytes_per_sample) == ("pixel_values", 3 * 224 * 224 * 4)
    conv1 = graph.task(first.dst)
    assert conv1.kind == "Conv2d"
    assert conv1.flops_per_sample == 2 * 7 * 7 * 3 * 64 * 112 * 112


def test_resnet18_graph():
    graph = fx.build_resnet_graph("resnet18", dtype="fp16")
    kinds = [t.kind for t in graph.tasks]
    assert kinds.count("Conv2d") == 20 and kinds.count("add") == 8
    assert sum(t.flops_per_sample for t in graph.tasks) == pytest.approx(3.64e9, rel=0.05)  # 1.82 G MACs
    assert graph.total_weight_bytes() == pytest.approx(11.7e6 * 2, rel=0.02)  # 11.7 M parameters at fp16
    assert graph.meta_dict()["dtype"] == "fp16" and graph.meta_dict()["model"] == "resnet18"


def test_model_registry_builds_resnet(resnet50):
    from llm_planner.graph.models import ModelSpec, build_model_graph

    graph = build_model_graph(ModelSpec(name="resnet50", dtype="fp32"))
    assert graph.tasks == resnet50[2].tasks and graph.edges == resnet50[2].edges
