"""The decoder presets: GPT-2/3, OPT, Llama, Qwen3, Phi-4 and mixture-of-experts configurations by name
(docs/models.md lists them with their sources)."""

from __future__ import annotations

from typing import Any

from llm_planner.graph.ir import GraphError
from llm_planner.graph.model_names import bare_name
from llm_planner.graph.transformer import DecoderConfig, count_active_parameters, count_parameters

# -- presets --------------------------------------------------------------------


def _gpt(name: str, layers: int, hidden: int, heads: int, positions: int) -> DecoderConfig:
    return DecoderConfig(
        name=name,
        model_type="gpt2",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        intermediate_size=4 * hidden,
        vocab_size=50257,
        max_positions=positions,
        tie_word_embeddings=True,
    )


def _opt(name: str, layers: int, hidden: int, heads: int, **kw: Any) -> DecoderConfig:
    return DecoderConfig(
        name=name,
        model_type="opt",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        intermediate_size=4 * hidden,
        vocab_size=50272,
        max_positions=2048,
        tie_word_embeddings=True,
        **kw,
    )


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv_heads: int, inner: int, vocab: int, positions: int, theta: float
) -> DecoderConfig:
    return DecoderConfig(
        name=name,
        model_type="llama",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=inner,
        vocab_size=vocab,
        max_positions=positions,
        tie_word_embeddings=False,
        norm_eps=1e-5,
        rope_theta=theta,
    )


def _typed(
    name: str,
    hf_type: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    *,
    rope_theta: float = 1e6,
    tie_word_embeddings: bool = False,
    **kw: Any,
) -> DecoderConfig:
    """A llama-layout preset of transformers model_type `hf_type` (Qwen, Phi, the MoE types)."""
    return DecoderConfig(
        name=name,
        model_type="llama",
        hf_model_type=hf_type,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        tie_word_embeddings=tie_word_embeddings,
        rope_theta=rope_theta,
        **kw,
    )


def _qwen3(name: str, layers: int, hidden: int, heads: int, inner: int, tie: bool) -> DecoderConfig:
    return _typed(
        name,
        "qwen3",
        layers,
        hidden,
        heads,
        8,
        head_dim=128,
        intermediate_size=inner,
        vocab_size=151936,
        max_positions=40960,
        tie_word_embeddings=tie,
        norm_eps=1e-6,
    )


