"""A measured routing histogram (`--expert-load`; llm_planner.serving.expert_load): its factors by
hand, the refusals naming the file and field, each group shape charged its own factor, and a plan
made, verified and shown with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from serving_fixtures import context

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.cost.iteration import Load, layer_kernels
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.moe import experts_touched
from llm_planner.serving.expert_load import ExpertLoad, ExpertLoadError, read_expert_load
from llm_planner.serving.workload import WorkloadError

SKEWED = [40, 10, 10, 20, 5, 5, 5, 5]  # 8 experts, 100 tokens' rows
QWEN = "qwen1.5-moe-a2.7b"  # 60 experts
REPO = Path(__file__).resolve().parents[1]


def test_the_factors_by_hand():
    """The busiest expert: 8 x 40/100; the busiest of 2 members (experts 0-3 and 4-7): 2 x 80/100;
    of 4 (pairs): 4 x 50/100; every layer's factor averaged (a uniform second layer: 1)."""
    one = ExpertLoad("f", (tuple(SKEWED),))
    assert one.expert_imbalance() == pytest.approx(3.2)
    assert one.dp_imbalance() == pytest.approx({2: 1.6, 4: 2.0, 8: 3.2})
    two = ExpertLoad("f", (tuple(SKEWED), (1,) * 8))
    assert two.expert_imbalance() == pytest.approx((3.2 + 1) / 2)
    assert two.member_imbalance(2) == pytest.approx((1.6 + 1) / 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tokens_per_expert: [1, 2, 3]", r"tokens_per_expert\[0\]: expected 8 counts \(mixtral-8x7b's experts\)"),
        ("tokens_per_expert: [1, 2, 3, 4, 5, 6, 7, -8]", r"tokens_per_expert\[0\]: every count must be a finite"),
        ("tokens_per_expert: [0, 0, 0, 0, 0, 0, 0, 0]", r"tokens_per_expert\[0\]: no expert received a token"),
        ("experts: [1]", "expected one key, tokens_per_expert"),
        (
            "tokens_per_expert: [[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]]",
            "expected one list of counts or 32",
        ),
        ("tokens_per_expert: [1, 2", "not valid YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_it_and_the_field(tmp_path, text, message):
    path = tmp_path / "load.yaml"
    path.write_text(text)
    with pytest.raises(ExpertLoadError, match=message) as info:
        read_expert_load(str(path), preset_config("mixtral-8x7b"))
    assert str(path) in str(info.value)


def test_a_dense_model_has_no_histogram(tmp_path):
    path = tmp_path / "load.yaml"
    path.write_text("tokens_per_expert: [1, 2]")
    with pytest.raises(ExpertLoadError, match="llama2-7b has no experts"):
        read_expert_load(str(path), preset_config("llama2-7b"))
    with pytest.raises(WorkloadError, match="has no experts"):
        context(tmp_path, "llama2-7b", dp_imbalance={2: 1.5})


def test_each_group_shape_is_charged_its_own_factor(tmp_path):
    """tp2 the busiest expert's factor, dpa2 the busiest member's (the same kernels as a uniform
    factor of that size), and DeepEP's pairs scaled by the member's."""
    skewed = context(tmp_path, QWEN, expert_imbalance=3.0, dp_imbalance={2: 1.5, 4: 2.0}, deepep=True)
    flat = {f: context(tmp_path, QWEN, expert_imbalance=f, deepep=True) for f in (1.5, 3.0)}

    def experts(ctx, k, attention):
        (kernel,) = [kr for kr in ctx.cache.get("bigbox/big", k, attention).kernels.kernels if kr.experts is not None]
        return kernel.flops

    assert experts(skewed, 2, "tp") == pytest.approx(experts(flat[3.0], 2, "tp"))
    assert experts(skewed, 2, "dp") == pytest.approx(experts(flat[1.5], 2, "dp"))
    (pairs,) = [kr for kr in skewed.cache.get("bigbox/big", 4, "dp-deepep").kernels.kernels if kr.collective]
    (uniform,) = [
        kr
        for kr in context(tmp_path, QWEN, deepep=True).cache.get("bigbox/big", 4, "dp-deepep").kernels.kernels
        if kr.collective
    ]
    assert pairs.bytes[1] == pytest.approx(2.0 * uniform.bytes[1])


@pytest.mark.heavy  # 6-7 s: CI's test command runs it after the default suite
def test_a_plan_with_a_histogram_states_its_factors_and_verifies(tmp_path, capsys):
    """Mixtral on dgx-a100-l4 with one expert taking 40% of the rows: the plan keeps the factors
    the histogram gives, verify re-derives every figure with them, and show states the member's."""
    load = tmp_path / "load.yaml"
    load.write_text(yaml.safe_dump({"tokens_per_expert": SKEWED}))
    out = tmp_path / "plan.yaml"
    args = ["plan", "--cluster", str(REPO / "cluster_specs" / "dgx-a100-l4.yaml"), "--model", "mixtral-8x7b"]
    args += ["--objective", "serving", "--prompt-len", "512", "--output-len", "128", "--tpot-slo", "50 ms"]
    assert main([*args, "--expert-load", str(load), "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    assert (data["options"]["expert_imbalance"], data["options"]["dp_imbalance"]) == (3.2, {2: 1.6, 4: 2.0, 8: 3.2})
    assert data["options"]["expert_picks"] == [0.8, 0.4, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1]  # top-2 x each share
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    assert main(["show", str(out)]) == 0
    assert "imbalance 3.2 (busiest member: dpa4 2; from a measured histogram)" in " ".join(
        capsys.readouterr().out.split()
    )
    assert main([*args, "--expert-load", str(load), "--expert-imbalance", "2", "-o", str(tmp_path / "x.yaml")]) == 2
    assert "--expert-load and --expert-imbalance: give one" in capsys.readouterr().err


def test_the_chances_by_hand_and_a_skewed_router_reaches_fewer_experts():
    """Top-2 over SKEWED's shares: 2 s_e each, sorted; two layers average rank by rank. T tokens
    reach sum (1 - (1 - q)^T) experts: 2 at T = 1 as under uniform routing, fewer after."""
    one = ExpertLoad("f", (tuple(SKEWED),))
    assert one.picks(2) == pytest.approx((0.8, 0.4, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1))
    two = ExpertLoad("f", (tuple(SKEWED), (1,) * 8))
    assert two.picks(2)[0] == pytest.approx((0.8 + 0.25) / 2)
    uniform = ExpertLoad("f", ((1,) * 8,)).picks(2)
    for tokens in (1, 3, 16):
        assert experts_touched(8, 2, tokens, uniform) == pytest.approx(experts_touched(8, 2, tokens))
    assert experts_touched(8, 2, 1, one.picks(2)) == pytest.approx(2.0)
    assert experts_touched(8, 2, 16, one.picks(2)) < experts_touched(8, 2, 16) - 0.5
    capped = ExpertLoad("f", ((90, 10, 0, 0, 0, 0, 0, 0),)).picks(2)  # 2 x 0.9 is more than certain
    assert capped[0] == 1.0 and experts_touched(8, 2, 5, capped) <= 2.0


def test_a_skewed_router_charges_fewer_weight_reads_than_uniform_routing(tmp_path):
    """Mixtral on one A100 at 32 sequences: the measured router's layer is faster, every other
    figure alike; the bounds and the verifier read the same kernels (the plan test above)."""
    kind = load_cluster(REPO / "cluster_specs" / "four-gpus.yaml").kind("a100-80g")
    picks = ExpertLoad("f", (tuple(SKEWED),)).picks(2)
    config = preset_config("mixtral-8x7b")
    load = Load(decodes=32, decode_keys=32 * 512)
    uniform, skewed = (layer_kernels(config, "fp16", kind, 1, None, 3.2, p) for p in (None, picks))
    assert skewed.time_s(load) < uniform.time_s(load)
    assert layer_kernels(config, "fp16", kind, 1, None, 3.2, None).time_s(load) == uniform.time_s(load)
