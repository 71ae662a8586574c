"""GLM-4.5 and GLM-4.5-Air (model_type glm4_moe) planned as what they are: DeepSeek-V3's experts and
dense first layers with grouped-query attention (q, k, v biases; GLM-4.5's per-head norms),
counted as transformers counts them; planned, verified and exported with their dense layers on the
first stage; refused by the runtime."""

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
from llm_planner.export.serving_scripts import vllm_script
from llm_planner.graph import decoder_presets, hf_config
from llm_planner.graph import transformer as tr
from llm_planner.graph.ir import GraphError
from llm_planner.runtime.decoder_tasks import SERVED_FAMILIES, DecoderError, planned_decoder_config
from llm_planner.serving.plan_file import load_serving_plan

# The public config.json of zai-org/GLM-4.5-Air (the keys that shape the model; token ids, routing's
# scaling and groups, dropout and loss change no shape or cost).
AIR = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "attention_bias": True,
    "first_k_dense_replace": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 10944,
    "max_position_embeddings": 131072,
    "moe_intermediate_size": 1408,
    "n_group": 1,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 96,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 46,
    "num_key_value_heads": 8,
    "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000,
    "routed_scaling_factor": 1.0,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "torch_dtype": "bfloat16",
    "use_qk_norm": False,
    "vocab_size": 151552,
}
# GLM-4.5's own config.json differs from Air's in these keys
GLM45 = {
    "hidden_size": 5120,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "n_routed_experts": 160,
    "first_k_dense_replace": 3,
    "num_hidden_layers": 92,
    "use_qk_norm": True,
    "routed_scaling_factor": 2.5,
}


def _read(data: dict, name: str) -> tr.DecoderConfig:
    return hf_config.config_from_dict(data, f"{name}/config.json", name=name)


@pytest.mark.parametrize(
    ("name", "data", "total", "active"),
    [("glm-4.5-air", AIR, 106e9, 12e9), ("glm-4.5", {**AIR, **GLM45}, 355e9, 32e9)],
)
def test_the_configs_read_as_the_presets_and_count_as_transformers_does(name, data, total, active):
    cfg = _read(data, name)
    assert cfg == decoder_presets.preset_config(name)
    assert (cfg.qkv_bias, cfg.out_bias, cfg.qk_norm) == (True, False, data["use_qk_norm"])
    assert cfg.first_dense_layers == data["first_k_dense_replace"]
    assert cfg.shared_expert_size == cfg.moe_intermediate_size
    assert tr.count_parameters(cfg) == hf_parameter_count(cfg, "meta")
    # the model cards' totals (GLM-4.5's with its multi-token-prediction layer, not planned) and
    # active counts, which leave out the embedding and the head
    assert tr.count_parameters(cfg) == pytest.approx(total, rel=0.01)
    embeddings = 2 * cfg.vocab_size * cfg.hidden_size
    assert tr.count_active_parameters(cfg) - embeddings == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_a_tiny_glm_round_trips_through_transformers(qk_norm):
    tiny = dataclasses.replace(
        decoder_presets.preset_config("glm-4.5-air"),
        name="tiny-glm",
        num_layers=3,
        hidden_size=64,
        word_embed_dim=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=96,
        vocab_size=128,
        max_positions=256,
        num_experts=4,
        experts_per_token=2,
        moe_intermediate_size=24,
        shared_expert_size=48,
        first_dense_layers=1,
        qk_norm=qk_norm,
    )
    assert hf_config.from_hf_config(hf_config.to_hf_config(tiny), name="tiny-glm") == tiny
    assert tr.count_parameters(tiny) == hf_parameter_count(tiny, "cpu")


def test_dense_first_layers_belong_to_the_types_that_have_them():
    with pytest.raises(GraphError, match="qwen3_moe models have no dense first layers"):
        dataclasses.replace(decoder_presets.preset_config("qwen3-30b-a3b"), first_dense_layers=1)
    with pytest.raises(GraphError, match="glm4_moe models have no latent attention"):
        dataclasses.replace(decoder_presets.preset_config("glm-4.5-air"), kv_lora_rank=512)
    with pytest.raises(GraphError, match="qk_norm must be true or false"):
        dataclasses.replace(decoder_presets.preset_config("glm-4.5-air"), qk_norm="yes")


@pytest.fixture(scope="module")
def air_plan(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("glm")
    (tmp / "config.json").write_text(json.dumps(AIR))
    (tmp / "one-hgx.yaml").write_text(ONE_HGX)
    argv = ["plan", "--objective", "serving", "--cluster", str(tmp / "one-hgx.yaml"), "--model", str(tmp)]
    argv += ["--prompt-len", "1024", "--output-len", "256", "--tpot-slo", "50 ms"]
    assert main([*argv, "-o", str(tmp / "plan.yaml")]) == 0
    return tmp / "plan.yaml"


@pytest.mark.heavy
def test_the_plan_holds_the_dense_layer_on_its_first_stage_verifies_and_exports(air_plan, capsys):
    data = yaml.safe_load(air_plan.read_text())
    assert (data["model"]["num_layers"], data["model"]["dense_layers"]) == (45, 1)
    capsys.readouterr()
    assert main(["verify", str(air_plan)]) == 0
    script = vllm_script(
        build_engines(load_serving_plan(air_plan), load_cluster(str(air_plan.parent / "one-hgx.yaml")), "vllm")
    )
    assert check_against_engine(script, "vllm") >= 1 and "--language-model-only" not in script


def test_the_runtime_refuses_it_naming_the_model_type():
    with pytest.raises(DecoderError, match="model type 'glm4_moe': the runtime runs"):
        planned_decoder_config({"name": "glm-4.5-air"}, None, source="plan.yaml", families=SERVED_FAMILIES)
