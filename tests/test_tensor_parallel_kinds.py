"""Which device kinds form tensor-parallel groups: `device_kinds[].tensor_parallel` (false by
default for CPUs, true for GPUs and accelerators), read by every place that forms groups."""

from __future__ import annotations

import pytest
import yaml

from llm_planner.cli.main import main
from llm_planner.core.spec import parse_cluster
from llm_planner.core.tensor_groups import GroupError, group_from_members, tensor_groups
from llm_planner.graph.ir import Task, TaskGraph
from llm_planner.placement.baselines.tensor_parallel import run_tp_baseline
from llm_planner.placement.problem import build_problem


def _spec(type_: str, **extra) -> dict:
    kind = {
        "name": "k",
        "type": type_,
        "peak_flops": {"fp16": "1 TFLOP/s"},
        "mem_bytes": "64 GiB",
        "mem_bw_bytes_per_s": "100 GB/s",
        **extra,
    }
    return {
        "name": "c",
        "device_kinds": [kind],
        "nodes": [{"name": "n", "devices": {"k": 4}}],
        "links": {"intra_node_default": {"bw_bytes_per_s": "10 GB/s", "latency_s": "5 us"}},
    }


def _names(spec: dict) -> list[str]:
    return [g.name for g in tensor_groups(parse_cluster(spec, "c.yaml"), 4)]


def test_a_cpu_kind_forms_groups_only_when_the_spec_says_so():
    """The issue's first example: CPU sockets formed "tensor-parallel groups"; now only on opt-in."""
    assert _names(_spec("cpu")) == []
    assert _names(_spec("cpu", tensor_parallel=False)) == []
    assert _names(_spec("cpu", tensor_parallel=True)) == ["n/k:0-1", "n/k:2-3", "n/k:0-3"]
    assert _names(_spec("gpu")) == ["n/k:0-1", "n/k:2-3", "n/k:0-3"]
    assert _names(_spec("accelerator")) == ["n/k:0-1", "n/k:2-3", "n/k:0-3"]
    assert _names(_spec("gpu", tensor_parallel=False)) == []


def test_a_plan_group_over_a_kind_without_groups_is_refused():
    cpu = parse_cluster(_spec("cpu"), "c.yaml")
    with pytest.raises(GroupError, match=r"kind 'k' \(cpu\) do not form tensor-parallel groups.*tensor_parallel"):
        group_from_members(cpu, ["n/k:0", "n/k:1"])
    opted_in = parse_cluster(_spec("cpu", tensor_parallel=True), "c.yaml")
    assert group_from_members(opted_in, ["n/k:0", "n/k:1"]) == "n/k:0-1"


def test_problems_and_the_megatron_baseline_use_no_cpu_group():
    """The placement devices of a CPU-only cluster are its cores; megatron runs the model on one of
    them instead of the group of all four (and on the group once the spec opts in)."""
    task = Task(name="t", flops_per_sample=1e9, bytes_per_sample=1e6, weight_bytes=1e6, tp_divides=(4,))
    graph = TaskGraph(name="g", tasks=(task,), edges=()).validate()
    plain = build_problem(graph, parse_cluster(_spec("cpu"), "c.yaml"), max_tp=4)
    assert [d.degree for d in plain.devices] == [1, 1, 1, 1]
    assert set(run_tp_baseline("megatron", plain).shard_assignments[0].values()) <= {"n/k:0", "n/k:1", "n/k:2", "n/k:3"}
    grouped = build_problem(graph, parse_cluster(_spec("cpu", tensor_parallel=True), "c.yaml"), max_tp=4)
    assert set(run_tp_baseline("megatron", grouped).shard_assignments[0].values()) == {"n/k:0-3"}


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_a_tensor_parallel_that_is_not_a_boolean_exits_2_naming_file_and_field(tmp_path, capsys, value):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_spec("cpu", tensor_parallel=value)))
    assert main(["show-cluster", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: device_kinds[0].tensor_parallel: expected true or false, got" in err
    assert "Traceback" not in err
