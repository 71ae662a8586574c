"""Any Helix layout routed by a max flow (llm_planner.helix.flow): the split computed by hand on a
small Helix-format cluster, and --score on a layout whose ranges are not chains of stages."""

from __future__ import annotations

import pytest
from test_helix_plan import tables, write_tables

from llm_planner.cli.main import main
from llm_planner.helix.engine import BLOCK_TOKENS, FEED_HWM, Stage, stage_round_s
from llm_planner.helix.flow import flow_estimate, layout_flow, machine_rate
from llm_planner.helix.inputs import load_helix_cluster
from llm_planner.helix.regions import region_networks
from llm_planner.helix.rules import machine_types

T4_A, A100, T4_B = "compute_node_2", "compute_node_3", "compute_node_4"  # test_helix's cluster
# both T4s hold layers 0-3 and feed the A100, which holds 4-7
RANGES = {T4_A: (0, 4), T4_B: (0, 4), A100: (4, 8)}


def test_flow_split_by_hand(tmp_path):
    cluster = load_helix_cluster(write_tables(tmp_path))
    t = tables(tmp_path)
    regions = region_networks(cluster, 1536)
    # a T4 with 4 layers: 8 requests a batch (its limit) at 6 ms a layer -> 8 / (4 x 6 ms) = 333.3 tokens/s;
    # the A100 with 4 layers: 10 at 3 ms -> 833.3; the links carry far more, so the T4s bound the flow
    assert machine_rate(t["t4"], 4) == pytest.approx(8 / 0.024)
    assert machine_rate(t["a100"], 4) == pytest.approx(10 / 0.012)
    value, flows = layout_flow(RANGES, machine_types(cluster), t, 8, regions)
    assert value == pytest.approx(2 * 8 / 0.024)
    assert flows[f"{T4_A}/in"][f"{T4_A}/out"] == pytest.approx(8 / 0.024)
    assert flows[f"{A100}/in"][f"{A100}/out"] == pytest.approx(value)
    # each T4 gets half the queries, the A100 all: the T4s' KV room (160 blocks of 16 tokens, 80% of
    # it, a query expected to hold 100 + 240 tokens) over their share sets the queries in flight
    queries = FEED_HWM * BLOCK_TOKENS * 160 / (100 + 240) / 0.5
    est = flow_estimate(RANGES, cluster, t, 8, 100.0, regions)
    assert est.queries == pytest.approx(queries)
    # two routes of half the flow each, the same round: T4 (half the queries, hop to the A100), A100 (all)
    t4_hop = stage_round_s(Stage("t4", 1, 4), t["t4"], queries / 2, regions.inside[0])
    a100_out = stage_round_s(Stage("a100", 1, 4), t["a100"], queries, regions.coordinator)
    round_s = regions.coordinator.latency_s + t4_hop + a100_out
    assert est.tokens_per_s == pytest.approx(queries / round_s)


def test_score_routes_a_layout_that_is_not_chains(tmp_path, capsys):
    """Overlapping ranges that do not line up (as Helix's MILP writes them) are scored by the flow."""
    cluster = write_tables(tmp_path)
    layout = tmp_path / "overlap.ini"
    layout.write_text(f"[Solution]\n{T4_A}=[0, 1, 2, 3]\n{T4_B}=[2, 3, 4, 5]\n{A100}=[4, 5, 6, 7, 8, 9, 10, 11]\n")
    args = ["plan-helix", "--cluster", str(cluster), "--profiles", str(tmp_path / "llama2_70b"), "--model", "gpt2"]
    assert main([*args, "--score", str(layout)]) == 0
    out = capsys.readouterr().out
    assert "routed by a max flow" in out and "estimated " in out
    # T4_B (2-5) has no machine ending at layer 2 before it: the flow leaves it out, the chain T4_A -> A100 is scored
    est = flow_estimate(
        {T4_A: (0, 4), T4_B: (2, 6), A100: (4, 12)},
        load_helix_cluster(cluster),
        tables(tmp_path),
        12,
        763.0,
        region_networks(load_helix_cluster(cluster), 1536),
    )
    assert est.tokens_per_s > 0
