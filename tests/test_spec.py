"""Cluster spec loader: every example loads; every broken spec gets a precise message."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml

from llm_planner.core import units
from llm_planner.core.spec import SpecError, load_cluster, parse_cluster
from llm_planner.core.tensor_groups import GroupError, group_from_members, tensor_groups

SPECS = Path(__file__).resolve().parents[1] / "cluster_specs"
EXAMPLES = sorted(SPECS.glob("*.yaml"))


def test_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert {"cpu-two-gpus", "four-gpus", "localhost-cpu", "gpt3-six-servers"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_loads(path):
    cluster = load_cluster(path)
    devices = cluster.devices()
    assert devices and len({d.name for d in devices}) == len(devices)
    assert len(cluster.sha256) == 64
    for a in devices:
        for b in devices:
            link = cluster.link(a, b)
            assert (link is None) == (a.name == b.name)
            if link is not None:
                assert link.bw_bytes_per_s > 0 and link.latency_s >= 0


def test_six_server_cluster_shape():
    cluster = load_cluster(SPECS / "gpt3-six-servers.yaml")
    devices = cluster.devices()
    assert len({d.node for d in devices}) == 6
    assert sum(cluster.kind(d.kind).type == "gpu" for d in devices) >= 48
    assert len({d.kind for d in devices if cluster.kind(d.kind).type == "gpu"}) >= 2
    a, b = devices[1], devices[2]  # two GPUs of one H100 server: NVLink
    assert cluster.link(a, b).bw_bytes_per_s == pytest.approx(450e9)
    other = next(d for d in devices if d.node != a.node)
    assert cluster.link(a, other).bw_bytes_per_s == pytest.approx(25e9)
    assert {d.hostname for d in devices} >= {"h100-0", "h100-1"}


def test_units():
    assert units.parse_bytes("80 GiB") == 80 * 2**30
    assert units.parse_bytes("40 GB") == 40e9
    assert units.parse_bandwidth("25 GB/s") == 25e9
    assert units.parse_bandwidth("200 Gb/s") == 25e9
    assert units.parse_seconds("2 us") == pytest.approx(2e-6)
    assert units.parse_flops("312 TFLOP/s") == 312e12
    assert units.parse_bytes(1024) == 1024.0
    for bad in ("12 parsecs", "GB", "", True):
        with pytest.raises(units.UnitError):
            units.parse_bytes(bad)
    with pytest.raises(units.UnitError, match="a size is in bytes"):
        units.parse_bytes("80 Gb")  # bits only in a bandwidth: a memory of "80 Gb" is a slip for 80 GB
    for digits in ("\u0668\u0660 GB", "\uff18\uff10 GB"):  # Arabic-Indic and full-width digits
        with pytest.raises(units.UnitError, match="cannot read"):
            units.parse_bytes(digits)
    with pytest.raises(units.UnitError):
        units.parse_duration("\u0665\u0660 ms", 1e-3, 10.0)


BASE = {
    "name": "t",
    "device_kinds": [
        {
            "name": "g",
            "type": "gpu",
            "peak_flops": {"fp16": "100 TFLOP/s"},
            "mem_bytes": "16 GiB",
            "mem_bw_bytes_per_s": "900 GB/s",
        },
        {
            "name": "c",
            "type": "cpu",
            "peak_flops": {"fp16": "1 TFLOP/s"},
            "mem_bytes": "unlimited",
            "mem_bw_bytes_per_s": "100 GB/s",
        },
    ],
    "nodes": [{"name": "n", "devices": {"g": 2, "c": 1}, "count": 2}],
    "links": {
        "intra_node_default": {"bw_bytes_per_s": "16 GB/s"},
        "inter_node": {"bw_bytes_per_s": "10 GB/s", "latency_s": "5 us"},
    },
}


def test_base_parses():
    cluster = parse_cluster(copy.deepcopy(BASE), source="base.yaml")
    assert len(cluster.devices()) == 6
    assert cluster.kind("c").mem_bytes == math.inf
    assert [d.node for d in cluster.devices()][:3] == ["n-0"] * 3


def _broken(mutate):
    data = copy.deepcopy(BASE)
    mutate(data)
    return data


BROKEN = {
    "unknown top key": (lambda d: d.update(colour="red"), "<top>: unknown key(s) 'colour'"),
    "missing name": (lambda d: d.pop("name"), "name: missing required field"),
    "negative memory": (
        lambda d: d["device_kinds"][0].update(mem_bytes="-16 GiB"),
        "device_kinds[0].mem_bytes: must be positive",
    ),
    "zero bandwidth": (
        lambda d: d["links"]["inter_node"].update(bw_bytes_per_s=0),
        "links.inter_node.bw_bytes_per_s: must be positive",
    ),
    "bad unit": (
        lambda d: d["device_kinds"][0].update(mem_bw_bytes_per_s="900 furlongs"),
        "device_kinds[0].mem_bw_bytes_per_s: unknown unit",
    ),
    "unknown kind in node": (
        lambda d: d["nodes"][0]["devices"].update(tpu=1),
        "nodes[0].devices.tpu: unknown device kind 'tpu'",
    ),
    "unknown kind in link": (
        lambda d: d["links"].update(intra_node=[{"between": ["g", "tpu"], "bw_bytes_per_s": "1 GB/s"}]),
        "links.intra_node[0].between: unknown device kind 'tpu'",
    ),
    "bad type": (lambda d: d["device_kinds"][0].update(type="quantum"), "device_kinds[0].type: must be one of"),
    "unknown kind key": (lambda d: d["device_kinds"][1].update(cores=32), "device_kinds[1]: unknown key(s) 'cores'"),
    "missing inter-node": (
        lambda d: d["links"].pop("inter_node"),
        "links.inter_node: the cluster has 2 nodes but no link",
    ),
    "missing intra default": (lambda d: d["links"].pop("intra_node_default"), "no link between kinds"),
    "efficiency above 1": (
        lambda d: d["device_kinds"][0].update(compute_efficiency=1.5),
        "device_kinds[0].compute_efficiency: must be in [0.001, 1]",
    ),
    "zero count": (lambda d: d["nodes"][0].update(count=0), "nodes[0].count: must be positive"),
    "non-integer count": (lambda d: d["nodes"][0]["devices"].update(g=1.5), "nodes[0].devices.g: expected an integer"),
    "empty kinds": (lambda d: d.update(device_kinds=[]), "device_kinds: expected a non-empty list"),
    "duplicate kinds": (lambda d: d["device_kinds"].append(dict(d["device_kinds"][0])), "duplicate device kind names"),
    "duplicate node templates": (
        lambda d: d["nodes"].append({**d["nodes"][-1], "count": 3}),
        "nodes[1].name: duplicate node name 'n' (nodes[0] has it too)",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_spec_message(case):
    mutate, expected = BROKEN[case]
    with pytest.raises(SpecError) as err:
        parse_cluster(_broken(mutate), source="broken.yaml")
    message = str(err.value)
    assert message.startswith("broken.yaml: "), message
    assert expected in message, message


def test_load_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match="nope.yaml: cannot read"):
        load_cluster(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="bad.yaml: not valid YAML"):
        load_cluster(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(_broken(lambda d: d["device_kinds"][0].update(mem_bytes=0))))
    with pytest.raises(SpecError, match=r"broken.yaml: device_kinds\[0\].mem_bytes: must be positive"):
        load_cluster(broken)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(SpecError, match=r"empty.yaml: <top>: expected a mapping, got nothing \(an empty document\)"):
        load_cluster(empty)


def test_cli_bad_spec_exit_code(tmp_path, capsys):
    from llm_planner.cli.main import main

    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(_broken(lambda d: d["nodes"][0]["devices"].update(tpu=1))))
    assert main(["show-cluster", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "broken.yaml" in err and "unknown device kind 'tpu'" in err and "Traceback" not in err


def test_group_from_members_names_exactly_the_listed_groups():
    """The direct check gives every aligned group `tensor_groups` lists, and refuses the rest with the reason."""
    cluster = load_cluster(Path(__file__).resolve().parents[1] / "cluster_specs" / "gpt3-six-servers.yaml")
    listed = tensor_groups(cluster, 8)
    assert listed
    for g in listed:
        assert group_from_members(cluster, list(g.members)) == g.name
    h = [f"h100-server-0/h100-80g:{j}" for j in range(8)]
    with pytest.raises(GroupError, match="not an aligned block"):
        group_from_members(cluster, h[1:3])  # starts off a multiple of its degree
    with pytest.raises(GroupError, match="not an aligned block"):
        group_from_members(cluster, h[:3])  # degree 3 does not divide 8
    with pytest.raises(GroupError, match="not an aligned block"):
        group_from_members(cluster, [h[0], h[2]])  # not consecutive
    with pytest.raises(GroupError, match="not an aligned block"):
        group_from_members(cluster, h[:4], max_tp=2)
    with pytest.raises(GroupError, match="mixes nodes"):
        group_from_members(cluster, [h[0], "h100-server-1/h100-80g:1"])
    with pytest.raises(GroupError, match="unknown"):
        group_from_members(cluster, [h[0], "h100-server-0/h100-80g:9"])


def test_a_cluster_pickles_after_its_device_map_is_used():
    """MILP-SPLIT's workers receive the cluster by pickle, possibly after a group check cached its map."""
    import pickle

    cluster = load_cluster(Path(__file__).resolve().parents[1] / "cluster_specs" / "four-gpus.yaml")
    first = cluster.devices()[0]
    assert cluster.device_map()[first.name] == first
    assert pickle.loads(pickle.dumps(cluster)).device_map()[first.name] == first
