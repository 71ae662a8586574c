"""Several chains for Helix's engine (llm_planner.helix.chains): one chain over every type or one
chain per type, whichever the model rates higher, checked against brute force over each family;
the layout written (chains with overlapping ranges) reads back as the same chains under --score."""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest
from test_helix_plan import NET, family, tables, write_tables

from llm_planner.cli.main import main
from llm_planner.helix.chains import best_chains, combined
from llm_planner.helix.engine import estimate
from llm_planner.helix.inputs import load_helix_cluster
from llm_planner.helix.layout_file import read_helix_layout
from llm_planner.helix.plan import load_inputs, plan_helix, score_layout
from llm_planner.helix.search import Kind


def _best(kinds, t, layers, prompt_len):
    values = [estimate(list(s), t, prompt_len, NET) for s in family(kinds, layers)]
    return max(values, key=lambda e: e.tokens_per_s, default=None)


@pytest.mark.parametrize("prompt_len", [50.0, 400.0, 2000.0])
def test_best_chains_is_the_better_of_one_chain_and_one_per_type(tmp_path, prompt_len):
    t = tables(tmp_path)  # a100: up to 8 layers a machine; t4: up to 4
    kinds = [Kind("a100", 1, t["a100"]), Kind("t4", 2, t["t4"])]
    one = _best(kinds, t, 8, prompt_len)
    apart = [e for e in (_best([k], t, 8, prompt_len) for k in kinds) if e is not None]
    expected = max(one.tokens_per_s, combined(apart).tokens_per_s)
    found = best_chains(kinds, 8, prompt_len, NET)
    assert found.estimate.tokens_per_s == pytest.approx(expected)
    per_chain = [estimate(list(c), t, prompt_len, NET).tokens_per_s for c in found.chains]
    assert sum(per_chain) == pytest.approx(expected)


def _two_chain_inputs(tmp_path):
    """A cluster (one A100, two T4s) and an 8-layer model on which one chain per type wins."""
    cluster_path = write_tables(tmp_path)
    folder = tmp_path / "m8"  # a Helix folder whose statistics say 8 layers of a 768-wide model
    shutil.copytree(tmp_path / "llama2_70b", folder)
    card = "self.token_size = 2 * Byte\n        self.activation_size = 768 * 2 * Byte\n"
    card += "        self.model_param_sizes = [1 * GB] * 8\n"
    (folder / "m8.py").write_text(f"class S:\n    def __init__(self):\n        {card}")
    inputs = load_inputs(cluster_path, None, folder, None)
    assert inputs.num_layers == 8
    plan = plan_helix(inputs, prompt_len=2000.0)
    if len(plan.chain_sizes) < 2:
        pytest.fail(f"expected separate chains to win on this cluster, got {plan.stages}")
    return cluster_path, folder, inputs, plan


def test_separate_chains_written_and_scored(tmp_path, capsys):
    """Two chains (the A100 alone, the two T4s) side by side: the layout's ranges overlap, Helix's
    rules accept it, and --score reads it back as the same two chains with the same estimate."""
    cluster_path, folder, inputs, plan = _two_chain_inputs(tmp_path)
    ranges = read_helix_layout(plan.layout_text(inputs))
    assert sorted(ranges.values()) == [(0, 4), (0, 8), (4, 8)]  # the A100 holds all 8; the T4s 4 each
    layout = tmp_path / "layout.ini"
    layout.write_text(plan.layout_text(inputs))
    args = ["plan-helix", "--cluster", str(cluster_path), "--profiles", str(folder), "--prompt-len", "2000"]
    assert main([*args, "--score", str(layout)]) == 0
    out = capsys.readouterr().out
    assert f"estimated {plan.estimate.tokens_per_s:.1f} decode tokens/s" in out


def test_each_chain_written_as_its_own_deployment(tmp_path, capsys):
    """plan-helix -o writes one cluster file and one layout file per chain: each cluster file holds
    the chain's machines alone (renumbered from 0, their links kept), and its layout, scored on it,
    is that chain's estimate; the estimates add up to the plan's."""
    cluster_path, folder, inputs, plan = _two_chain_inputs(tmp_path)
    args = ["plan-helix", "--cluster", str(cluster_path), "--profiles", str(folder), "--prompt-len", "2000"]
    assert main([*args, "-o", str(tmp_path / "plan.ini")]) == 0
    assert not (tmp_path / "plan.ini").exists()
    capsys.readouterr()
    total, machines = 0.0, []
    for k in range(len(plan.chain_sizes)):
        own = tmp_path / f"plan-{k}.cluster.ini"
        cluster = load_helix_cluster(own, cluster_path.with_name("machine_profiles.ini"))
        machines.append(sorted(cluster.node_types))
        ranges = read_helix_layout((tmp_path / f"plan-{k}.ini").read_text())
        assert sorted(ranges) == [f"compute_node_{i + 2}" for i in range(len(cluster.node_types))]
        sub = load_inputs(own, cluster_path.with_name("machine_profiles.ini"), folder, None)
        alone = score_layout(sub, tmp_path / f"plan-{k}.ini", 2000.0)[-1].tokens_per_s
        # the plan charged every hop the full cluster's slowest link; a chain's own can only be faster
        sub = dataclasses.replace(sub, network=inputs.network)
        total += score_layout(sub, tmp_path / f"plan-{k}.ini", 2000.0)[-1].tokens_per_s
        assert alone >= score_layout(sub, tmp_path / f"plan-{k}.ini", 2000.0)[-1].tokens_per_s
        named = re.search(r"its ComputeNode ([\d, ]+)\)", own.read_text())  # the full file's machines
        kept = [int(i) for i in named.group(1).split(", ")]
        new = {str(i): str(n) for n, i in enumerate(kept)} | {"source": "source", "sink": "sink"}
        expected = {(new[x.a], new[x.b], x.bw_bytes_per_s) for x in inputs.cluster.links if {x.a, x.b} <= set(new)}
        assert {(x.a, x.b, x.bw_bytes_per_s) for x in cluster.links} == expected
    assert sorted(machines) == [["A100"], ["T4", "T4"]]
    assert total == pytest.approx(plan.estimate.tokens_per_s)
