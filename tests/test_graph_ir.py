"""Task graph IR: DAG check, JSON round trip, precise errors for bad files."""

from __future__ import annotations

import json

import pytest

from llm_planner.graph.ir import Edge, GraphError, Task, TaskGraph, graph_from_dict, load_graph_json


def _graph() -> TaskGraph:
    tasks = (
        Task(name="a", flops_per_sample=1e9, weight_bytes=10.0),
        Task(name="b", kind="conv", bytes_per_sample=5.0, time_s_by_kind=(("gpu", 1.0),), device_types=("gpu",)),
        Task(name="c", mem_bytes_per_sample=3.0, colocate_group="g", labels=(("layer", 2),)),
    )
    edges = (Edge(src="a", dst="b", bytes_per_sample=4.0), Edge(src="b", dst="c", hop_s_per_sample=0.5))
    return TaskGraph(name="t", tasks=tasks, edges=edges, meta=(("model", "x"),)).validate()


def test_round_trip(tmp_path):
    g = _graph()
    path = tmp_path / "g.json"
    path.write_text(g.to_json())
    back = load_graph_json(path)
    assert back == g and back.sha256() == g.sha256()
    assert back.task("c").label("layer") == 2
    assert back.topological_order() == ["a", "b", "c"]


def test_cycle_is_rejected():
    g = TaskGraph(
        name="cyc", tasks=(Task(name="a"), Task(name="b")), edges=(Edge(src="a", dst="b"), Edge(src="b", dst="a"))
    )
    with pytest.raises(GraphError, match="not a DAG"):
        g.validate()


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["tasks"][0].update(flops_per_sample="lots"), r"tasks\[0\].flops_per_sample: expected a number"),
        (lambda d: d["tasks"][1].update(time_s_by_kind=[1, 2]), r"tasks\[1\].time_s_by_kind: expected a mapping"),
        (lambda d: d["tasks"][0].update(colour=1), r"tasks\[0\]: unknown key"),
        (lambda d: d["edges"][0].update(dst="zz"), "names unknown task 'zz'"),
        (lambda d: d["tasks"][0].update(weight_bytes=-1), "weight_bytes must be finite, >= 0 and at most"),
        (
            lambda d: d["tasks"][0].update(flops_per_sample=1e300),
            r"flops_per_sample must be finite, >= 0 and at most 1e\+18",
        ),
        (lambda d: d["edges"][0].update(bytes_per_sample=1e24), "bytes_per_sample must be finite, >= 0 and at most"),
        (lambda d: d.update(name="t\udc80"), r"name: 't\\udc80' is not text UTF-8 can hold"),
        (lambda d: d.update(version=7), "version: unsupported version 7"),
        (lambda d: d.update(version=1.0), "version: unsupported version 1.0"),
        (lambda d: d.update(version=True), "version: unsupported version True"),
        (lambda d: d["edges"][0].update(bytes_per_sample=None), r"edges\[0\].bytes_per_sample: expected a number"),
    ],
)
def test_bad_graph_files_name_the_field(mutate, expected):
    data = json.loads(_graph().to_json())
    mutate(data)
    with pytest.raises(GraphError, match=expected) as err:
        graph_from_dict(data, source="bad.json")
    assert str(err.value).startswith("bad.json")
