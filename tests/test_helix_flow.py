"""Any Helix layout routed by a max flow (llm_planner.helix.flow): the split computed by hand on a
small Helix-format cluster, and --score on a layout whose ranges are not chains of stages."""

from __future__ import annotations

import re

import pytest
from test_helix_plan import tables, write_tables

from llm_planner.cli.main import main
from llm_planner.cost.serving_profile import LayerTable
from llm_planner.helix.engine import BLOCK_TOKENS, FEED_HWM, Stage, stage_round_s
from llm_planner.helix.flow import flow_estimate, layout_flow, machine_rate
from llm_planner.helix.inputs import HelixError, load_helix_cluster
from llm_planner.helix.regions import region_networks
from llm_planner.helix.simulator_file import simulator_hops
from llm_planner.helix.typical import TypicalGuesses, load_typical_guesses, typical_rates

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
    value, flows = layout_flow(RANGES, cluster, t, 8, 1536)
    assert value == pytest.approx(2 * 8 / 0.024)
    assert flows[T4_A]["/through"] == flows[T4_B]["/through"] == pytest.approx(8 / 0.024)
    assert flows[A100]["/through"] == pytest.approx(value)
    assert flows["source"] == {T4_A: pytest.approx(value / 2), T4_B: pytest.approx(value / 2)}
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


def test_typical_rate_by_hand(tmp_path):
    """Helix's routing capacity of one machine (llm_planner.helix.typical), on a cluster of one type,
    where the round-trip share is layers / L whatever the rates guessed."""
    t = tables(tmp_path)
    prompt = LayerTable(sizes=(0, 1000), seconds=(0.0, 0.1))  # 0.1 ms a prompt token
    guesses = TypicalGuesses(layers={"A100": 4}, cap_layers={"A100": 8}, perf={"A100": 50.0})
    rates = typical_rates(guesses, {"A100": 1}, t, {"a100": prompt}, 8)
    # 4 of 8 layers: ratio 0.5; KV entries planned int(0.3 x 16 x 800) = 3840; prompts per batch
    # 3840 / 990 x 0.5 / 240 = 0.00808 (< 1: scaled by 123.75), P = round(6.06) = 6, D = round(1.94) = 2
    requests = 3840 / 990 * 0.5 / 240
    scale = 1 / requests
    layer_s = 742 * 1e-4 + 0.001 * scale  # prompt(int(6 x 123.75) = 742 tokens) + decode(2) x scale
    assert rates.rate("a100", 4) == pytest.approx(scale * 8 / (4 * layer_s))


def test_typical_guesses_read_from_the_statistics_class(tmp_path):
    card = tmp_path / "m.py"
    card.write_text(
        "class S:\n    def __init__(self, n):\n"
        '        typical_layers_dict = {"A100": 8, "T4": 3}\n'
        "        if n < 2:\n"
        '            typical_layers_dict = {"A100": 12, "T4": 4}\n'
        "        typical_layers_dict = {m: typical_layers_dict[m] for m in n}\n"
        '        normalized_perf_dict = {"A100": 80, "T4": 12.5}\n'
    )
    guesses = load_typical_guesses(card)
    assert (guesses.layers, guesses.cap_layers, guesses.perf) == (
        {"A100": 8, "T4": 3},
        {"A100": 12, "T4": 4},
        {"A100": 80.0, "T4": 12.5},
    )
    assert guesses.source == str(card)
    text = card.read_text()
    card.write_text("class S:\n    pass\n")
    assert load_typical_guesses(card) is None  # a hand-made folder: no routing statistics
    for bad, said in (
        (text.replace('"A100": 80', '"A100": 0'), "normalized_perf_dict (line 7)"),
        (text.replace('"T4": 12.5}', '"T4": x}'), "normalized_perf_dict (line 7)"),
        (text.replace("        if n < 2:\n", "        if n < 2\n"), "not valid Python"),
        (text.replace('        normalized_perf_dict = {"A100": 80, "T4": 12.5}\n', ""), "found 2 and 0"),
    ):
        card.write_text(bad)
        with pytest.raises(HelixError, match=re.escape(f"{card}: ") + ".*" + re.escape(said)):
            load_typical_guesses(card)


def test_routing_statistics_must_cover_every_machine_type(tmp_path):
    """A statistics class whose dicts lack a type of the cluster is an error naming the file, not a
    silent fall back to other capacities."""
    guesses = TypicalGuesses(layers={"A100": 4}, cap_layers={"A100": 8}, perf={"A100": 50.0}, source="m.py")
    prompt = LayerTable(sizes=(0, 1000), seconds=(0.0, 0.1))
    with pytest.raises(HelixError, match=r"m\.py: .*\['T4'\]"):
        typical_rates(guesses, {"A100": 1, "T4": 2}, tables(tmp_path), {"a100": prompt, "t4": prompt}, 8)


def test_routed_over_helix_own_simulator_file(tmp_path):
    """Helix's own simulator cluster file may leave out a hop the layout allows: routed over its
    links, the machine whose only way on is missing gets no flow."""
    cluster = load_helix_cluster(write_tables(tmp_path))
    links = {"source_a": ("source", T4_A), "source_b": ("source", T4_B), "a_gpu": (T4_A, A100), "out": (A100, "sink")}
    text = "[Links]\nnames=" + repr([f"link_{n}" for n in links]) + "\n"
    for name, (a, b) in links.items():  # T4_B -> A100 left out
        text += f"\n[link_{name}]\nin={a}\nout={b}\nlatency=1 * MilliSec\nbandwidth=1000 * mbps\n"
    sim = tmp_path / "simulator_cluster.ini"
    sim.write_text(text)
    hops = simulator_hops(sim)
    assert list(hops) == list(links.values()) and set(hops.values()) == {1e9}
    value, flows = layout_flow(RANGES, cluster, tables(tmp_path), 8, 1536, hops=hops)
    assert value == pytest.approx(8 / 0.024)  # one T4's rate: the other has no way on
    assert flows[T4_B]["/through"] == 0 and flows[T4_A]["/through"] == pytest.approx(value)
    sim.write_text(text.replace("bandwidth=1000 * mbps", "bandwidth=fast", 1))
    with pytest.raises(HelixError, match=r"simulator_cluster\.ini: \[link_source_a\] bandwidth"):
        simulator_hops(sim)