_PRESETS: dict[str, DecoderConfig] = {
    c.name: c
    for c in (
        # GPT-2: Radford et al. 2019, "Language models are unsupervised multitask learners",
        # table 2, and the openai/gpt-2 model cards (124M, 355M, 774M, 1558M); context 1024.
        _gpt("gpt2", 12, 768, 12, 1024),
        _gpt("gpt2-medium", 24, 1024, 16, 1024),
        _gpt("gpt2-large", 36, 1280, 20, 1024),
        _gpt("gpt2-xl", 48, 1600, 25, 1024),
        # GPT-3: Brown et al. 2020, "Language models are few-shot learners", table 2.1: GPT-2's
        # architecture, context 2048, vocab 50257 (its alternating sparse attention is modelled
        # dense). Two table rows are inconsistent: 13B's d_model 5140 is a typo for 40 heads *
        # d_head 128 = 5120; 1.3B lists 24 heads of 128 for d_model 2048: kept d_model and d_head
        # (16 heads), as GPT-2's layout needs d_model = heads * d_head.
        _gpt("gpt3-125m", 12, 768, 12, 2048),
        _gpt("gpt3-350m", 24, 1024, 16, 2048),
        _gpt("gpt3-760m", 24, 1536, 16, 2048),
        _gpt("gpt3-1.3b", 24, 2048, 16, 2048),
        _gpt("gpt3-2.7b", 32, 2560, 32, 2048),
        _gpt("gpt3-6.7b", 32, 4096, 32, 2048),
        _gpt("gpt3-13b", 40, 5120, 40, 2048),
        _gpt("gpt3-175b", 96, 12288, 96, 2048),
        # Llama 2: Touvron et al. 2023, "Llama 2: open foundation and fine-tuned chat models",
        # table 1, and the meta-llama/Llama-2-*-hf config.json (vocab 32000, context 4096).
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 10000.0),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 10000.0),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 10000.0),
        # Llama 3: Meta 2024, Meta-Llama-3 model card and config.json (vocab 128256, context 8192).
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0),
        # Llama 3.1: Meta 2024, Llama-3.1 model card and config.json (context 131072 by its llama3 rope
        # scaling, which changes no shape or cost); 405B from "The Llama 3 herd of models", table 3.
        _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072, 500000.0),
        _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072, 500000.0),
        _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072, 500000.0),
        # Qwen3 dense: the public config.json of Qwen/Qwen3-{0.6B,8B,14B,32B} (q and k norms on each
        # 128-wide head, 8 KV heads, vocab 151936, context 40960); sizes from their model cards:
        # 0.6B, 8.2B, 14.8B, 32.8B.
        _qwen3("qwen3-0.6b", 28, 1024, 16, 3072, True),
        _qwen3("qwen3-8b", 36, 4096, 32, 12288, False),
        _qwen3("qwen3-14b", 40, 5120, 40, 17408, False),
        _qwen3("qwen3-32b", 64, 5120, 64, 25600, False),
        # Phi-4: the public config.json of microsoft/phi-4 (model_type phi3: 40 KV heads of 10, vocab
        # 100352, context 16384); 14.7B parameters (its model card).
        _typed(
            "phi-4",
            "phi3",
            40,
            5120,
            40,
            10,
            intermediate_size=17920,
            vocab_size=100352,
            max_positions=16384,
            norm_eps=1e-5,
            rope_theta=250000.0,
        ),
        # OPT: Zhang et al. 2022, "OPT: open pre-trained transformer language models", table 1,
        # and facebook/opt-* config.json (350m: 512-wide embeddings projected, norm after).
        _opt("opt-125m", 12, 768, 12),
        _opt("opt-350m", 24, 1024, 16, word_embed_dim=512, pre_norm=False, final_norm=False),
        _opt("opt-1.3b", 24, 2048, 32),
        _opt("opt-2.7b", 32, 2560, 32),
        _opt("opt-6.7b", 32, 4096, 32),
        _opt("opt-13b", 40, 5120, 40),
        _opt("opt-30b", 48, 7168, 56),
        _opt("opt-66b", 64, 9216, 72),
        # Mixture of experts, every layer MoE (llm_planner.graph.moe), from the public config.json of
        # mistralai/Mixtral-8x7B-v0.1 (8 experts, top-2; 46.7B parameters, 12.9B active: Mistral AI,
        # "Mixtral of experts", 2024), Qwen/Qwen3-30B-A3B (128 experts of 768, top-8; 30.5B, 3.3B
        # active: its model card) and Qwen/Qwen1.5-MoE-A2.7B (60 experts of 1408, top-4, a shared
        # expert of 5632; 14.3B, 2.7B active: its model card).
        _typed(
            "mixtral-8x7b",
            "mixtral",
            32,
            4096,
            32,
            8,
            intermediate_size=14336,
            vocab_size=32000,
            max_positions=32768,
            norm_eps=1e-5,
            num_experts=8,
            experts_per_token=2,
            moe_intermediate_size=14336,
        ),
        _typed(
            "qwen3-30b-a3b",
            "qwen3_moe",
            48,
            2048,
            32,
            4,
            head_dim=128,
            intermediate_size=6144,
            vocab_size=151936,
            max_positions=40960,
            norm_eps=1e-6,
            num_experts=128,
            experts_per_token=8,
            moe_intermediate_size=768,
            norm_topk_prob=True,
        ),
        _typed(
            "qwen1.5-moe-a2.7b",
            "qwen2_moe",
            24,
            2048,
            16,
            16,
            intermediate_size=5632,
            vocab_size=151936,
            max_positions=8192,
            norm_eps=1e-6,
            num_experts=60,
            experts_per_token=4,
            moe_intermediate_size=1408,
            shared_expert_size=5632,
        ),
        # DeepSeek-V3 (the public config.json of deepseek-ai/DeepSeek-V3: 61 layers, the first 3 dense,
        # 256 routed experts of 2048, top-8, one shared; multi-head latent attention with a 512-wide KV
        # latent and 1536-wide query latent; 671B parameters, 37B activated: DeepSeek-AI, "DeepSeek-V3
        # technical report", 2024). Its checkpoint is fp8 (plan it with --weights fp8).
        _typed(
            "deepseek-v3",
            "deepseek_v3",
            61,
            7168,
            128,
            128,
            head_dim=192,
            intermediate_size=18432,
            vocab_size=129280,
            max_positions=163840,
            norm_eps=1e-6,
            num_experts=256,
            experts_per_token=8,
            moe_intermediate_size=2048,
            shared_expert_size=2048,
            norm_topk_prob=True,
            kv_lora_rank=512,
            q_lora_rank=1536,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            first_dense_layers=3,
            rope_theta=10000.0,
        ),
        # DeepSeek-V2 and DeepSeek-V2-Lite (the public config.json of deepseek-ai/DeepSeek-V2 and
        # deepseek-ai/DeepSeek-V2-Lite): V3's latent attention (V2-Lite without the query latent), 160 or
        # 64 routed experts, top-6, two shared, the first layer dense. Published: 236B total / 21B
        # activated, 15.7B / 2.4B (DeepSeek-AI, "DeepSeek-V2", 2024).
        _typed(
            "deepseek-v2",
            "deepseek_v2",
            60,
            5120,
            128,
            128,
            head_dim=192,
            intermediate_size=12288,
            vocab_size=102400,
            max_positions=163840,
            norm_eps=1e-6,
            num_experts=160,
            experts_per_token=6,
            moe_intermediate_size=1536,
            shared_expert_size=3072,
            kv_lora_rank=512,
            q_lora_rank=1536,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            first_dense_layers=1,
            rope_theta=10000.0,
        ),
        _typed(
            "deepseek-v2-lite",
            "deepseek_v2",
            27,
            2048,
            16,
            16,
            head_dim=192,
            intermediate_size=10944,
            vocab_size=102400,
            max_positions=163840,
            norm_eps=1e-6,
            num_experts=64,
            experts_per_token=6,
            moe_intermediate_size=1408,
            shared_expert_size=2816,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            first_dense_layers=1,
            rope_theta=10000.0,
        ),
        # Llama 4 Scout's decoder (meta-llama/Llama-4-Scout-17B-16E-Instruct, its config.json's
        # text_config): 16 experts of 8192 and one shared, top-1, every layer; 107.8B parameters, 17.2B
        # multiplied per token (Meta's 109B total counts the vision encoder too). Chunked attention of
        # 8192 tokens on three layers in four: contexts up to 8192 tokens are planned.
        _typed(
            "llama4-scout-17b-16e",
            "llama4_text",
            48,
            5120,
            40,
            8,
            head_dim=128,
            intermediate_size=16384,
            vocab_size=202048,
            max_positions=10485760,
            norm_eps=1e-5,
            num_experts=16,
            experts_per_token=1,
            moe_intermediate_size=8192,
            shared_expert_size=8192,
            sliding_window=8192,
            rope_theta=500000.0,
        ),
        # GLM-4.5-Air and GLM-4.5 (the public config.json of zai-org/GLM-4.5-Air and zai-org/GLM-4.5):
        # grouped-query attention of 96 heads of 128 (biases on q, k, v; GLM-4.5 norms each query and
        # key head), 128 or 160 routed experts, top-8, one shared, the first 1 or 3 layers dense. Their
        # multi-token-prediction layer (num_nextn_predict_layers) serves speculative decoding only and
        # is not planned. Published: 106B total / 12B active, 355B / 32B (active without the embeddings).
        _typed(
            "glm-4.5-air",
            "glm4_moe",
            46,
            4096,
            96,
            8,
            head_dim=128,
            intermediate_size=10944,
            vocab_size=151552,
            max_positions=131072,
            norm_eps=1e-5,
            qkv_bias=True,
            qk_norm=False,
            num_experts=128,
            experts_per_token=8,
            moe_intermediate_size=1408,
            shared_expert_size=1408,
            norm_topk_prob=True,
            first_dense_layers=1,
        ),
        _typed(
            "glm-4.5",
            "glm4_moe",
            92,
            5120,
            96,
            8,
            head_dim=128,
            intermediate_size=12288,
            vocab_size=151552,
            max_positions=131072,
            norm_eps=1e-5,
            qkv_bias=True,
            qk_norm=True,
            num_experts=160,
            experts_per_token=8,
            moe_intermediate_size=1536,
            shared_expert_size=1536,
            norm_topk_prob=True,
            first_dense_layers=3,
        ),
    )
}


