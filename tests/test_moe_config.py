"""Mixture-of-experts configs: read from transformers config.json, counted exactly like
transformers' own model classes, refused where the planner would plan something else."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_planner.graph import decoder_presets, hf_config
from llm_planner.graph import transformer as tr
from llm_planner.graph.decoder_graph import build_decoder_graph
from llm_planner.graph.ir import GraphError
from llm_planner.graph.moe import experts_touched, moe_parameters
from llm_planner.graph.tp_layout import task_layout


def _tiny_moe(hf_type: str, **kw):
    base = dict(
        name=f"tiny-{hf_type}",
        model_type="llama",
        hf_model_type=hf_type,
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        vocab_size=101,
        max_positions=64,
        tie_word_embeddings=False,
        num_experts=4,
        experts_per_token=2,
        moe_intermediate_size=96 if hf_type == "mixtral" else 32,
        shared_expert_size=48 if hf_type == "qwen2_moe" else 0,
    )
    return tr.DecoderConfig(**{**base, **kw})


TINY = {
    "mixtral": _tiny_moe("mixtral"),
    "qwen2_moe": _tiny_moe("qwen2_moe"),
    "qwen3_moe": _tiny_moe("qwen3_moe", head_dim=24),
    "qwen3_moe-bias-top1": _tiny_moe("qwen3_moe", qkv_bias=True, out_bias=True, experts_per_token=1),
    # a window on every layer and top-k weights divided by their sum survive the round trip
    "mixtral-window": _tiny_moe("mixtral", sliding_window=32),
    "qwen2_moe-window-normalised": _tiny_moe("qwen2_moe", sliding_window=32, norm_topk_prob=True),
    "qwen3_moe-window-normalised": _tiny_moe("qwen3_moe", sliding_window=32, norm_topk_prob=True),
}


def _hf_params(hf_config) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("key", sorted(TINY))
def test_tiny_moe_configs_count_exactly_like_transformers(key, tmp_path):
    cfg = TINY[key]
    hf = hf_config.to_hf_config(cfg)
    assert hf.model_type == cfg.hf_model_type
    assert tr.count_parameters(cfg) == _hf_params(hf)
    hf.save_pretrained(tmp_path / "m")
    assert dataclasses.replace(hf_config.load_config_file(tmp_path / "m" / "config.json"), name=cfg.name) == cfg
    # the task weights hold every expert once; the layout's members hold them all between them
    graph = build_decoder_graph(cfg, phase="decode", seq_len=8, granularity="sublayer", dtype="fp32")
    assert graph.total_weight_bytes() == 4 * tr.count_parameters(cfg)
    mlp = task_layout(cfg, "mlp")
    assert mlp.elements() == tr.part_parameters(cfg)["mlp"]
    assert mlp.member_elements(2, 0) + mlp.member_elements(2, 1) == mlp.elements() + mlp.elements(split="replicated")


def test_tiny_mixtral_by_hand():
    cfg = TINY["mixtral"]  # h 64, 4 experts of 96, top-2
    p = moe_parameters(cfg)
    assert p == {
        "router": 64 * 4,
        "expert": 3 * 64 * 96,
        "experts": 4 * 3 * 64 * 96,
        "shared": 0,
        "active": 256 + 2 * 18432,
    }
    # a decode token's FLOPs on the MLP: twice the router's and two experts' weights
    graph = build_decoder_graph(cfg, phase="decode", seq_len=8, granularity="sublayer", dtype="fp32")
    assert graph.task("block.0.mlp").flops_per_sample == 2 * (256 + 2 * 18432)
    assert graph.task("block.0.mlp").weight_bytes == 4 * (256 + 4 * 18432 + 64)  # and its norm


# Published totals (within 1%): Mixtral-8x7B 46.7B / 12.9B active (Mistral AI, "Mixtral of
# experts", 2024); Qwen3-30B-A3B 30.5B / 3.3B (its model card); Qwen1.5-MoE-A2.7B 14.3B / 2.7B.
PUBLISHED = {"mixtral-8x7b": (46.7e9, 12.9e9), "qwen3-30b-a3b": (30.5e9, 3.3e9), "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_presets_match_the_published_totals(name):
    cfg = decoder_presets.preset_config(name)
    total, active = PUBLISHED[name]
    assert tr.count_parameters(cfg) == pytest.approx(total, rel=0.01)
    assert tr.count_active_parameters(cfg) == pytest.approx(active, rel=0.02)


# The public config.json of mistralai/Mixtral-8x7B-v0.1 (as published) and Qwen/Qwen3-30B-A3B's.
MIXTRAL_JSON = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32000,
}
QWEN3_JSON = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}


@pytest.mark.parametrize(("data", "preset"), [(MIXTRAL_JSON, "mixtral-8x7b"), (QWEN3_JSON, "qwen3-30b-a3b")])
def test_public_config_files_read_as_the_presets(tmp_path, data, preset):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    cfg = hf_config.load_config_file(path)
    assert dataclasses.replace(cfg, name=preset) == decoder_presets.preset_config(preset)


def test_a_mixtral_config_without_its_norm_epsilon_takes_the_class_default(tmp_path):
    """MixtralConfig's rms_norm_eps is 1e-5 (not the llama family's 1e-6): the preset again."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in MIXTRAL_JSON.items() if k != "rms_norm_eps"}))
    cfg = hf_config.load_config_file(path)
    assert dataclasses.replace(cfg, name="mixtral-8x7b") == decoder_presets.preset_config("mixtral-8x7b")


