"""Each defect of the input-hardening issue, by its first failing example: the CLI exits 2 with
one message that names the file, the field and the problem (or, where the input is fine, plans
and verifies), in seconds. The general case is fuzzed in tests/test_fuzz_inputs.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llm_planner.cli.main import main
from llm_planner.graph.ir import Edge, GraphError, Task, TaskGraph

sys.path.insert(0, str(Path(__file__).parent))
from input_mutations import CLUSTER, GRAPH, WORKLOAD, Raw, alias_bomb, emit  # noqa: E402


def _doc(base: dict, path: str, value) -> str:
    """`base` with the field at `path` ("nodes.0.count") set to `value`, as text."""
    doc = json.loads(json.dumps(base))
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    target = doc
    for key in parents:
        target = target[key]
    target[last] = value
    return emit(doc)


def _plan(tmp_path: Path, capsys, *, cluster=None, graph=None, workload=None, extra=()) -> tuple[int, str]:
    """Write the files (text or bytes; None: the valid one), run `plan`, return (exit code, stderr on one line)."""

    def write(name: str, content) -> str:
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)

    if workload is not None:
        argv = ["plan", "--graph", write("workload.json", workload)]
    else:
        argv = [
            "plan",
            "--graph",
            write("graph.json", graph or emit(GRAPH)),
            "--cluster",
            write("cluster.yaml", cluster or emit(CLUSTER)),
        ]
    code = main([*argv, *extra, "--no-baselines", "-o", str(tmp_path / "plan.yaml")])
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err and err.count("error:") == (code != 0)
    return code, err


# -- encodings and syntax ---------------------------------------------------------------------


def test_a_latin1_name_in_a_spec_is_refused_with_its_line(tmp_path, capsys):
    text = emit(CLUSTER).replace('"fuzz"', '"f\u00e9e"').encode("latin-1")
    code, err = _plan(tmp_path, capsys, cluster=text)
    assert code == 2 and "cluster.yaml: line 1, column" in err and "not UTF-8" in err


@pytest.mark.parametrize("name, base", [("graph", GRAPH), ("workload", WORKLOAD)])
def test_a_utf16_graph_or_workload_file_is_refused(name, base, tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, **{name: emit(base).encode("utf-16")})
    assert code == 2 and f"{name}.json: the file is UTF-16 text; save it as UTF-8" in err


def test_a_duplicate_yaml_key_is_refused_with_its_path_and_line(tmp_path, capsys):
    text = emit(CLUSTER).replace('"mem_bytes": "16 GB"', '"mem_bytes": "16 GB", "mem_bytes": "80 GB"')
    code, err = _plan(tmp_path, capsys, cluster=text)
    assert code == 2 and "cluster.yaml: device_kinds[1]: duplicate key 'mem_bytes' (line 1)" in err


def test_a_duplicate_json_key_is_refused_with_its_path(tmp_path, capsys):
    text = emit(GRAPH).replace('"name": "b",', '"name": "b", "name": "b2",')
    code, err = _plan(tmp_path, capsys, graph=text)
    assert code == 2 and "graph.json: tasks[2]: duplicate key 'name'" in err


def test_yaml_merge_keys_may_still_override():
    from llm_planner.core.fileio import parse_document

    data = parse_document("base: &b {x: 1, y: 2}\nmine: {<<: *b, y: 3}\n", "t.yaml", ValueError, as_json=False)
    assert data["mine"] == {"x": 1, "y": 3}


# -- numbers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [Raw(".inf"), Raw(".nan"), Raw("1e999"), "1e999 TFLOP/s"])
def test_an_infinite_rate_in_a_spec_is_refused(value, tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, cluster=_doc(CLUSTER, "device_kinds.1.peak_flops.fp16", value))
    assert code == 2 and "cluster.yaml: device_kinds[1].peak_flops.fp16:" in err and "finite" in err


def test_an_integer_beyond_float_range_is_refused(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, cluster=_doc(CLUSTER, "device_kinds.0.mem_bytes", Raw("9" * 400)))
    assert code == 2 and "cluster.yaml: device_kinds[0].mem_bytes: an integer of 400 digits, beyond the range" in err


@pytest.mark.parametrize("value", [Raw("1e999"), Raw("NaN"), Raw("Infinity")])
def test_an_infinite_size_in_a_graph_is_refused(value, tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, graph=_doc(GRAPH, "tasks.1.weight_bytes", value))
    assert code == 2 and "graph.json: tasks[1].weight_bytes:" in err and "not a finite number" in err


def test_an_infinite_edge_cost_is_refused_by_the_file_and_by_the_graph_check(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, workload=_doc(WORKLOAD, "edges.0.cost", Raw("1e999")))
    assert code == 2 and "workload.json: edges[0].cost: inf is not a finite number" in err
    graph = TaskGraph(
        name="g", tasks=(Task(name="a"), Task(name="b")), edges=(Edge(src="a", dst="b", hop_s_per_sample=float("inf")),)
    )
    with pytest.raises(GraphError, match="hop_s_per_sample must be finite"):
        graph.validate()


# -- types and shapes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("tasks", 5, "graph.json: tasks: expected a list, got int"),
        ("edges", None, "graph.json: edges: expected a list, got NoneType"),
        ("meta", [1], "graph.json: meta: expected a mapping, got list"),
        ("tasks.2", 7, "graph.json: tasks[2]: expected a mapping, got int"),
        ("edges.1", ["a", "b"], "graph.json: edges[1]: expected a mapping, got list"),
        ("name", {"a": 1}, "graph.json: name: expected a non-empty string"),
    ],
)
def test_a_record_of_the_wrong_type_is_named(path, value, message, tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, graph=_doc(GRAPH, path, value))
    assert code == 2 and message in err


@pytest.mark.parametrize("depth", [40, 100_000])
def test_deep_nesting_is_refused_in_seconds(depth, tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, cluster=_doc(CLUSTER, "description", Raw("[" * depth + "]" * depth)))
    assert code == 2 and "cluster.yaml: line 1: nested deeper than the limit of 32 levels" in err
    code, err = _plan(tmp_path, capsys, graph=_doc(GRAPH, "meta", Raw("[" * depth + "]" * depth)))
    assert code == 2 and "graph.json" in err and "nested deeper than the limit of 32 levels" in err


# -- templates and names ------------------------------------------------------------------------


@pytest.mark.parametrize("hostname", ["gpu-{j}", "gpu-{0}", "gpu-{i", "gpu-{}", "gpu-{i.real}", "gpu-{i!r:>{w}}"])
def test_a_hostname_template_with_other_braces_is_refused(hostname, tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, cluster=_doc(CLUSTER, "nodes.0.hostname", hostname))
    assert code == 2 and "cluster.yaml: nodes[0].hostname:" in err and "{i}" in err


def test_a_hostname_template_may_format_the_index(capsys):
    from llm_planner.core.spec import parse_cluster

    cluster = parse_cluster(json.loads(_doc(CLUSTER, "nodes.0.hostname", "gpu{i:02d}.lab")))
    assert sorted({d.hostname for d in cluster.devices()}) == ["gpu00.lab", "gpu01.lab"]


def test_an_unknown_precision_name_is_refused_where_it_is_written(tmp_path, capsys):
    text = emit(CLUSTER).replace('"fp16": "100 TFLOP/s"', '"f16": "100 TFLOP/s"')
    code, err = _plan(tmp_path, capsys, cluster=text)
    assert code == 2 and "cluster.yaml: device_kinds[1].peak_flops.f16: unknown precision 'f16'" in err


def test_an_unknown_memory_device_type_is_refused(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, graph=_doc(GRAPH, "tasks.0.mem_device_types", ["gpus"]))
    assert code == 2 and "graph.json: tasks[0].mem_device_types: expected a list of device types" in err


def test_a_task_no_device_can_run_names_the_graph_and_the_field(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, graph=_doc(GRAPH, "tasks.2.device_types", ["accelerator"]))
    assert code == 2 and "graph.json on" in err and "cluster.yaml" in err
    assert (
        "can run task 'b' (tasks[2]): its device_types ['accelerator'] name none of the cluster's device types" in err
    )


def test_a_colocation_group_no_one_device_runs_is_named_as_such_not_as_memory(tmp_path, capsys):
    graph = json.loads(json.dumps(GRAPH))
    graph["tasks"][0]["device_types"], graph["tasks"][4]["device_types"] = ["cpu"], ["gpu"]
    graph = emit(graph)
    code, err = _plan(tmp_path, capsys, graph=graph)
    message = " ".join(err.split())
    assert code == 2 and "graph.json on" in message and "memory" not in message
    assert "colocate_group 'ends': its tasks must run on one device, but no device runs all of them" in message
    assert "'embed' on box-0/cpu0:0" in message and "'head' on box-0/gpu0:0" in message


def test_a_cluster_whose_memory_cannot_hold_the_model_exits_2(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, graph=_doc(GRAPH, "tasks.1.weight_bytes", 1e15))
    assert code == 2 and "graph.json on" in err and "memory cannot hold the model" in err and "short by" in err


# -- size ---------------------------------------------------------------------------------------


def test_a_yaml_alias_bomb_is_refused_in_seconds(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, cluster=_doc(CLUSTER, "nodes.0.hostname", alias_bomb()))
    assert code == 2 and "cluster.yaml: more than 2,000,000 values" in err


def test_more_values_than_the_limit_are_refused(monkeypatch, tmp_path, capsys):
    from llm_planner.core import fileio

    monkeypatch.setattr(fileio, "MAX_VALUES", 1_000)
    code, err = _plan(tmp_path, capsys, graph=_doc(GRAPH, "meta", list(range(1_000))))
    assert code == 2 and "graph.json: more than 1,000 values" in err
    monkeypatch.setattr(fileio, "MAX_FILE_BYTES", 1_000)
    code, err = _plan(tmp_path, capsys, graph=emit(GRAPH))
    assert code == 2 and "graph.json: larger than" in err


def test_a_million_devices_are_refused(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, cluster=_doc(CLUSTER, "nodes.0.count", 10**6))
    assert code == 2 and "cluster.yaml: nodes: the cluster has 3,000,000 devices" in err and "limit is 65,536" in err


def test_a_workload_with_1e5_accelerators_is_refused(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, workload=_doc(WORKLOAD, "maxFPGAs", 10**5))
    assert code == 2 and "workload.json: field 'maxFPGAs'" in err and "limit is 65,536" in err


def _chain(n: int) -> str:
    tasks = [{"name": f"t{i}", "flops_per_sample": 1e9, "weight_bytes": 1e6} for i in range(n)]
    edges = [{"src": f"t{i}", "dst": f"t{i + 1}", "bytes_per_sample": 1e5} for i in range(n - 1)]
    return json.dumps({"format": "llm_planner.graph", "version": 1, "name": "chain", "tasks": tasks, "edges": edges})


def test_a_chain_past_the_task_limit_is_refused_in_seconds(tmp_path, capsys):
    """60,000 tasks (a fifth over the limit): the file's size grows the time to read it, not the check."""
    code, err = _plan(tmp_path, capsys, graph=_chain(60_000))
    assert code == 2 and "graph.json: tasks: 60,000 tasks; the limit is 50,000" in err


