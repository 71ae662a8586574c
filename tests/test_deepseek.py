"""DeepSeek-V3's layout read from its config: parameters exactly as transformers' DeepseekV3ForCausalLM
holds them, the published totals, the MLA cache per token, and the refusal that states them."""

from __future__ import annotations

import json

import pytest

from llm_planner.graph import hf_config
from llm_planner.graph.deepseek import deepseek_parameters, kv_values_per_token, read_deepseek
from llm_planner.graph.ir import GraphError

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    n_shared_experts=2,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=12,
    v_head_dim=10,
)


def _shape(config):
    return read_deepseek(hf_config._Reader(config.to_dict(), "test"))


def _hf_params(config, device: str) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "change",
    [{}, {"q_lora_rank": None}, {"attention_bias": True}, {"tie_word_embeddings": True}, {"first_k_dense_replace": 0}],
    ids=["tiny", "plain-q", "biases", "tied", "all-moe"],
)
def test_tiny_configs_count_exactly_like_transformers(change):
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(**{**TINY, **change})
    assert deepseek_parameters(_shape(config))["total"] == _hf_params(config, "cpu")


def test_deepseek_v3_is_671b_with_37b_multiplied_per_token():
    """DeepseekV3Config's defaults are DeepSeek-V3's (61 layers, the first 3 dense, 256 experts of
    2048, top-8, one shared; MLA ranks 1536 and 512); its report: 671B parameters, 37B activated."""
    from transformers import DeepseekV3Config

    config = DeepseekV3Config()
    got = deepseek_parameters(_shape(config))
    assert got["total"] == _hf_params(config, "meta")
    assert got["total"] == pytest.approx(671e9, rel=0.001)
    assert got["active"] == pytest.approx(37e9, rel=0.015)  # 36.6B: the report's "37B" is rounded
    assert kv_values_per_token(_shape(config)) == 61 * (512 + 64)  # the latent and the rope key per layer


def test_a_deepseek_config_is_refused_with_its_size_and_why(tmp_path):
    from transformers import DeepseekV3Config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(DeepseekV3Config().to_dict()))
    with pytest.raises(GraphError) as info:
        hf_config.load_config_file(path)
    message = str(info.value)
    for part in (str(path), "'deepseek_v3' (671.0B parameters, 36.6B active per token", "35,136 values per token"):
        assert part in message, message
    assert "first_k_dense_replace" in message and "not planned" in message