def preset_descriptions() -> list[tuple[str, str]]:
    """(name, one-line description) of every decoder preset."""
    out = []
    for name, c in _PRESETS.items():
        heads = f"{c.num_heads} heads" + (f" ({c.num_kv_heads} KV)" if c.num_kv_heads != c.num_heads else "")
        if c.is_moe:
            heads += (
                f", {c.num_experts} experts (top-{c.experts_per_token}, {count_active_parameters(c) / 1e9:.3g}B active)"
            )
        out.append(
            (
                name,
                f"{c.hf_model_type} decoder, {c.num_layers} layers, "
                f"hidden {c.hidden_size}, {heads}, "
                f"{count_parameters(c) / 1e9:.3g}B params, context {c.max_positions}",
            )
        )
    return out


def is_preset(name: str) -> bool:
    return name in _PRESETS


def preset_of(name: str) -> DecoderConfig | None:
    """The preset a model name means, its own or a Hugging Face id of it ('meta-llama/Meta-Llama-3-8B'
    means llama3-8b: the same bare name, llm_planner.graph.model_names); None when none does."""
    if name in _PRESETS:
        return _PRESETS[name]
    found = [c for c in _PRESETS.values() if bare_name(c.name) == bare_name(name)]
    return found[0] if len(found) == 1 else None


def preset_config(name: str) -> DecoderConfig:
    if name not in _PRESETS:
        raise GraphError(f"unknown decoder preset {name!r} (presets: {', '.join(_PRESETS)})")
    return _PRESETS[name]
