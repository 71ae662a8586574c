"""Expert-parallel load balancing (`--eplb R`; llm_planner.cost.eplb): the placement by hand, the
factors a histogram gives under it, what a member holds and reads, a plan made, verified, shown
and exported with it, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from serving_fixtures import context
from test_engine_flags import check_against_engine

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.cost.dp_attention import dp_offered
from llm_planner.cost.eplb import member_loads, replica_picks, replicas
from llm_planner.export.serving import build_engines
from llm_planner.export.serving_scripts import sglang_script, vllm_script
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.moe import moe_parameters
from llm_planner.serving.expert_load import ExpertLoad
from llm_planner.serving.plan_file import load_serving_plan
from llm_planner.serving.workload import WorkloadError

SKEWED = [40, 10, 10, 20, 5, 5, 5, 5]  # 8 experts, 100 tokens' rows
QWEN = "qwen1.5-moe-a2.7b"  # 60 experts of 1408, top-4
REPO = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--objective", "serving", "--prompt-len", "512", "--output-len", "128", "--tpot-slo", "50 ms"]


def _words(script: str) -> str:
    """A script's text with its line continuations joined and its whitespace single."""
    return " ".join(script.replace("\\\n", " ").split())


def test_the_placement_by_hand():
    """8 redundant replicas go to the busiest per replica in turn (ties to the lower expert):
    expert 0 (40) to 5 replicas of 8, expert 3 (20) to 3 of 6.67, experts 1 and 2 (10) to 2 of 5.
    Packed heaviest first on 8 members of 2 slots: five members 8 + 5, three 6.67 + 5."""
    assert replicas(SKEWED, 8) == [5, 2, 2, 3, 1, 1, 1, 1]
    loads = member_loads(SKEWED, 8, 8)
    assert sorted(loads) == pytest.approx([35 / 3] * 3 + [13.0] * 5) and sum(loads) == pytest.approx(100)
    # no redundant experts: a permutation; 2 members of 4: 40 + 5 + 5 + 5 and 20 + 10 + 10 + 5
    assert sorted(member_loads(SKEWED, 2, 0)) == pytest.approx([45.0, 55.0])
    with pytest.raises(ValueError, match="8 experts and 2 redundant do not split evenly over 4 members"):
        member_loads(SKEWED, 4, 2)
    picks = (0.8, 0.4, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1)  # top-2 x each share
    # expert 0 takes both replicas (0.8 -> 0.4, then its 0.4 ties expert 1's and the lower expert wins)
    assert replica_picks(picks, 2) == pytest.approx((0.4, *(0.8 / 3,) * 3, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1))


def test_a_histogram_gives_the_placement_s_factor_for_every_group_that_splits_the_replicas():
    load = ExpertLoad(source="t", layers=(tuple(SKEWED),))
    assert load.dp_imbalance() == {2: 1.6, 4: 2.0, 8: 3.2}  # E/k consecutive experts a member
    assert load.dp_imbalance(0) == {2: 1.1, 4: 1.8, 8: 3.2}  # rebalanced, one replica each
    # 16 replicas: 8 x 13 / 100 on dpa8; dpa16 one replica each, the busiest 8 of 100
    assert load.dp_imbalance(8) == {2: pytest.approx(1.013333), 4: 1.04, 8: 1.04, 16: 1.28}
    mixtral = preset_config("mixtral-8x7b").moe_layer()  # 8 experts of 14336: k must divide E + R and the width
    assert [k for k in range(2, 17) if dp_offered(mixtral, k)] == [2, 4, 8]
    assert [k for k in range(2, 17) if dp_offered(mixtral, k, 2)] == [2]  # 10 replicas: not over 4 or 8
    assert [k for k in range(2, 17) if dp_offered(mixtral, k, 8)] == [2, 4, 8, 16]


def test_a_member_holds_its_replicas_and_reads_the_replicas_its_tokens_reach(tmp_path):
    """dpa4 of Qwen's 60 experts with 4 redundant: 16 replicas a member where 15 were, one more
    expert's weights per layer; uniform routing reads at least as many replicas as experts."""
    plain, eplb = (context(tmp_path, QWEN, eplb=r) for r in (None, 4))
    cfg = preset_config(QWEN)
    one_expert = moe_parameters(cfg)["experts"] / cfg.num_experts * 2  # fp16
    held = {name: c.cache.get("bigbox/big", 4, "dp").weight_bytes["block"] for name, c in (("p", plain), ("e", eplb))}
    assert held["e"] - held["p"] == pytest.approx(one_expert * 4 / 4)
    assert eplb.tasks.dp_picks == pytest.approx((4 / 60,) * 56 + (4 / 60 / 2,) * 8)  # most reached first
    assert plain.tasks.dp_picks is None  # uniform routing, the experts' own count
    tp = {name: c.cache.get("bigbox/big", 4, "tp").weight_bytes["block"] for name, c in (("p", plain), ("e", eplb))}
    assert tp["e"] == tp["p"]  # tensor-parallel experts: EPLB places nothing


