"""`import helix` of a geo-distributed cluster file (docs/helix.md, "Import"): a node template per
machine type and region, and a link per pair of regions (the slowest pair of machines between the
two regions, the largest latency) and inside each region (its slowest pair); Helix's names still map
back. With LLM_PLANNER_HELIX set to a Helix checkout, its 3cluster24 file too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_helix import PROFILES_INI, run_import, write_helix

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.helix.inputs import device_helix_names, load_helix_cluster

TYPES = ("T4", "T4", "A100", "T4", "T4")  # ComputeNode-0..4
# regions: {0, 1}, {2, 3}, {4}; (bandwidth in mbps, latency in ms) per pair
LINKS = {
    (0, 1): (1000, 1),
    (2, 3): (1250, 2),
    (0, 2): (12, 40),
    (0, 3): (15, 45),
    (1, 2): (11, 41),
    (1, 3): (14, 42),
    (0, 4): (13, 50),
    (1, 4): (10, 52),
    (2, 4): (12.5, 59),
    (3, 4): (14, 55),
}


def geo_ini() -> str:
    lines = ["[NodeNames]", f"total_compute_nodes={len(TYPES)}", ""]
    for i, t in enumerate(TYPES):
        lines += [f"[ComputeNode-{i}]", f"type={t}", ""]
    for (a, b), (bw, latency) in LINKS.items():
        lines += [f"[Link-{a}-{b}]", f"bandwidth={bw} * mbps", f"latency={latency} * MilliSec", ""]
    for i in range(len(TYPES)):
        lines += [f"[Link-source-{i}]", "bandwidth=1000 * mbps", "latency=1 * MilliSec", ""]
    return "\n".join(lines)


def _import(tmp_path) -> tuple[Path, Path]:
    cluster = write_helix(tmp_path, geo_ini(), PROFILES_INI.replace("400 * mbps", "10 * gbps"))
    code, out, _ = run_import(tmp_path, cluster)
    assert code == 0
    return cluster, out


def test_import_keeps_a_link_per_region_pair(tmp_path):
    _, out = _import(tmp_path)
    spec = load_cluster(out)
    assert [(n.name, n.count, n.region) for n in spec.nodes] == [
        ("a100-r1", 1, "r1"),
        ("t4-r0", 2, "r0"),
        ("t4-r1", 1, "r1"),
        ("t4-r2", 1, "r2"),
    ]
    assert spec.inter_node is None  # every pair of servers has its region pair's rule
    links = {r.between: (r.bw_bytes_per_s, r.latency_s) for r in spec.between_regions}
    expected = {
        ("r0", "r0"): (1e9, 1e-3),
        ("r0", "r1"): (11e6, 45e-3),  # the slowest of 0-2, 0-3, 1-2, 1-3; the largest latency
        ("r0", "r2"): (10e6, 52e-3),
        ("r1", "r1"): (1.25e9, 2e-3),
        ("r1", "r2"): (12.5e6, 59e-3),
    }
    assert links.keys() == expected.keys()  # r2 holds one machine: no link inside it
    for pair, (bw, latency) in expected.items():
        assert links[pair][0] == pytest.approx(bw) and links[pair][1] == pytest.approx(latency), pair
    text = out.read_text()
    assert "slowest of the 4 pairs between the two regions" in text and "#   r0: ComputeNode-0, 1" in text
    d = {dev.node: dev for dev in spec.devices()}
    assert spec.link(d["t4-r0-0"], d["a100-r1"]).bw_bytes_per_s == pytest.approx(11e6)
    assert spec.link(d["t4-r0-0"], d["t4-r0-1"]).bw_bytes_per_s == pytest.approx(1e9)


def test_geo_names_map_back_to_helix_machines(tmp_path):
    cluster, _ = _import(tmp_path)
    assert device_helix_names(load_helix_cluster(cluster)) == {
        "t4-r0-0/t4:0": "compute_node_2",
        "t4-r0-1/t4:0": "compute_node_3",
        "a100-r1/a100-40g:0": "compute_node_4",
        "t4-r1/t4:0": "compute_node_5",
        "t4-r2/t4:0": "compute_node_6",
    }


HELIX = os.environ.get("LLM_PLANNER_HELIX")


@pytest.mark.skipif(not HELIX, reason="LLM_PLANNER_HELIX is not set: 3cluster24 needs a Helix checkout (docs/helix.md)")
def test_3cluster24_keeps_its_three_region_pairs(tmp_path):
    """Helix's 3cluster24: 4 A100s; 2 L4 and 8 T4; 6 L4 and 4 T4. Fast links inside each region,
    10-15 MB/s between them."""
    config = Path(HELIX) / "artifact_evaluation" / "distributed_clusters" / "config"
    out = tmp_path / "3cluster24.yaml"
    assert main(["import", "helix", "--cluster", str(config / "3cluster24.ini"), "-o", str(out)]) == 0
    spec = load_cluster(out)
    cross = [r for r in spec.between_regions if r.between[0] != r.between[1]]
    inside = [r for r in spec.between_regions if r.between[0] == r.between[1]]
    assert sorted(r.between for r in cross) == [("r0", "r1"), ("r0", "r2"), ("r1", "r2")]
    assert all(1e7 <= r.bw_bytes_per_s <= 1.5e7 and 0.04 <= r.latency_s <= 0.06 for r in cross)
    assert len(inside) == 3 and all(r.bw_bytes_per_s > 1e9 for r in inside)
    assert {(n.name, n.count) for n in spec.nodes} == {
        ("a100-r0", 4),
        ("l4-r1", 2),
        ("t4-r1", 8),
        ("l4-r2", 6),
        ("t4-r2", 4),
    }
