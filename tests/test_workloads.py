"""The dnn-partitioning workload importer: published files, field mapping, the throughput rule, errors."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import networkx as nx
import pytest
from conftest import WORKLOADS

from llm_planner.graph import workloads
from llm_planner.graph.ir import GraphError
from llm_planner.placement.inputs import load_graph_file
from llm_planner.placement.problem import build_problem
from llm_planner.placement.schedule import device_loads

WORKLOAD_FILES = sorted(WORKLOADS.glob("*-inputs/*/*.json")) if WORKLOADS.is_dir() else []


def _small() -> dict:
    """3 nodes: a -> b, a -> c, b -> c; b CPU-only; a and c in one colour class."""
    return {
        "maxSizePerFPGA": 1000.0,
        "maxFPGAs": 2,
        "maxCPUs": 1,
        "nodes": [
            {
                "id": 7,
                "name": "a",
                "cpuLatency": 100.0,
                "fpgaLatency": 10.0,
                "supportedOnFpga": 1,
                "size": 300.0,
                "colorClass": 1,
                "isBackwardNode": 0,
                "layerId": 4,
            },
            {
                "id": 3,
                "name": "b",
                "cpuLatency": 200.0,
                "fpgaLatency": 20.0,
                "supportedOnFpga": False,
                "size": 0,
                "colorClass": 2,
                "isBackwardNode": True,
            },
            {
                "id": 5,
                "name": "c",
                "cpuLatency": 300.0,
                "fpgaLatency": 30.0,
                "supportedOnFpga": True,
                "size": 500.0,
                "colorClass": 1,
                "isBackwardNode": False,
            },
        ],
        "edges": [
            {"sourceId": 7, "destId": 3, "cost": 1.0, "size": 64.0},
            {"sourceId": 7, "destId": 5, "cost": 1.0, "size": 64.0},
            {"sourceId": 3, "destId": 5, "cost": 2.0},
        ],
    }


@pytest.mark.skipif(
    not WORKLOAD_FILES, reason="no dnn-partitioning checkout (LLM_PLANNER_WORKLOADS, docs/workloads.md)"
)
@pytest.mark.parametrize("path", WORKLOAD_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}")
def test_published_file_loads(path: Path):
    data = json.loads(path.read_text())
    assert workloads.is_workload(data)
    graph, cluster = load_graph_file(path)
    assert graph.num_tasks == len(data["nodes"])
    assert len(graph.edges) == len(data["edges"])
    assert nx.is_directed_acyclic_graph(graph.to_networkx())
    kinds = [d.kind for d in cluster.devices()]
    assert kinds.count("accelerator") == data["maxFPGAs"]
    assert kinds.count("cpu") == data["maxCPUs"]
    assert cluster.kind("accelerator").mem_bytes == data["maxSizePerFPGA"]
    assert graph.meta_dict() == {"source": str(path), "workload_format": "dnn-partitioning"}
    by_id = {n["id"]: n for n in data["nodes"]}
    for task in graph.tasks:
        node = by_id[task.label("id")]
        assert dict(task.time_s_by_kind) == {"accelerator": node["fpgaLatency"], "cpu": node["cpuLatency"]}
        assert task.weight_bytes == node["size"]


def test_small_workload_field_by_field():
    graph, cluster = workloads.workload_from_dict(_small(), source="dir/small.json")
    assert graph.name == "small"
    assert [t.name for t in graph.tasks] == ["a", "b", "c"]
    a, b, c = graph.tasks
    assert a.time_s_by_kind == (("accelerator", 10.0), ("cpu", 100.0))
    assert b.time_s_by_kind == (("accelerator", 20.0), ("cpu", 200.0))
    assert (a.device_types, b.device_types, c.device_types) == ((), ("cpu",), ())
    assert (a.colocate_group, b.colocate_group, c.colocate_group) == ("1", "", "1")  # class 2 has one member
    assert (a.weight_bytes, b.weight_bytes, c.weight_bytes) == (300.0, 0.0, 500.0)
    assert all(t.mem_device_types == ("accelerator",) for t in graph.tasks)
    assert (a.kind, b.kind, c.kind) == ("forward", "backward", "forward")
    assert dict(a.labels) == {"id": 7, "is_backward": False, "color_class": 1, "layer_id": 4}
    assert dict(b.labels) == {"id": 3, "is_backward": True, "color_class": 2}
    assert a.flops_per_sample == a.bytes_per_sample == 0.0
    edges = {(e.src, e.dst): (e.bytes_per_sample, e.hop_s_per_sample) for e in graph.edges}
    assert edges == {("a", "b"): (64.0, 1.0), ("a", "c"): (64.0, 1.0), ("b", "c"): (0.0, 2.0)}
    assert graph.meta_dict() == {"source": "dir/small.json", "workload_format": "dnn-partitioning"}

    assert cluster.source == "dir/small.json"
    assert [n.name for n in cluster.nodes] == ["host"]
    assert cluster.nodes[0].devices == (("accelerator", 2), ("cpu", 1))
    acc, cpu = cluster.kind("accelerator"), cluster.kind("cpu")
    assert (acc.type, acc.mem_bytes, cpu.type, cpu.mem_bytes) == ("accelerator", 1000.0, "cpu", math.inf)
    assert acc.peak_flops == cpu.peak_flops == (("fp16", 1.0),)
    assert cluster.intra_node_default.bw_bytes_per_s == math.inf and cluster.intra_node_default.latency_s == 0.0
    assert [d.name for d in cluster.devices()] == ["host/accelerator:0", "host/accelerator:1", "host/cpu:0"]
    assert cluster.sha256 and cluster.sha256 == workloads.workload_from_dict(_small(), "other.json")[1].sha256


def test_kind_with_zero_devices_is_left_out():
    data = _small()
    data["maxFPGAs"] = 0
    _, cluster = workloads.workload_from_dict(data, "x.json")
    assert [k.name for k in cluster.device_kinds] == ["cpu"]
    assert [d.name for d in cluster.devices()] == ["host/cpu:0"]


def test_repeated_or_missing_names_get_the_id():
    data = _small()
    data["nodes"][2]["name"] = "a"
    graph, _ = workloads.workload_from_dict(data, "x.json")
    assert [t.name for t in graph.tasks] == ["7:a", "3:b", "5:a"]
    del data["nodes"][1]["name"]
    graph, _ = workloads.workload_from_dict(data, "x.json")
    assert [t.name for t in graph.tasks] == ["7:a", "3", "5:a"]
    assert {(e.src, e.dst) for e in graph.edges} == {("7:a", "3"), ("7:a", "5:a"), ("3", "5:a")}


def test_host_staged_loads_match_the_published_rule():
    """Accelerator: its nodes' fpgaLatency + cost once per own node whose output leaves + cost once
    per outside node whose output enters. CPU: its nodes' cpuLatency only."""
    data = _small()
    for n in data["nodes"]:
        n.pop("colorClass")
    graph, cluster = workloads.workload_from_dict(data, "small.json")
    problem = build_problem(graph, cluster, objective="throughput")
    assert problem.throughput_model == "host_staged"
    acc0, acc1, cpu = 0, 1, 2
    a, b, c = 0, 1, 2
    # a on acc0, b on the CPU, c on acc1:
    #   acc0 = 10 (a) + 1 (a's output leaves, once although it goes to two devices) = 11
    #   cpu  = 200 (b), transfers free
    #   acc1 = 30 (c) + 1 (a's output enters) + 2 (b's output enters) = 33
    assign = [0] * 3
    assign[a], assign[b], assign[c] = acc0, cpu, acc1
    assert device_loads(problem, [1], [assign]).tolist() == pytest.approx([11.0, 33.0, 200.0])
    # everything on acc0 but b (CPU-only): acc0 = 10 + 30 + 1 (a leaves) + 2 (b enters) = 43
    assign[c] = acc0
    assert device_loads(problem, [1], [assign]).tolist() == pytest.approx([43.0, 0.0, 200.0])
    # a batch of 2 samples in one shard doubles every term
    assert device_loads(problem, [2], [assign]).tolist() == pytest.approx([86.0, 0.0, 400.0])
    # latency-model transfers: cost once per accelerator end
    e_ab, e_ac, e_bc = 0, 1, 2
    assert problem.transfer_time(e_ab, acc0, cpu, 1) == pytest.approx(1.0)
    assert problem.transfer_time(e_ac, acc0, acc1, 1) == pytest.approx(2.0)
    assert problem.transfer_time(e_bc, cpu, acc1, 1) == pytest.approx(2.0)
    assert problem.transfer_time(e_ac, acc0, acc0, 1) == 0.0
    # memory: size counts on accelerators only
    assert problem.mem_counts.tolist() == [[True, True, False]] * 3
    assert problem.mem_capacity.tolist() == [1000.0, 1000.0, math.inf]
    assert not problem.supported[b, acc0] and problem.supported[b, cpu]