def test_a_plan_with_eplb_keeps_it_verifies_shows_and_exports_it(tmp_path, capsys):
    """Mixtral on dgx-a100-l4 with the skewed histogram and 8 redundant experts: the plan keeps
    `eplb` and the factors under EPLB's placement, verify re-derives it, show states it, and the
    vLLM export passes EPLB's flags (checked against the pinned engine's definitions)."""
    load = tmp_path / "load.yaml"
    load.write_text(yaml.safe_dump({"tokens_per_expert": SKEWED}))
    plan = tmp_path / "plan.yaml"
    argv = [*PLAN, "--cluster", str(REPO / "cluster_specs" / "dgx-a100-l4.yaml"), "--model", "mixtral-8x7b"]
    assert main([*argv, "--expert-load", str(load), "--eplb", "8", "-o", str(plan)]) == 0
    data = yaml.safe_load(plan.read_text())
    assert data["options"]["eplb"] == 8 and data["options"]["dp_imbalance"][8] == 1.04
    capsys.readouterr()
    assert main(["verify", str(plan)]) == 0
    assert main(["show", str(plan)]) == 0
    assert "EPLB rebalances the dpaK groups' experts with 8 redundant" in " ".join(capsys.readouterr().out.split())
    script = vllm_script(build_engines(load_serving_plan(plan), load_cluster(data["inputs"]["cluster"]), "vllm"))
    assert "--enable-eplb --eplb-config '{\"num_redundant_experts\": 8}'" in _words(script)
    assert check_against_engine(script, "vllm") >= 1


@pytest.mark.heavy
def test_an_sglang_export_passes_its_redundant_experts(tmp_path):
    plan = tmp_path / "plan.yaml"
    argv = [*PLAN, "--cluster", str(REPO / "cluster_specs" / "dgx-a100-l4.yaml"), "--model", QWEN]
    assert main([*argv, "--exportable", "sglang", "--eplb", "4", "-o", str(plan)]) == 0
    data = yaml.safe_load(plan.read_text())
    segments = [s for r in data["serving"]["replicas"] for s in r["segments"]]
    assert any(s.get("attention", "tp") != "tp" for s in segments), "the plan uses no dpaK group"
    script = sglang_script(build_engines(load_serving_plan(plan), load_cluster(data["inputs"]["cluster"]), "sglang"))
    assert "--enable-eplb --ep-num-redundant-experts 4" in _words(script)
    assert check_against_engine(script, "sglang") >= 1


def test_eplb_is_refused_where_it_places_nothing(tmp_path, capsys):
    argv = [*PLAN, "--cluster", str(REPO / "cluster_specs" / "dgx-a100-l4.yaml"), "-o", str(tmp_path / "p.yaml")]
    assert main([*argv, "--model", "llama3-8b", "--eplb", "2"]) == 2
    assert "--eplb: llama3-8b has no experts" in capsys.readouterr().err
    assert main([*argv, "--model", "mixtral-8x7b", "--eplb", "2", "--no-dp-attention"]) == 2
    assert "--no-dp-attention leaves out" in capsys.readouterr().err
    for bad in (-1, 61, True):  # Qwen's 60 experts: at most 60 redundant
        with pytest.raises(WorkloadError, match="--eplb: a whole number of redundant experts from 0 to the model's 60"):
            context(tmp_path, QWEN, eplb=bad)
    assert main([*argv, "--model", "mixtral-8x7b", "--eplb", "9"]) == 2  # before any placement is computed
    assert "from 0 to the model's 8, got 9" in capsys.readouterr().err