def test_too_many_task_device_pairs_are_refused(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, graph=_chain(40_000), cluster=_doc(CLUSTER, "nodes.0.count", 4))
    assert (
        code == 2
        and "graph.json on" in err
        and "40,000 tasks x 12 devices = 480,000 placement pairs; the limit is 300,000" in err
    )


def test_a_workload_plan_verifies(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, workload=emit(WORKLOAD))
    assert code == 0
    assert main(["verify", str(tmp_path / "plan.yaml")]) == 0, capsys.readouterr()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["plan", "--time-limit", "nan"], "--time-limit"),
        (["plan", "--time-limit", "inf"], "--time-limit"),
        (["plan", "--time-limit", "0"], "--time-limit"),
        (["plan", "--threads", "-1"], "--threads"),
        (["plan", "--workers", "-1"], "--workers"),
        (["plan", "--gap", "2"], "--gap"),
        (["plan", "--dtype", "nonsense"], "--dtype"),
        (["compare-symmetry", "--time-limit", "-1"], "--time-limit"),
        (["launch", "plan.yaml", "--dtype", "nonsense"], "--dtype"),
    ],
)
def test_flags_out_of_range_are_refused_by_name(args, flag, capsys):
    assert main([*args, "--cluster", "c.yaml", "--model", "gpt2"] if args[0] != "launch" else args) == 2
    assert f"argument {flag}:" in capsys.readouterr().err
