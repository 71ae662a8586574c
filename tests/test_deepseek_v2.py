"""DeepSeek-V2 and DeepSeek-V2-Lite (model_type deepseek_v2) planned with V3's layers, as they are:
latent attention, routed and shared experts, a dense first layer; counted as transformers counts
them; a V2-Lite plan verifies and exports; the runtime refuses them."""

from __future__ import annotations

import json

import pytest
import yaml
from serving_fixtures import ONE_HGX, hf_parameter_count
from test_engine_flags import check_against_engine

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.export.serving import build_engines
from llm_planner.export.serving_scripts import sglang_script
from llm_planner.graph import decoder_presets, hf_config
from llm_planner.graph import transformer as tr
from llm_planner.graph.ir import GraphError
from llm_planner.runtime.decoder_tasks import SERVED_FAMILIES, DecoderError, planned_decoder_config
from llm_planner.serving.plan_file import load_serving_plan

# The public config.json of deepseek-ai/DeepSeek-V2-Lite (the keys that shape the model)
LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "attention_bias": False,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "v_head_dim": 128,
    "vocab_size": 102400,
}
# deepseek-ai/DeepSeek-V2's config.json differs from V2-Lite's in these keys
V2 = {
    "hidden_size": 5120,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "n_group": 8,
    "n_routed_experts": 160,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 60,
    "q_lora_rank": 1536,
    "routed_scaling_factor": 16.0,
    "topk_group": 3,
    "topk_method": "group_limited_greedy",
}


@pytest.mark.parametrize(
    ("name", "data", "total"), [("deepseek-v2-lite", LITE, 15.7e9), ("deepseek-v2", {**LITE, **V2}, 236e9)]
)
def test_the_configs_read_as_the_presets_and_count_as_transformers_does(name, data, total):
    cfg = hf_config.config_from_dict(data, f"{name}/config.json", name=name)
    assert cfg == decoder_presets.preset_config(name)
    assert cfg.is_mla and cfg.first_dense_layers == 1 and cfg.shared_expert_size == 2 * cfg.moe_intermediate_size
    assert tr.count_parameters(cfg) == hf_parameter_count(cfg)
    assert tr.count_parameters(cfg) == pytest.approx(total, rel=0.01)


def test_the_class_defaults_are_deepseek_v2s():
    data = {k: v for k, v in LITE.items() if k != "norm_topk_prob"}
    assert hf_config.config_from_dict(data, "lite/config.json").norm_topk_prob is False  # V3's default is true


def test_a_config_must_state_its_top_k():
    data = {k: v for k, v in LITE.items() if k != "num_experts_per_tok"}
    with pytest.raises(GraphError, match="deepseek-v2-lite/config.json: missing key 'num_experts_per_tok'"):
        hf_config.config_from_dict(data, "deepseek-v2-lite/config.json")


@pytest.mark.heavy
def test_a_lite_plan_verifies_and_exports_with_data_parallel_attention(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(LITE))
    (tmp_path / "one-hgx.yaml").write_text(ONE_HGX)
    plan = tmp_path / "plan.yaml"
    argv = ["plan", "--objective", "serving", "--cluster", str(tmp_path / "one-hgx.yaml"), "--model", str(tmp_path)]
    argv += ["--prompt-len", "1024", "--output-len", "256", "--tpot-slo", "50 ms", "--exportable", "sglang"]
    assert main([*argv, "-o", str(plan)]) == 0
    data = yaml.safe_load(plan.read_text())
    assert (data["model"]["num_layers"], data["model"]["dense_layers"]) == (26, 1)
    capsys.readouterr()
    assert main(["verify", str(plan)]) == 0
    cluster = load_cluster(str(tmp_path / "one-hgx.yaml"))
    assert check_against_engine(sglang_script(build_engines(load_serving_plan(plan), cluster, "sglang")), "sglang") >= 1


def test_the_runtime_refuses_it_naming_the_model_type():
    with pytest.raises(DecoderError, match="model type 'deepseek_v2': the runtime runs"):
        planned_decoder_config({"name": "deepseek-v2-lite"}, None, source="plan.yaml", families=SERVED_FAMILIES)
