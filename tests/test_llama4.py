"""Llama 4's decoder (model_type llama4_text) planned as what it is: every layer MoE with a shared
expert and a top-1 router, chunked attention that is full attention up to its chunk, counted as
transformers counts it; the multimodal wrapper and Maverick's interleaved layers refused naming
what to do; plans exported with the engines' flag that leaves the vision encoder out, and refused
by the runtime."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from serving_fixtures import ONE_HGX, hf_parameter_count
from test_engine_flags import check_against_engine

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.export.serving import build_engines
from llm_planner.export.serving_scripts import sglang_script, vllm_script
from llm_planner.graph import decoder_presets, hf_config
from llm_planner.graph import transformer as tr
from llm_planner.graph.ir import GraphError
from llm_planner.runtime.decoder_tasks import SERVED_FAMILIES, DecoderError, planned_decoder_config
from llm_planner.serving.plan_file import load_serving_plan

# The text_config of meta-llama/Llama-4-Scout-17B-16E-Instruct's config.json (its keys that shape the
# decoder, as published; the rest: token ids, dropout, routing noise and loss, the attention's
# temperature tuning, change no shape or cost).
SCOUT_TEXT = {
    "model_type": "llama4_text",
    "attention_bias": False,
    "attention_chunk_size": 8192,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "interleave_moe_layer_step": 1,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "max_position_embeddings": 10485760,
    "moe_layers": list(range(48)),
    "no_rope_layers": [],  # as published: the class default, rotary embeddings on three layers in four
    "num_attention_heads": 40,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "num_local_experts": 16,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 16.0,
        "high_freq_factor": 1.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_qk_norm": True,
    "vocab_size": 202048,
}


def _scout(**changes):
    return hf_config.config_from_dict({**SCOUT_TEXT, **changes}, "scout/config.json", name="llama4-scout-17b-16e")


def test_scout_reads_as_the_preset_and_counts_as_transformers_does():
    cfg = _scout()
    assert cfg == decoder_presets.preset_config("llama4-scout-17b-16e")
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (16, 1, 8192)
    assert (cfg.shared_expert_size, cfg.intermediate_size, cfg.norm_topk_prob) == (8192, 16384, False)
    assert cfg.sliding_window == 8192  # the attention chunk: full attention up to it
    # by hand: per layer attention 2 x 5120 x (40 + 8) x 128, 17 MLPs of 3 x 5120 x 8192, the router,
    # two norms; the embedding and the untied head; the final norm
    layer = 2 * 5120 * 48 * 128 + 17 * 3 * 5120 * 8192 + 5120 * 16 + 2 * 5120
    assert tr.count_parameters(cfg) == 48 * layer + 2 * 202048 * 5120 + 5120 == 107_769_861_120
    assert tr.count_parameters(cfg) == hf_parameter_count(cfg, "meta")
    # Meta's "17B active": one routed expert and the shared one per layer
    assert tr.count_active_parameters(cfg) == pytest.approx(17e9, rel=0.02)


def test_a_tiny_llama4_round_trips_through_transformers():
    tiny = dataclasses.replace(
        decoder_presets.preset_config("llama4-scout-17b-16e"),
        name="tiny-llama4",
        num_layers=2,
        hidden_size=64,
        word_embed_dim=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
        vocab_size=128,
        max_positions=512,
        num_experts=4,
        experts_per_token=2,
        moe_intermediate_size=32,
        shared_expert_size=32,
        sliding_window=None,
    )
    hf = hf_config.to_hf_config(tiny)
    assert type(hf).__name__ == "Llama4TextConfig" and hf.attention_chunk_size is None
    assert hf_config.from_hf_config(hf, name="tiny-llama4") == tiny
    assert tr.count_parameters(tiny) == hf_parameter_count(tiny, "cpu")


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"interleave_moe_layer_step": 2}, "interleave_moe_layer_step"),  # Llama 4 Maverick's
        ({"moe_layers": list(range(0, 48, 2))}, "moe_layers"),
    ],
)
def test_dense_layers_between_moe_ones_are_refused_naming_the_key(changes, key):
    with pytest.raises(GraphError, match=f"scout/config.json: key '{key}'"):
        _scout(**changes)


def test_the_multimodal_wrapper_is_refused_saying_to_plan_its_text_config():
    wrapper = {"model_type": "llama4", "text_config": SCOUT_TEXT, "vision_config": {"hidden_size": 1408}}
    with pytest.raises(GraphError, match=r"'llama4' is not planned: .*vision encoder.*text_config.*llama4_text"):
        hf_config.config_from_dict(wrapper, "scout/config.json")


def test_which_layers_chunk_is_read_as_transformers_reads_it():
    assert _scout().sliding_window == _scout(no_rope_layers=[1, 1, 1, 0] * 12).sliding_window == 8192
    assert _scout(layer_types=["chunked_attention", "full_attention"] * 24).sliding_window == 8192
    assert _scout(layer_types=["full_attention"] * 48).sliding_window is None
    assert _scout(no_rope_layers=[0] * 48).sliding_window is None
    assert _scout(no_rope_layer_interval=1).sliding_window is None  # no layer has rotary embeddings
    assert _scout(attention_chunk_size=None).sliding_window is None
    for bad, key in (
        ({"attention_chunk_size": 0}, "attention_chunk_size"),
        ({"layer_types": ["chunked_attention"] * 47}, "layer_types"),
        ({"no_rope_layers": [2] * 48}, "no_rope_layers"),
        ({"moe_layers": [0, "1"]}, "moe_layers"),
    ):
        with pytest.raises(GraphError, match=f"scout/config.json: key '{key}'"):
            _scout(**bad)


@pytest.fixture(scope="module")
def scout_plan(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("llama4")
    (tmp / "config.json").write_text(json.dumps(SCOUT_TEXT))
    (tmp / "one-hgx.yaml").write_text(ONE_HGX)
    argv = ["plan", "--objective", "serving", "--cluster", str(tmp / "one-hgx.yaml"), "--model", str(tmp)]
    argv += ["--prompt-len", "1024", "--output-len", "256", "--tpot-slo", "50 ms", "--no-dp-attention"]
    assert main([*argv, "-o", str(tmp / "plan.yaml")]) == 0
    return tmp / "plan.yaml"


def test_a_context_past_the_chunk_is_refused_at_plan_time(scout_plan, capsys):
    tmp = scout_plan.parent
    argv = ["plan", "--objective", "serving", "--cluster", str(tmp / "one-hgx.yaml"), "--model", str(tmp)]
    argv += ["--prompt-len", "8000", "--output-len", "500", "--tpot-slo", "50 ms", "-o", str(tmp / "long.yaml")]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "attention_chunk_size 8192 < prompt 8000 + output 500 tokens" in err and "Traceback" not in err


def test_the_plan_verifies_and_exports_without_the_vision_encoder(scout_plan, capsys):
    data = yaml.safe_load(scout_plan.read_text())
    assert data["model"]["experts"]["num_experts"] == 16
    capsys.readouterr()
    assert main(["verify", str(scout_plan)]) == 0
    plan = load_serving_plan(scout_plan)
    cluster = load_cluster(str(scout_plan.parent / "one-hgx.yaml"))
    for framework, write in (("vllm", vllm_script), ("sglang", sglang_script)):
        script = write(build_engines(plan, cluster, framework))
        assert "--language-model-only" in script
        assert check_against_engine(script, framework) >= 1


def test_the_runtime_refuses_it_naming_the_model_type():
    model = {"name": "llama4-scout-17b-16e"}
    with pytest.raises(DecoderError, match="model type 'llama4_text': the runtime runs"):
        planned_decoder_config(model, None, source="plan.yaml", families=SERVED_FAMILIES)