def test_is_workload():
    assert workloads.is_workload(_small())
    assert not workloads.is_workload({"format": "llm_planner.graph", "tasks": [], "nodes": [], "maxFPGAs": 1})
    assert not workloads.is_workload({"nodes": []})
    assert not workloads.is_workload([1, 2])


def _broken(mutate) -> dict:
    data = copy.deepcopy(_small())
    mutate(data)
    return data


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("maxCPUs"), r"bad\.json: field 'maxCPUs': missing required field"),
        (lambda d: d.update(maxFPGAs=-1), r"bad\.json: field 'maxFPGAs': must be >= 0"),
        (lambda d: d.update(maxFPGAs=0, maxCPUs=0), r"bad\.json: field 'maxFPGAs': .*no device"),
        (lambda d: d.update(maxFPGAs="2"), r"bad\.json: field 'maxFPGAs': expected an integer"),
        (lambda d: d.update(maxSizePerFPGA=0), r"bad\.json: field 'maxSizePerFPGA': must be positive"),
        (lambda d: d.update(nodes=[]), r"bad\.json: field 'nodes': the workload has no nodes"),
        (lambda d: d.pop("edges"), r"bad\.json: field 'edges': missing required field"),
        (lambda d: d["nodes"][1].pop("cpuLatency"), r"bad\.json: nodes\[1\] \(id 3\): field 'cpuLatency': missing"),
        (
            lambda d: d["nodes"][2].update(fpgaLatency=-1.0),
            r"bad\.json: nodes\[2\] \(id 5\): field 'fpgaLatency': .*>= 0",
        ),
        (lambda d: d["nodes"][0].update(size="big"), r"nodes\[0\] \(id 7\): field 'size': expected a finite number"),
        (lambda d: d["nodes"][0].update(supportedOnFpga=2), r"nodes\[0\] \(id 7\): field 'supportedOnFpga'"),
        (lambda d: d["nodes"][2].update(id=7), r"nodes\[2\]: field 'id': duplicate id 7 \(also nodes\[0\]\)"),
        (lambda d: d["nodes"][0].pop("id"), r"nodes\[0\]: field 'id': missing required field"),
        (lambda d: d.update(maxCPUs=0), r"nodes\[1\] \(id 3\): field 'supportedOnFpga': .*maxCPUs is 0"),
        (lambda d: d["edges"][0].update(destId=99), r"edges\[0\] \(7 -> 99\): field 'destId': no node has id 99"),
        (lambda d: d["edges"][0].pop("cost"), r"edges\[0\] \(7 -> 3\): field 'cost': missing required field"),
        (lambda d: d["edges"][1].update(cost=5.0), r"edges\[1\] \(7 -> 5\): field 'cost': .*differs .* edges\[0\]"),
        (lambda d: d["edges"].append(dict(d["edges"][0])), r"edges\[3\] \(7 -> 3\): duplicate of edges\[0\]"),
        (
            lambda d: d["edges"].append({"sourceId": 5, "destId": 5, "cost": 0.0}),
            r"edges\[3\] \(5 -> 5\): an edge from a node to itself",
        ),
        (lambda d: d["edges"].append({"sourceId": 5, "destId": 7, "cost": 0.0}), r"bad\.json: .*not a DAG"),
    ],
)
def test_malformed_workload_names_file_and_field(mutate, message):
    with pytest.raises(GraphError, match=message):
        workloads.workload_from_dict(_broken(mutate), source="bad.json")


def test_malformed_file_on_disk_names_the_file(tmp_path: Path):
    path = tmp_path / "broken_workload.json"
    path.write_text(json.dumps(_broken(lambda d: d["nodes"][0].pop("fpgaLatency"))))
    with pytest.raises(GraphError, match=r"broken_workload\.json: nodes\[0\] \(id 7\): field 'fpgaLatency'"):
        load_graph_file(path)
    path.write_text("{not json")
    with pytest.raises(GraphError, match=r"broken_workload\.json: not valid JSON"):
        workloads.load_workload(path)


def test_plan_and_show_print_a_workloads_times_in_file_units(tmp_path: Path, capsys):
    from llm_planner.cli.main import main

    path = tmp_path / "w.json"
    path.write_text(json.dumps(_small()))
    assert main(["plan", "--graph", str(path), "--no-baselines", "-o", str(tmp_path / "p.yaml")]) == 0
    assert main(["show", str(tmp_path / "p.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.count("objective (file units)") == 2 and "times in the workload file's own unit" in out
    from llm_planner.core.plan import load_plan

    objective = load_plan(tmp_path / "p.yaml").objective_s
    import re

    assert re.search(rf"│\s+{objective:.4g}\s+│", out)  # a plain number, not seconds
