"""The size limits that benchmarks/bench_limits.py measured (docs/inputs.md): past each one, `plan`
exits 2 in seconds with a message naming the file, the field or the numbers, and the limit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from llm_planner.cli.main import main
from llm_planner.core.spec_fields import MAX_NAME_CHARS
from llm_planner.graph.ir import MAX_GRAPH_NAME_CHARS, MAX_TASK_NAME_CHARS
from llm_planner.placement.problem import MAX_TRANSFER_ENTRIES

sys.path.insert(0, str(Path(__file__).parent))
from input_mutations import CLUSTER, GRAPH, emit  # noqa: E402


def _plan(tmp_path: Path, capsys, cluster: dict, graph: dict, *extra: str) -> tuple[int, str]:
    (tmp_path / "cluster.yaml").write_text(emit(cluster))
    (tmp_path / "graph.json").write_text(json.dumps(graph))
    code = main(
        [
            "plan",
            "--graph",
            str(tmp_path / "graph.json"),
            "--cluster",
            str(tmp_path / "cluster.yaml"),
            *extra,
            "--no-baselines",
            "-o",
            str(tmp_path / "plan.yaml"),
        ]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    return code, err


def _fleet(servers: int) -> dict:
    """CLUSTER with `servers` copies of its node (a CPU and two GPUs each)."""
    spec = json.loads(json.dumps(CLUSTER))
    spec["nodes"][0]["count"] = servers
    return spec


def test_transfer_tables_past_their_limit_are_refused_with_the_numbers(tmp_path, capsys):
    # 4,000 servers of 3 devices: the graph's 5 tasks x 12,000 devices are inside the pair limit,
    # its edges x 12,000^2 transfer costs are not (they would need tens of GB)
    servers, edges = 4_000, len(GRAPH["edges"])
    code, err = _plan(tmp_path, capsys, _fleet(servers), GRAPH)
    assert code == 2
    assert f"the limit is {MAX_TRANSFER_ENTRIES:,}" in err and "graph.json on" in err
    assert f"{edges * (3 * servers) ** 2:,} transfer costs" in err and f"{3 * servers:,} devices" in err


def test_transfer_tables_inside_their_limit_plan(tmp_path, capsys):
    code, err = _plan(tmp_path, capsys, _fleet(4), GRAPH)
    assert code == 0, err


@pytest.mark.parametrize(
    ("where", "limit"),
    [("graph:name", MAX_GRAPH_NAME_CHARS), ("graph:task", MAX_TASK_NAME_CHARS)]
    + [(f"cluster:{what}", MAX_NAME_CHARS) for what in ("name", "kind", "node")],
)
def test_names_past_their_limit_are_refused_and_at_it_plan(tmp_path, capsys, where, limit):
    for chars, refused in ((limit, False), (limit + 1, True)):
        name = "n" * chars
        graph, cluster = json.loads(json.dumps(GRAPH)), json.loads(json.dumps(CLUSTER))
        if where == "graph:name":
            graph["name"] = name
        elif where == "graph:task":
            old = graph["tasks"][1]["name"]
            graph["tasks"][1]["name"] = name
            for edge in graph["edges"]:
                edge.update({k: name for k in ("src", "dst") if edge[k] == old})
        elif where == "cluster:name":
            cluster["name"] = name
        elif where == "cluster:node":
            cluster["nodes"][0]["name"] = name
        else:
            old = cluster["device_kinds"][1]["name"]
            text = emit(cluster).replace(old, name)  # every use of the kind: devices, links, graph times
            cluster = yaml.safe_load(text)
            graph = json.loads(json.dumps(graph).replace(f'"{old}"', f'"{name}"'))
        code, err = _plan(tmp_path, capsys, cluster, graph)
        if refused:
            assert code == 2 and f"longer than {limit} characters" in err, err
            assert ("graph.json" in err) if where.startswith("graph") else ("cluster.yaml" in err)
        else:
            assert code == 0, err
