"""Clusters whose servers sit in regions (docs/cluster-spec.md, "links"): the link between two
servers by their regions, every bad input refused naming the file and field, and serving plans
that see the links (a slow link between regions keeps replicas inside a region)."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving_fixtures import SMALL_FLEET, workload, write_fleet
from test_serving import draw_fleet_tokens

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.serving.bound import concurrency_level_bound
from llm_planner.serving.bound_batches import batch_level_bound
from llm_planner.serving.bound_cells import cell_bound
from llm_planner.serving.bound_prices import price_bound
from llm_planner.serving.bound_space import stage_kinds
from llm_planner.serving.context import ServingContext, ServingOptions
from llm_planner.serving.layout import Segment
from llm_planner.serving.search import solve_serving

# Three servers of one GPU in `east`, one in `west` (numbers made up, of the order of an L4 with
# 12 GB: LLaMA-2 7B needs two of them). Inside a region the servers share a 25 GB/s network.
TWO_REGIONS = """
name: two-regions
device_kinds:
  - {name: g, type: gpu, peak_flops: {fp16: 120 TFLOP/s}, mem_bytes: 12 GB, mem_bw_bytes_per_s: 1000 GB/s,
     compute_efficiency: 0.6, mem_efficiency: 0.8, overhead_s: 10 us, step_overhead_s: 0.5 ms}
nodes:
  - {name: east, count: 3, devices: {g: 1}, region: east}
  - {name: west, devices: {g: 1}, region: west}
links:
  inter_node: {bw_bytes_per_s: 25 GB/s, latency_s: 5 us}
  between_regions:
    - {between: [east, west], bw_bytes_per_s: CROSS_BW, latency_s: CROSS_LATENCY}
