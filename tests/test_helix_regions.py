"""Regions of a geo Helix cluster (llm_planner.helix.regions): found from the per-pair links, each
with its own network, and a plan that crosses slow links only when that pays: the same machines
with fast links everywhere get a different layout."""

from __future__ import annotations

import dataclasses

import pytest
from test_helix import PROFILES_INI
from test_helix_plan import NET, tables, write_tables

from llm_planner.cost.serving_profile import LayerTable
from llm_planner.helix.engine import Stage, queries_in_flight, stage_round_s
from llm_planner.helix.inputs import helix_node_name, load_helix_cluster
from llm_planner.helix.plan import HelixInputs, HelixPlan, _distinct_orders, _geo_order, plan_helix, routed_estimate
from llm_planner.helix.regions import assign_near, find_regions, region_networks, route_estimate
from llm_planner.helix.typical import TypicalGuesses

TYPES = ("T4", "A100", "T4")  # ComputeNode-0, -1, -2
FAST = "2000 * mbps, 1 * MilliSec"


def cluster_ini(cross: str) -> str:
    """Two T4s joined by a fast link (one region), the A100 reached over `cross` ('bw, latency')."""
    bw, latency = cross.split(", ")
    lines = ["[NodeNames]", "total_compute_nodes=3", ""]
    for i, t in enumerate(TYPES):
        lines += [f"[ComputeNode-{i}]", f"type={t}", ""]
    links = {("0", "2"): ("1000 * mbps", "1 * MilliSec"), ("0", "1"): (bw, latency), ("1", "2"): (bw, latency)}
    links |= {("source", str(i)): ("1000 * mbps", "1 * MilliSec") for i in range(3)}
    links |= {(str(i), "sink"): ("1000 * mbps", "1 * MilliSec") for i in range(3)}
    for (a, b), (w, lat) in links.items():
        lines += [f"[Link-{a}-{b}]", f"bandwidth={w}", f"latency={lat}", ""]
    return "\n".join(lines)


def _inputs(tmp_path, cross: str) -> HelixInputs:
    write_tables(tmp_path)
    path = tmp_path / "config" / "geo.ini"
    path.write_text(cluster_ini(cross))
    (tmp_path / "config" / "machine_profiles.ini").write_text(PROFILES_INI.replace("400 * mbps", "10 * gbps"))
    cluster = load_helix_cluster(path)
    return HelixInputs(cluster=cluster, tables=tables(tmp_path), num_layers=8, network=NET)


def test_regions_from_the_links(tmp_path):
    geo = _inputs(tmp_path, "10 * mbps, 50 * MilliSec").cluster
    assert find_regions(geo) == ((0, 2), (1,))
    nets = region_networks(geo, 1536)
    assert nets.inside[0].bw_bytes_per_s == 1e9 and nets.inside[0].latency_s == 1e-3
    assert nets.between.bw_bytes_per_s == 1e7 and nets.between.latency_s == 0.05
    assert nets.coordinator.activation_bytes == 0
    flat = _inputs(tmp_path, "2000 * mbps, 1 * MilliSec").cluster  # no gap of 10x: one region
    assert find_regions(flat) == ((0, 1, 2),)


def test_route_estimate_by_hand(tmp_path):
    """One T4 stage in region 0 then the A100 in region 1: the T4's hop out crosses regions, the
    A100's goes to the coordinator; the first hop is the coordinator's latency."""
    inputs = _inputs(tmp_path, "10 * mbps, 50 * MilliSec")
    nets = region_networks(inputs.cluster, 1536)
    t = inputs.tables
    t4, a100 = Stage("t4", 1, 4), Stage("a100", 1, 4)
    got = route_estimate([(0, (t4,)), (1, (a100,))], t, 100.0, nets)
    c = queries_in_flight([t4, a100], t, 100.0)
    round_s = 1e-3 + stage_round_s(t4, t["t4"], c, nets.between) + stage_round_s(a100, t["a100"], c, nets.coordinator)
    assert got.round_s == pytest.approx(round_s) and got.tokens_per_s == pytest.approx(c / round_s)
    # the crossing: 50 ms and c requests of 1,538 bytes at 1e7 bytes/s on the T4's hop
    assert stage_round_s(t4, t["t4"], c, nets.between) - stage_round_s(t4, t["t4"], c, nets.inside[0]) == (
        pytest.approx(0.049 + c * 1538 * (1 / 1e7 - 1 / 1e9))
    )


def test_regions_change_the_chosen_layout(tmp_path):
    """Slow links to the A100: the plan (regions="route") stays inside one region; fast links everywhere:
    it does not. By default (regions="ignore") the two clusters plan alike (every hop the slowest link
    but the same stages here)."""
    geo = _inputs(tmp_path, "10 * mbps, 50 * MilliSec")
    assert plan_helix(geo, prompt_len=100.0).stages == plan_helix(_inputs(tmp_path, FAST), prompt_len=100.0).stages
    plan = plan_helix(geo, prompt_len=100.0, regions="route")
    used = {m for nodes in plan.machines for m in nodes}
    regions = [{helix_node_name(i) for i in members} for members in find_regions(geo.cluster)]
    assert any(used <= region for region in regions), used
    flat = _inputs(tmp_path, FAST)
    flat_plan = plan_helix(flat, prompt_len=100.0, regions="route")
    flat_used = {m for nodes in flat_plan.machines for m in nodes}
    assert not any(flat_used <= region for region in regions), flat_used


def test_geo_plan_takes_the_best_routed_order(tmp_path):
    """On a geo cluster a chain's stages are tried in every distinct order (machines near the previous
    stage's region), each routed as Helix routes it, and the best is kept."""
    prompts = {k: LayerTable(sizes=(0, 1000), seconds=(0.0, 0.1)) for k in ("t4", "a100")}
    guesses = TypicalGuesses(
        layers={"A100": 4, "T4": 2}, cap_layers={"A100": 8, "T4": 4}, perf={"A100": 50.0, "T4": 10.0}
    )
    geo = dataclasses.replace(_inputs(tmp_path, "10 * mbps, 50 * MilliSec"), guesses=guesses, prompts=prompts)
    regions = region_networks(geo.cluster, NET.activation_bytes)
    stages = (Stage("t4", 1, 3), Stage("a100", 1, 3), Stage("t4", 1, 2))  # the A100 between the T4s: two crossings
    plan = HelixPlan(
        stages=stages, machines=assign_near(stages, geo.cluster, regions), estimate=None, layouts=1, solve_s=0.0
    )
    best = _geo_order(plan, geo, regions, 100.0)
    rates = []
    for order in _distinct_orders(stages, 1000):
        other = dataclasses.replace(plan, stages=order, machines=assign_near(order, geo.cluster, regions))
        rates.append(routed_estimate(other, geo, 100.0).tokens_per_s)
    assert len(rates) == 6
    assert routed_estimate(best, geo, 100.0).tokens_per_s == pytest.approx(max(rates))
    assert max(rates) > routed_estimate(plan, geo, 100.0).tokens_per_s  # the order matters here
    assert best.stages[1].kind != "a100"  # the T4s one after the other: the chain crosses once