def test_eplb_that_leaves_no_group_is_refused_and_one_that_drops_sizes_says_so(tmp_path, capsys, caplog):
    """Mixtral's 8 experts split over dpa2, dpa4 and dpa8 of a DGX; 8 + 3 replicas over none (refused,
    naming --eplb and E + R), 8 + 2 over dpa2 alone (planned, with a warning naming dpa4 and dpa8)."""
    argv = [*PLAN, "--cluster", str(REPO / "cluster_specs" / "dgx-a100-l4.yaml"), "--model", "mixtral-8x7b"]
    assert main([*argv, "--eplb", "3", "-o", str(tmp_path / "p.yaml")]) == 2
    assert "--eplb 3: no group of this plan runs data-parallel attention" in capsys.readouterr().err
    assert main([*argv, "--eplb", "2", "-o", str(tmp_path / "p.yaml")]) == 0
    assert "8 + 2 replicas do not split over dpa4, dpa8, which 8 experts alone would" in caplog.text
    data = yaml.safe_load((tmp_path / "p.yaml").read_text())
    if not any(s.get("attention", "tp") != "tp" for r in data["serving"]["replicas"] for s in r["segments"]):
        capsys.readouterr()
        assert main(["show", str(tmp_path / "p.yaml")]) == 0
        assert "EPLB" not in capsys.readouterr().out  # no dpaK group: nothing for EPLB to place


@pytest.mark.heavy
def test_uniform_routing_under_eplb_is_charged_its_placement(tmp_path):
    """Qwen's 60 equal experts with 4 redundant: four experts split in two, 64 replicas. Over 16
    members of 4 slots the 56 whole ones go first, 4 to eight members and 3 to the others, then
    the 8 halves to the members with 3: the busiest hold 4 of the 60 / 16 mean, 1.0667."""
    plan = tmp_path / "plan.yaml"
    argv = [*PLAN, "--cluster", str(REPO / "cluster_specs" / "dgx-a100-l4.yaml"), "--model", QWEN]
    assert main([*argv, "--eplb", "4", "-o", str(plan)]) == 0
    table = yaml.safe_load(plan.read_text())["options"]["dp_imbalance"]
    assert table[2] == table[4] == 1.0 and table[16] == pytest.approx(64 / 60)
    assert main(["verify", str(plan)]) == 0


@pytest.mark.parametrize("bad, says", [(-3, "options.eplb"), (800_000_000, "options.eplb"), (9, "to the model's 8")])
def test_a_plan_file_with_a_bad_eplb_is_refused_naming_the_field(tmp_path, capsys, bad, says):
    """A count below 0 or past MAX_REDUNDANT is refused reading the file (no placement is tried: a
    huge count would run for ever); one past the model's experts, building its context."""
    plan = tmp_path / "plan.yaml"
    argv = [*PLAN, "--cluster", str(REPO / "cluster_specs" / "dgx-a100-l4.yaml"), "--model", "mixtral-8x7b"]
    assert main([*argv, "--eplb", "0", "-o", str(plan)]) == 0
    data = yaml.safe_load(plan.read_text())
    data["options"]["eplb"] = bad
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    assert main(["verify", str(plan)]) == 2
    err = capsys.readouterr().err
    assert says in err and "redundant experts" in err


@pytest.mark.heavy
def test_the_json_export_names_the_redundant_experts_of_data_parallel_engines(tmp_path):
    plan = tmp_path / "plan.yaml"
    argv = [*PLAN, "--cluster", str(REPO / "cluster_specs" / "dgx-a100-l4.yaml"), "--model", "mixtral-8x7b"]
    assert main([*argv, "--eplb", "8", "-o", str(plan)]) == 0
    assert main(["export", str(plan), "--to", "vllm", "--format", "json", "-o", str(tmp_path / "e.json")]) == 0
    engines = json.loads((tmp_path / "e.json").read_text())["engines"]
    assert {e["eplb_redundant_experts"] for e in engines if e["data_parallel_attention"]} == {8}
    assert {e["eplb_redundant_experts"] for e in engines if not e["data_parallel_attention"]} <= {None}


@pytest.mark.parametrize("edit", [{"eplb": None}, {"eplb": 8}, {"dp_imbalance": {2: 1.0, 4: 1.0}}])
@pytest.mark.heavy
def test_verify_recomputes_the_factors_of_uniform_routing_under_eplb(tmp_path, capsys, edit):
    """Without a histogram the member factors are EPLB's placement of equal loads, which verify
    recomputes: EPLB taken away, another count, or factors changed are each a problem it names."""
    plan = tmp_path / "plan.yaml"
    argv = [*PLAN, "--cluster", str(REPO / "cluster_specs" / "dgx-a100-l4.yaml"), "--model", QWEN]
    assert main([*argv, "--eplb", "4", "-o", str(plan)]) == 0
    data = yaml.safe_load(plan.read_text())
    data["options"] |= edit
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    assert main(["verify", str(plan)]) != 0
    said = capsys.readouterr()
    assert "options.dp_imbalance" in said.out + said.err