def _refused(tmp_path, data, match):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GraphError, match=match) as info:
        hf_config.load_config_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("relabel", ["mistral", "llama", "qwen2"])
def test_a_mixtral_relabelled_dense_is_refused_naming_the_key(tmp_path, relabel):
    _refused(tmp_path, {**MIXTRAL_JSON, "model_type": relabel}, "key 'num_local_experts'.*no experts")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"model_type": "gpt_oss"}, r"'gpt_oss' is not planned: attention sinks, alternating sliding windows"),
        ({"decoder_sparse_step": 2}, "key 'decoder_sparse_step': 2 puts dense MLP layers"),
        ({"mlp_only_layers": [0]}, "key 'mlp_only_layers'"),
        ({"num_experts_per_tok": 129}, "experts_per_token must be from 1 to num_experts .128."),
        ({"num_experts": 0}, "needs num_experts"),
    ],
)
def test_configs_the_planner_cannot_plan_exactly_are_refused(tmp_path, change, match):
    _refused(tmp_path, {**QWEN3_JSON, **change}, match)


def test_dense_configs_carry_no_experts():
    with pytest.raises(GraphError, match="have no experts"):
        dataclasses.replace(decoder_presets.preset_config("llama2-7b"), num_experts=8, experts_per_token=2)
    assert not decoder_presets.preset_config("llama3-8b").is_moe
    assert tr.count_active_parameters(decoder_presets.preset_config("llama3-8b")) == tr.count_parameters(
        decoder_presets.preset_config("llama3-8b")
    )


def test_experts_touched_by_hand():
    assert experts_touched(8, 2, 0) == 0.0
    assert experts_touched(8, 2, 1) == pytest.approx(2.0)
    assert experts_touched(8, 2, 2) == pytest.approx(8 * (1 - 0.75**2))  # 3.5
    assert experts_touched(8, 2, 1000) == pytest.approx(8.0)


def test_a_dense_config_with_compressed_attention_keys_is_refused(tmp_path):
    dense = {k: v for k, v in QWEN3_JSON.items() if "expert" not in k and "moe" not in k}
    _refused(tmp_path, {**dense, "model_type": "qwen2", "kv_lora_rank": 512}, "key 'kv_lora_rank'")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hf_type=st.sampled_from(["mixtral", "qwen2_moe", "qwen3_moe"]),
    layers=st.integers(1, 2),
    heads=st.sampled_from([2, 4]),
    group=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([4, 8]),
    experts=st.integers(1, 6),
    top=st.integers(1, 6),
    width=st.integers(1, 24),
    shared=st.integers(1, 24),
    tie=st.booleans(),
)
def test_random_moe_configs_count_exactly_like_transformers(
    hf_type, layers, heads, group, head_dim, experts, top, width, shared, tie
):
    cfg = _tiny_moe(
        hf_type,
        num_layers=layers,
        hidden_size=heads * head_dim,
        num_heads=heads,
        num_kv_heads=heads // group,
        head_dim=head_dim,
        intermediate_size=width if hf_type == "mixtral" else 40,
        num_experts=experts,
        experts_per_token=min(top, experts),
        moe_intermediate_size=width,
        shared_expert_size=shared if hf_type == "qwen2_moe" else 0,
        tie_word_embeddings=tie,
    )
    assert tr.count_parameters(cfg) == _hf_params(hf_config.to_hf_config(cfg))
    graph = build_decoder_graph(cfg, phase="decode", seq_len=8, granularity="sublayer", dtype="fp32")
    tied = cfg.vocab_size * cfg.hidden_size if tie else 0
    assert graph.total_weight_bytes() == 4 * (tr.count_parameters(cfg) + tied)
