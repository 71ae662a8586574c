"""The analytic decoder graph builder: presets, exact parameter counts, config files, costs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_planner.graph import decoder_presets, hf_config
from llm_planner.graph import transformer as tr
from llm_planner.graph.decoder_graph import build_decoder_graph
from llm_planner.graph.ir import GraphError, graph_from_dict

PRESETS = [name for name, _ in decoder_presets.preset_descriptions()]

# Published sizes. GPT-2: the openai/gpt-2 release names (124M, 355M, 774M, 1558M).
# OPT: Zhang et al. 2022 table 1; the released opt-350m has 512-wide, projected
# embeddings and 331M parameters (facebook/opt-350m model page), not the nominal 350M.
# Llama 2: 7B and 13B keep LLaMA 1's architecture, whose paper (Touvron et al. 2023a,
# table 2) gives 6.7B and 13.0B; 70B from the Llama 2 paper. Llama 3: Meta's model card.
PUBLISHED = {
    "gpt2": 124e6,
    "gpt2-medium": 355e6,
    "gpt2-large": 774e6,
    "gpt2-xl": 1558e6,
    "opt-125m": 125e6,
    "opt-350m": 331e6,
    "opt-1.3b": 1.3e9,
    "opt-2.7b": 2.7e9,
    "opt-6.7b": 6.7e9,
    "opt-13b": 13e9,
    "opt-30b": 30e9,
    "opt-66b": 66e9,
    "llama2-7b": 6.7e9,
    "llama2-13b": 13e9,
    "llama2-70b": 70e9,
    "llama3-8b": 8e9,
    "llama3-70b": 70e9,
    "llama3.1-8b": 8e9,  # Llama 3.1: Meta's model card
    "llama3.1-70b": 70e9,
    "llama3.1-405b": 405e9,
    "phi-4": 14.7e9,  # its model card
    "qwen3-0.6b": 0.6e9,  # Qwen3 dense: the Qwen/Qwen3-* model cards
    "qwen3-8b": 8.2e9,
    "qwen3-14b": 14.8e9,
    "qwen3-32b": 32.8e9,
    "mixtral-8x7b": 46.7e9,  # mixture-of-experts totals: tests/test_moe_config.py
    "qwen3-30b-a3b": 30.5e9,
    "qwen1.5-moe-a2.7b": 14.3e9,
    "deepseek-v3": 671e9,  # its technical report (tests/test_deepseek.py)
    "llama4-scout-17b-16e": 109e9,  # Meta's model card, the vision encoder's ~0.9B included (tests/test_llama4.py)
    "glm-4.5-air": 106e9,  # their model cards (tests/test_glm4_moe.py)
    "deepseek-v2": 236e9,  # its technical report (tests/test_deepseek_v2.py)
    "deepseek-v2-lite": 15.7e9,
    "glm-4.5": 355e9,
}


def _tiny(family: str, **kw):
    base = dict(
        name=f"tiny-{family}",
        model_type=family,
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=4,
        intermediate_size=96,
        vocab_size=101,
        max_positions=64,
        tie_word_embeddings=True,
    )
    return tr.DecoderConfig(**{**base, **kw})


def _hf_params(hf_config, device: str = "cpu") -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied matrix once


def test_module_imports_without_torch():
    code = (
        "import sys; import llm_planner.graph.transformer; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_gpt3_175b_has_96_blocks_and_175b_parameters():
    cfg = decoder_presets.preset_config("gpt3-175b")
    graph = build_decoder_graph(cfg, phase="decode", seq_len=2048, granularity="block", dtype="fp16")
    assert sum(t.kind == "block" for t in graph.tasks) == 96
    assert tr.count_parameters(cfg) == pytest.approx(175e9, rel=0.01)
    assert graph.meta_dict()["num_params"] == tr.count_parameters(cfg)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_params_match_published_size(name):
    assert tr.count_parameters(decoder_presets.preset_config(name)) == pytest.approx(PUBLISHED[name], rel=0.02)


def test_presets_cover_the_families():
    assert {n for n in PRESETS if n.startswith("gpt3-")} == {
        "gpt3-125m",
        "gpt3-350m",
        "gpt3-760m",
        "gpt3-1.3b",
        "gpt3-2.7b",
        "gpt3-6.7b",
        "gpt3-13b",
        "gpt3-175b",
    }
    assert set(PUBLISHED) <= set(PRESETS) and len(PRESETS) == len(PUBLISHED) + 8
    assert all(decoder_presets.is_preset(n) for n in PRESETS) and not decoder_presets.is_preset("gpt5")
    with pytest.raises(GraphError, match="gpt5"):
        decoder_presets.preset_config("gpt5")


@pytest.mark.parametrize("granularity", ["block", "sublayer"])
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_builds_a_valid_chain(name, granularity):
    cfg = decoder_presets.preset_config(name)
    graph = build_decoder_graph(cfg, phase="prefill", seq_len=128, granularity=granularity, dtype="bf16")
    graph.validate()
    n = cfg.num_layers
    if granularity == "block":
        layer_names = [f"block.{i}" for i in range(n)]
    else:
        layer_names = [f"block.{i}.{part}" for i in range(n) for part in ("attn", "mlp")]
    names = ["embed", *layer_names, "final_norm", "lm_head"]
    assert [t.name for t in graph.tasks] == names
    assert [(e.src, e.dst) for e in graph.edges] == list(zip(names, names[1:]))
    for t in graph.tasks:
        assert t.kind == t.label("role")
        assert (t.label("layer") is not None) == t.name.startswith("block.")
        if t.name.startswith("block."):
            assert t.label("layer") == int(t.name.split(".")[1])
    meta = graph.meta_dict()
    assert {
        k: meta[k] for k in ("model", "model_type", "num_layers", "phase", "seq_len", "dtype", "granularity")
    } == dict(
        model=name,
        model_type=cfg.model_type,
        num_layers=n,
        phase="prefill",
        seq_len=128,
        dtype="bf16",
        granularity=granularity,
    )
    assert meta["decoder_config"] == dataclasses.asdict(cfg)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_counts_exactly_like_transformers(name):
    """The preset built as the real transformers model on the meta device (no memory)."""
    cfg = decoder_presets.preset_config(name)
    assert tr.count_parameters(cfg) == _hf_params(hf_config.to_hf_config(cfg), device="meta")


TINY = {
    "gpt2": _tiny("gpt2"),
    "gpt2-untied-inner": _tiny("gpt2", intermediate_size=80, tie_word_embeddings=False),
    "opt": _tiny("opt"),
    "opt-350m-like": _tiny("opt", word_embed_dim=32, pre_norm=False, final_norm=False),
    "opt-no-bias-no-affine": _tiny("opt", qkv_bias=False, out_bias=False, mlp_bias=False, norm_affine=False),
    "opt-final-norm-removed": _tiny("opt", final_norm=False, tie_word_embeddings=False),
    "llama": _tiny("llama", tie_word_embeddings=False),
    "llama-gqa-biases": _tiny("llama", num_kv_heads=2, qkv_bias=True, out_bias=True, mlp_bias=True),
    "llama-head-dim": _tiny("llama", head_dim=24, num_kv_heads=1, tie_word_embeddings=False),
    "mistral": _tiny("llama", hf_model_type="mistral", num_kv_heads=2, tie_word_embeddings=False),
    "qwen2": _tiny("llama", hf_model_type="qwen2", num_kv_heads=2),
    "mistral-window": _tiny("llama", hf_model_type="mistral", num_kv_heads=2, sliding_window=16),
    "qwen2-window": _tiny("llama", hf_model_type="qwen2", num_kv_heads=2, sliding_window=16),
    "qwen3": _tiny("llama", hf_model_type="qwen3", num_kv_heads=2, head_dim=24),
    "qwen3-bias-window": _tiny("llama", hf_model_type="qwen3", qkv_bias=True, out_bias=True, sliding_window=16),
    "phi3": _tiny("llama", hf_model_type="phi3", num_kv_heads=2, tie_word_embeddings=False, norm_eps=1e-5),
    "phi3-window": _tiny("llama", hf_model_type="phi3", sliding_window=16),
}


@pytest.mark.parametrize("key", sorted(TINY))
def test_tiny_configs_count_exactly_like_transformers(key):
    cfg = TINY[key]
    hf = hf_config.to_hf_config(cfg)
    assert hf.model_type == cfg.hf_model_type
    assert tr.count_parameters(cfg) == _hf_params(hf)
    assert hf_config.from_hf_config(hf, name=cfg.name) == cfg


@pytest.mark.parametrize(
    "key",
    [
        "gpt2",
        "opt-350m-like",
        "llama-gqa-biases",
        "mistral",
        "qwen2",
        "mistral-window",
        "qwen2-window",
        "qwen3",
        "phi3",
    ],
)
def test_save_pretrained_config_loads_like_from_hf_config(key, tmp_path):
    hf = hf_config.to_hf_config(TINY[key])
    hf.save_pretrained(tmp_path / "my-model")
    from_file = hf_config.load_config_file(tmp_path / "my-model" / "config.json")
    assert from_file == hf_config.from_hf_config(hf, name="my-model")
    assert dataclasses.replace(from_file, name=TINY[key].name) == TINY[key]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(["gpt2", "opt", "llama", "mistral", "qwen2", "qwen3", "phi3"]),
    layers=st.integers(1, 3),
    heads=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([4, 8]),
    inner=st.integers(1, 40),
    vocab=st.integers(5, 60),
    tie=st.booleans(),
    bias=st.booleans(),
    flag=st.booleans(),
)
def test_random_configs_count_exactly_like_transformers(
    family, layers, heads, group, head_dim, inner, vocab, tie, bias, flag
):
    hidden = heads * head_dim
    kw = dict(
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        intermediate_size=inner,
        vocab_size=vocab,
        max_positions=16,
        tie_word_embeddings=tie,
    )
    if family == "opt":
        kw.update(
            qkv_bias=bias,
            out_bias=bias,
            mlp_bias=bias,
            pre_norm=flag,
            final_norm=flag and bias,
            norm_affine=not bias or flag,
            word_embed_dim=hidden if flag else hidden + 3,
        )
    elif family != "gpt2":
        kw.update(num_kv_heads=max(heads // group, 1), hf_model_type=family)
        if family == "llama":
            kw.update(qkv_bias=bias, out_bias=bias, mlp_bias=flag)
        if family == "qwen3":
            kw.update(qkv_bias=bias, out_bias=bias)
    cfg = tr.DecoderConfig(name="random", model_type=tr.HF_MODEL_TYPES[family], **kw)
    assert tr.count_parameters(cfg) == _hf_params(hf_config.to_hf_config(cfg), device="meta")
    # the task weights hold every parameter once, plus the tied matrix a second time
    graph = build_decoder_graph(cfg, phase="decode", seq_len=8, granularity="sublayer", dtype="fp32")
    tied = cfg.vocab_size * cfg.word_embed_dim if tie else 0
    assert graph.total_weight_bytes() == 4 * (tr.count_parameters(cfg) + tied)


def test_hand_computed_costs_of_a_tiny_gpt2():
    cfg = tr.DecoderConfig(
        name="hand",
        model_type="gpt2",
        num_layers=1,
        hidden_size=8,
        num_heads=2,
        num_kv_heads=2,
        intermediate_size=32,
        vocab_size=10,
        max_positions=16,
        tie_word_embeddings=True,
    )
    # matmul weights per layer: qkv 8*24 + out 8*8 + mlp 2*8*32 = 768; attention width a = 8
    pre = build_decoder_graph(cfg, phase="prefill", seq_len=4, granularity="block", dtype="fp32")
    assert pre.task("block.0").flops_per_sample == 2 * 768 * 4 + 4 * 8 * (4 * 5 // 2)  # 6464
    assert pre.task("lm_head").flops_per_sample == 2 * 10 * 8  # last position only
    assert pre.task("embed").flops_per_sample == 0
    dec = build_decoder_graph(cfg, phase="decode", seq_len=4, granularity="block", dtype="fp32")
    assert dec.task("block.0").flops_per_sample == 2 * 768 + 4 * 8 * 4  # 1664
    kv_cache = 2 * 8 * 4 * 4  # k and v, width 8, 4 tokens, 4 bytes
    assert dec.task("block.0").mem_bytes_per_sample == kv_cache == pre.task("block.0").mem_bytes_per_sample
    # weights: ln 16 + qkv 192+24 + out 64+8 + ln 16 + fc 256+32 + proj 256+8 = 872 parameters
    assert dec.task("block.0").weight_bytes == 872 * 4
    assert dec.task("embed").weight_bytes == (10 * 8 + 16 * 8) * 4 and dec.task("final_norm").weight_bytes == 16 * 4
    # activation traffic per token (elements): attn 16+32+32+16+24 = 120 (norm, qkv, core, out, residual),
    # mlp 16+40+64+40+24 = 184 (norm, fc, gelu, proj, residual); decode adds the cache read,
    # prefill the cache write (16 per token)
    assert dec.task("block.0").bytes_per_sample == (120 + 184) * 4 + kv_cache
    assert pre.task("block.0").bytes_per_sample == (120 + 16 + 184) * 4 * 4
    assert [e.bytes_per_sample for e in pre.edges] == [4 * 8 * 4] * 3 and {e.bytes_per_sample for e in dec.edges} == {
        8 * 4
    }


@pytest.mark.parametrize("name", ["gpt3-175b", "llama2-70b", "opt-66b"])
def test_decode_flops_per_token_are_about_two_per_parameter(name):
    cfg = decoder_presets.preset_config(name)
    graph = build_decoder_graph(cfg, phase="decode", seq_len=2048, granularity="block", dtype="fp16")
    total = sum(t.flops_per_sample for t in graph.tasks)
    assert total == pytest.approx(2 * tr.count_parameters(cfg), rel=0.10)


def test_prefill_flops_grow_with_seq_len_and_attention_is_quadratic():
    cfg = decoder_presets.preset_config("gpt2")
    flops = {}
    for seq_len in (1, 64, 256, 1024):
        graph = build_decoder_graph(cfg, phase="prefill", seq_len=seq_len, granularity="sublayer", dtype="fp16")
        flops[seq_len] = sum(t.flops_per_sample for t in graph.tasks)
        mlp = graph.task("block.0.mlp").flops_per_sample
        assert mlp == 2 * 2 * 768 * 3072 * seq_len  # linear in tokens
    assert flops[1] < flops[64] < flops[256] < flops[1024]
    assert flops[1024] > 4 * flops[256]  # the causal attention term grows as L^2


def test_block_equals_its_two_sublayers():
    cfg = decoder_presets.preset_config("llama3-8b")
    args = dict(phase="decode", seq_len=512, dtype="fp16")
    block = build_decoder_graph(cfg, granularity="block", **args)
    sub = build_decoder_graph(cfg, granularity="sublayer", **args)
    for f in ("flops_per_sample", "bytes_per_sample", "weight_bytes", "mem_bytes_per_sample"):
        both = getattr(sub.task("block.3.attn"), f) + getattr(sub.task("block.3.mlp"), f)
        assert getattr(block.task("block.3"), f) == both, f
    assert sub.task("block.3.mlp").mem_bytes_per_sample == 0 < sub.task("block.3.attn").mem_bytes_per_sample
    assert all(sub.task(n).mem_bytes_per_sample == 0 for n in ("embed", "final_norm", "lm_head"))


def test_llama2_70b_kv_cache_uses_8_kv_heads():
    cfg = decoder_presets.preset_config("llama2-70b")
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (64, 8, 128)
    graph = build_decoder_graph(cfg, phase="decode", seq_len=4096, granularity="block", dtype="fp16")
    per_layer = 2 * 8 * 128 * 4096 * 2  # 16 MiB of K and V per sequence per layer
    assert graph.task("block.0").mem_bytes_per_sample == per_layer == 16 * 2**20
    assert sum(t.mem_bytes_per_sample for t in graph.tasks) == 80 * per_layer
    # the decode step reads the whole cache: it dominates the activation traffic
    assert per_layer < graph.task("block.0").bytes_per_sample < 1.05 * per_layer
    mha = build_decoder_graph(
        dataclasses.replace(cfg, num_kv_heads=64), phase="decode", seq_len=4096, granularity="block", dtype="fp16"
    )
    assert mha.task("block.0").mem_bytes_per_sample == 8 * per_layer


def test_weights_of_a_tied_model_count_the_embedding_twice():
    cfg = decoder_presets.preset_config("opt-350m")
    graph = build_decoder_graph(cfg, phase="decode", seq_len=2048, granularity="block", dtype="fp16")
    assert graph.task("lm_head").weight_bytes == 2 * 50272 * 512
    assert graph.total_weight_bytes() == 2 * (tr.count_parameters(cfg) + 50272 * 512)
    assert graph.edges[-1].bytes_per_sample == 512 * 2  # after project_out
    untied = decoder_presets.preset_config("llama2-7b")
    g7 = build_decoder_graph(untied, phase="decode", seq_len=16, granularity="block", dtype="fp16")
    assert g7.total_weight_bytes() == 2 * tr.count_parameters(untied)


def test_graph_round_trips_through_json():
    graph = build_decoder_graph(
        decoder_presets.preset_config("opt-125m"), phase="prefill", seq_len=32, granularity="sublayer", dtype="fp16"
    )
    again = graph_from_dict(json.loads(graph.to_json()))
    assert again.tasks == graph.tasks and again.edges == graph.edges and again.meta_dict() == graph.meta_dict()


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(phase="train"), "phase"),
        (dict(granularity="layer"), "granularity"),
        (dict(dtype="fp64"), "dtype"),
        (dict(seq_len=0), "seq_len"),
        (dict(seq_len=2048), "1024 learned positions"),
    ],
)
def test_bad_build_arguments(kw, match):
    args = {**dict(phase="decode", seq_len=16, granularity="block", dtype="fp16"), **kw}
    with pytest.raises(GraphError, match=match):
        build_decoder_graph(decoder_presets.preset_config("gpt2"), **args)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(model_type="bert"), "model_type"),
        (dict(num_kv_heads=3), "multiple of num_kv_heads"),
        (dict(num_layers=0), "num_layers"),
        (dict(qkv_bias=False), "qkv_bias"),
        (dict(word_embed_dim=32), "word_embed_dim"),
        (dict(hf_model_type="qwen2"), "hf_model_type"),
        (dict(num_kv_heads=2), "num_kv_heads == num_heads"),
    ],
)
def test_bad_decoder_configs(kw, match):
    with pytest.raises(GraphError, match=match):
        _tiny("gpt2", **kw)
    with pytest.raises(GraphError, match="one switch"):
        _tiny("opt", qkv_bias=False)


def _write(tmp_path, text: str):
    path = tmp_path / "cfg" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


LLAMA_JSON = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "vocab_size": 100,
    "max_position_embeddings": 128,
}


@pytest.mark.parametrize(
    "data, match",
    [
        ({**LLAMA_JSON, "model_type": "bert"}, "key 'model_type': unsupported 'bert'"),
        ({k: v for k, v in LLAMA_JSON.items() if k != "model_type"}, "missing key 'model_type'"),
        ({k: v for k, v in LLAMA_JSON.items() if k != "intermediate_size"}, "missing key 'intermediate_size'"),
        (
            {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "vocab_size": 10, "n_positions": 8},
            "missing key 'n_head'",
        ),
        ({**LLAMA_JSON, "hidden_size": "64"}, "key 'hidden_size' must be int"),
        ({**LLAMA_JSON, "tie_word_embeddings": 1}, "key 'tie_word_embeddings' must be bool"),
        ({**LLAMA_JSON, "num_key_value_heads": 3}, "multiple of num_kv_heads"),
        ({**LLAMA_JSON, "rope_parameters": {"rope_theta": "big"}}, "rope_parameters: key 'rope_theta' must be float"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_config_files_name_the_file_and_key(tmp_path, data, match):
    path = _write(tmp_path, json.dumps(data))
    with pytest.raises(GraphError, match=match) as info:
        hf_config.load_config_file(path)
    assert str(path) in str(info.value)


def test_config_file_that_is_not_json(tmp_path):
    path = _write(tmp_path, "model_type: llama\n")
    with pytest.raises(GraphError, match="not valid JSON") as info:
        hf_config.load_config_file(path)
    assert str(path) in str(info.value)
    with pytest.raises(GraphError, match="cannot read"):
        hf_config.load_config_file(tmp_path / "missing" / "config.json")


def test_hub_style_config_files_use_the_class_defaults(tmp_path):
    """Hub config.json files leave out keys that have transformers defaults."""
    cfg = hf_config.load_config_file(_write(tmp_path, json.dumps({**LLAMA_JSON, "rope_theta": 500000.0})))
    assert (cfg.name, cfg.num_kv_heads, cfg.head_dim, cfg.tie_word_embeddings, cfg.rope_theta) == (
        "cfg",
        4,
        16,
        False,
        500000.0,
    )
    gpt2 = {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_head": 4,
        "n_layer": 2,
        "vocab_size": 10,
        "n_positions": 8,
        "n_inner": None,
    }
    cfg = hf_config.load_config_file(_write(tmp_path, json.dumps({**gpt2, "_name_or_path": "openai-community/gpt2"})))
    assert (cfg.name, cfg.intermediate_size, cfg.tie_word_embeddings) == ("openai-community/gpt2", 256, True)


def test_registry_builds_presets_and_config_files(tmp_path):
    from llm_planner.graph.models import ModelSpec, build_model_graph

    preset = build_model_graph(ModelSpec(name="llama2-7b", phase="prefill", seq_len=256, granularity="sublayer"))
    assert preset.num_tasks == 2 * 32 + 3 and preset.meta_dict()["seq_len"] == 256
    hf_config.to_hf_config(TINY["opt-350m-like"]).save_pretrained(tmp_path / "tiny-opt")
    for name in (tmp_path / "tiny-opt", tmp_path / "tiny-opt" / "config.json"):
        graph = build_model_graph(ModelSpec(name=str(name), seq_len=32))
        assert graph.meta_dict()["model"] == "tiny-opt" and graph.num_tasks == 2 + 3
        assert graph.meta_dict()["num_params"] == tr.count_parameters(TINY["opt-350m-like"])


def test_docs_table_lists_every_preset_with_its_count(repo):
    rows = {
        line.split("|")[1].strip(" `"): line
        for line in (repo / "docs" / "models.md").read_text().splitlines()
        if line.startswith("| `")
    }
    presets = {n for n in PRESETS}
    assert presets <= set(rows)
    for name in presets:
        assert f"{tr.count_parameters(decoder_presets.preset_config(name)):,}" in rows[name], name