"""
SLOW = {"CROSS_BW": "10 MB/s", "CROSS_LATENCY": "50 ms"}
FAST = {"CROSS_BW": "25 GB/s", "CROSS_LATENCY": "5 us"}


def _write(tmp_path, cross: dict, name: str = "regions.yaml") -> str:
    text = TWO_REGIONS
    for key, value in cross.items():
        text = text.replace(key, value)
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_links_between_servers_by_region(tmp_path, capsys):
    cluster = load_cluster(_write(tmp_path, SLOW))
    assert cluster.regions() == ("east", "west")
    d = {dev.node: dev for dev in cluster.devices()}
    assert cluster.link_path(d["east-0"], d["east-2"]) == ("links", "inter_node")
    assert cluster.link_path(d["east-1"], d["west"]) == ("links", "between_regions", 0)
    cross = cluster.link(d["west"], d["east-0"])
    assert cross.bw_bytes_per_s == 1e7 and cross.latency_s == pytest.approx(0.05)
    assert cluster.link(d["east-0"], d["east-1"]).bw_bytes_per_s == 25e9
    assert main(["show-cluster", str(tmp_path / "regions.yaml")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "a server in east and one in west" in out and "0.01 GB/s" in out and "50 ms" in out


def test_a_rule_per_region_replaces_inter_node(tmp_path):
    """Without inter_node every pair of servers needs a rule: two servers of east, and east-west."""
    data = yaml.safe_load(_write_text(SLOW))
    del data["links"]["inter_node"]
    data["links"]["between_regions"].append({"between": ["east", "east"], "bw_bytes_per_s": "1 GB/s"})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(data))
    cluster = load_cluster(path)
    d = {dev.node: dev for dev in cluster.devices()}
    assert cluster.link(d["east-0"], d["east-1"]).bw_bytes_per_s == 1e9
    assert cluster.link_path(d["east-0"], d["east-1"]) == ("links", "between_regions", 1)


def _write_text(cross: dict) -> str:
    text = TWO_REGIONS
    for key, value in cross.items():
        text = text.replace(key, value)
    return text


def _no_inter(d):
    del d["links"]["inter_node"]


@pytest.mark.parametrize(
    "mutate, where",
    [
        (
            lambda d: d["links"]["between_regions"][0].update(between=["east", "north"]),
            "links.between_regions[0].between: unknown region 'north' (known: east, west)",
        ),
        (
            lambda d: d["links"]["between_regions"].append(
                dict(d["links"]["between_regions"][0], between=["west", "east"])
            ),
            "links.between_regions[1]: a second rule for regions 'west' and 'east'",
        ),
        (_no_inter, "links.between_regions: no link between two servers of region 'east'"),
        (
            lambda d: (_no_inter(d), d["links"]["between_regions"][0].update(between=["east", "east"])),
            "links.between_regions: no link between regions 'east' and 'west'",
        ),
        (lambda d: d["nodes"][1].pop("region"), "nodes[1].region: node 'west' names no region but node 'east' does"),
        (lambda d: d["nodes"][1].update(region="west coast"), "nodes[1].region:"),
        (
            lambda d: d["links"]["between_regions"][0].update(between="east"),
            "links.between_regions[0].between: expected a list of two region names",
        ),
        (
            lambda d: d["links"]["between_regions"][0].update(bw_bytes_per_s=0),
            "links.between_regions[0].bw_bytes_per_s: must be positive",
        ),
        (lambda d: d["links"].update(between_regions={"east": 1}), "links.between_regions: expected a list"),
    ],
)
def test_bad_regions_exit_2_naming_file_and_field(tmp_path, capsys, mutate, where):
    data = yaml.safe_load(_write_text(SLOW))
    mutate(data)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["show-cluster", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "broken.yaml" in err and where in err and "Traceback" not in err


def _context(path: str, tpot_s: float = 0.05) -> ServingContext:
    return ServingContext(
        load_cluster(path), preset_config("llama2-7b"), workload(256, 128, tpot_s), "fp16", ServingOptions()
    )


def test_serving_hand_offs_take_the_link_between_regions(tmp_path):
    """A replica of one east and the west GPU hands on over the slow link both ways (its micro-batch
    and the token's return); one of two east GPUs over the network inside east."""
    ctx = _context(_write(tmp_path, SLOW))
    assert sorted(ctx.by_name) == ["east/g", "west/g"]  # the classes split by region
    mixed = ctx.replica((Segment("east/g", 1, 1), Segment("west/g", 1, 1)))
    east = ctx.replica((Segment("east/g", 1, 2),))
    assert [s.link_next.latency_s for s in mixed.slots] == [pytest.approx(0.05)] * 2
    assert [s.link_next.latency_s for s in east.slots] == [pytest.approx(5e-6)] * 2
    b = 4
    per_seq = ctx.tasks.handoff_bytes_per_seq + ctx.tasks.return_bytes_per_seq
    assert mixed.handoffs_s(b) == pytest.approx(0.1 + b * per_seq / 1e7)


def _plan(tmp_path, spec: str, out: str) -> dict:
    argv = ["plan", "--cluster", spec, "--model", "llama2-7b", "--objective", "serving", "--tpot-slo", "60 ms"]
    plan = tmp_path / out
    assert main([*argv, "--prompt-len", "256", "--output-len", "128", "-o", str(plan)]) == 0
    assert main(["verify", str(plan)]) == 0
    return yaml.safe_load(plan.read_text())


def _regions_used(replica: dict) -> set[str]:
    return {seg["class"].split("/")[0] for seg in replica["segments"]}


def test_the_search_keeps_replicas_inside_a_region_behind_a_slow_link(tmp_path):
    """With 10 MB/s and 50 ms between the regions no replica of the search's fleet crosses (a round
    trip over it alone passes the 60 ms target) and the west GPU, too small alone, serves nothing;
    with the network of one region between them, the fleet pairs the west GPU with an east one and
    serves more. The plan files' twin, with their bounds and verify, is `slow` (below)."""
    slow, _ = solve_serving(_context(_write(tmp_path, SLOW, "slow.yaml"), 0.06))
    fast, _ = solve_serving(_context(_write(tmp_path, FAST, "fast.yaml"), 0.06))
    assert slow.chosen and fast.chosen
    assert all({s.class_name.split("/")[0] for s in p.layout} == {"east"} for p, _ in slow.chosen)
    assert any({s.class_name.split("/")[0] for s in p.layout} == {"east", "west"} for p, _ in fast.chosen)
    assert fast.tokens_per_s > slow.tokens_per_s


# the plans' bounds over the slow link take most of a minute with verify: the search's choice is
# checked in the default suite by test_the_search_keeps_replicas_inside_a_region_behind_a_slow_link
@pytest.mark.slow
def test_a_slow_link_between_regions_keeps_replicas_inside_one(tmp_path):
    """With 10 MB/s and 50 ms between the regions no replica crosses (a round trip over it alone
    passes the 60 ms target) and the west GPU, too small alone, serves nothing; with the network
    of one region between them, the plan pairs the west GPU with an east one and serves more.
    Both plans verify."""
    slow = _plan(tmp_path, _write(tmp_path, SLOW, "slow.yaml"), "slow-plan.yaml")
    fast = _plan(tmp_path, _write(tmp_path, FAST, "fast.yaml"), "fast-plan.yaml")
    assert all(_regions_used(r) == {"east"} for r in slow["serving"]["replicas"])
    assert any(_regions_used(r) == {"east", "west"} for r in fast["serving"]["replicas"])
    assert fast["serving"]["tokens_per_s"] > slow["serving"]["tokens_per_s"]


# The serving tests' small fleet with its two "big" servers in one region and the "small" server in
# another, 1 GB/s and 3 ms between the regions: hand-offs between the classes cost, but pay at times.
GEO_FLEET = (
    SMALL_FLEET.replace("{name: bigbox, count: 2,", "{name: bigbox, count: 2, region: east,").replace(
        "{name: smallbox,", "{name: smallbox, region: west,"
    )
    + "  between_regions: [{between: [east, west], bw_bytes_per_s: 1 GB/s, latency_s: 3 ms}]\n"
)


def _geo_context(tmp_path) -> ServingContext:
    cluster = load_cluster(write_fleet(tmp_path, GEO_FLEET))
    return ServingContext(cluster, preset_config("llama2-13b"), workload(256, 128, 0.03), "fp16", ServingOptions())


@pytest.fixture(scope="module")
def geo_bounds(tmp_path_factory):
    """The two-region fleet and each bound on it, the cell and price bounds over its links (the cell
    bound's MILPs took about a minute on 2 cores under load: the tests using it are `slow`)."""
    ctx = _geo_context(tmp_path_factory.mktemp("geo"))
    bounds = (
        concurrency_level_bound(ctx.cache, ctx.classes, 0.03),
        batch_level_bound(ctx.cache, ctx.classes, 0.03),
        cell_bound(ctx.cache, ctx.classes, 0.03, ctx.links),
        price_bound(ctx.cache, ctx.classes, 0.03, ctx.links, dict.fromkeys(ctx.capacity, 1.0)),
    )
    return ctx, bounds


def test_bounds_charge_each_class_its_fastest_link(tmp_path):
    """A stage may hand on inside its server, to another server of its class (the network: 25 GB/s,
    also charged where the class has one server) or over the link between the regions, and the
    bounds charge the fastest of those; a replica that crosses regions pays the slow one."""
    ctx = _geo_context(tmp_path)
    kinds = {(kd.class_name, kd.k): kd for kd in stage_kinds(ctx.cache, ctx.classes, ctx.links)}

    def links(name):
        return sorted((lk.bw_bytes_per_s, round(lk.latency_s * 1e6, 6)) for lk in kinds[(name, 1)].links)

    assert links("smallbox/small") == [(1e9, 3000.0), (25e9, 5.0), (32e9, 5.0)]
    assert links("bigbox/big") == [(1e9, 3000.0), (25e9, 5.0), (300e9, 2.0)]
    crossing = ctx.replica((Segment("bigbox/big", 1, 2), Segment("smallbox/small", 1, 1)))
    assert [s.link_next.latency_s for s in crossing.slots] == pytest.approx([2e-6, 3e-3, 3e-3])


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bound_holds_for_any_fleet_over_two_regions(geo_bounds, data):
    """Any set of replicas on disjoint devices, crossing regions or not, serves no more than each bound."""
    ctx, bounds = geo_bounds
    total = draw_fleet_tokens(data, ctx)
    assert all(total <= bound * (1 + 1e-9) for bound in bounds)
