"""DeepSeek-V3's layout (transformers model_type `deepseek_v3`) read from a config.json: its exact
parameters and the KV cache its multi-head latent attention holds. No torch needed. Not planned
yet: the planner refuses the model type by name (llm_planner.graph.moe), with these figures in the
message, until its layers can differ (docs/serving.md, "Layers that differ").

Per layer, with h the hidden size, n heads, q_r and kv_r the query and KV latent ranks, d_n, d_r
and d_v the per-head no-rope, rope and value widths (transformers' DeepseekV3ForCausalLM; the
attention biases only with `attention_bias`):

    attention (MLA)   q: h q_r + q_r + q_r n (d_n + d_r)   (without q_lora_rank: h n (d_n + d_r))
                      kv: h (kv_r + d_r) + kv_r + kv_r n (d_n + d_v);  o: n d_v h;  norms: 2 h
    dense MLP         3 h m             (the first `first_k_dense_replace` layers, m intermediate_size)
    MoE MLP           E h (router) + E 3 h m_e (routed experts) + 3 h s m_e (shared experts)
                      (the rest; E n_routed_experts, m_e moe_intermediate_size, s n_shared_experts)

plus the embedding and the LM head (V h each, unless tied) and the final norm. A token multiplies
every dense weight, the router, its top-k routed experts and the shared ones, and the LM head; its
embedding is a lookup. DeepSeek-V3: 671.0B parameters, 36.6B of them multiplied per token (its
report: 671B, 37B activated). The KV cache holds,
per token and layer, the compressed latent and the rope key: kv_r + d_r values (576 for V3, against
2 n d_h = 32,768 for full heads of that width), and engines keep it whole on every member of a
tensor-parallel group (it has no heads to split).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class DeepSeekShape:
    """The sizes of a deepseek_v3 config that set its parameters and KV cache (module docstring)."""

    hidden: int
    layers: int
    dense_layers: int  # first_k_dense_replace
    heads: int
    vocab: int
    inner: int  # intermediate_size (dense layers)
    expert_inner: int  # moe_intermediate_size
    experts: int  # n_routed_experts
    shared: int  # n_shared_experts
    top_k: int  # num_experts_per_tok
    q_rank: int | None  # q_lora_rank (None: a plain q projection)
    kv_rank: int  # kv_lora_rank
    rope_dim: int  # qk_rope_head_dim
    nope_dim: int  # qk_nope_head_dim
    v_dim: int  # v_head_dim
    bias: bool  # attention_bias
    tied: bool  # tie_word_embeddings


def read_deepseek(r: Any) -> DeepSeekShape:
    """The shape of a deepseek_v3 config, read with `r` (llm_planner.graph.hf_config's typed reader:
    an error names the file and the key); a missing key takes DeepseekV3Config's default."""
    return DeepSeekShape(
        hidden=r.get("hidden_size", int, 7168),
        layers=r.get("num_hidden_layers", int, 61),
        dense_layers=r.get("first_k_dense_replace", int, 3),
        heads=r.get("num_attention_heads", int, 128),
        vocab=r.get("vocab_size", int, 129280),
        inner=r.get("intermediate_size", int, 18432),
        expert_inner=r.get("moe_intermediate_size", int, 2048),
        experts=r.get("n_routed_experts", int, 256),
        shared=r.get("n_shared_experts", int, 1),
        top_k=r.get("num_experts_per_tok", int, 8),
        q_rank=r.get("q_lora_rank", int, None) if "q_lora_rank" in r.data else 1536,
        kv_rank=r.get("kv_lora_rank", int, 512),
        rope_dim=r.get("qk_rope_head_dim", int, 64),
        nope_dim=r.get("qk_nope_head_dim", int, 128),
        v_dim=r.get("v_head_dim", int, 128),
        bias=r.get("attention_bias", bool, False),
        tied=r.get("tie_word_embeddings", bool, False),
    )


def attention_parameters(s: DeepSeekShape) -> int:
    """One layer's MLA weights and its two norms (module docstring)."""
    h, n, qk = s.hidden, s.heads, s.nope_dim + s.rope_dim
    if s.q_rank is None:
        q = h * n * qk
    else:
        q = h * s.q_rank + s.bias * s.q_rank + s.q_rank + s.q_rank * n * qk
    kv = h * (s.kv_rank + s.rope_dim) + s.bias * (s.kv_rank + s.rope_dim) + s.kv_rank
    kv += s.kv_rank * n * (s.nope_dim + s.v_dim)
    return q + kv + n * s.v_dim * h + s.bias * h + 2 * h


def deepseek_parameters(s: DeepSeekShape) -> dict[str, int]:
    """`total` (every weight, as DeepseekV3ForCausalLM holds them) and `active` (what one token
    multiplies: the layers' dense weights, the router, its top-k routed experts and the shared
    ones, the final norm and the LM head; the embedding is a lookup, not counted)."""
    h, moe_layers = s.hidden, s.layers - s.dense_layers
    expert = 3 * h * s.expert_inner
    moe_fixed = s.experts * h + 3 * h * s.shared * s.expert_inner  # router, shared experts
    ends = s.vocab * h * (1 if s.tied else 2) + h  # embedding, LM head, final norm
    dense = s.layers * attention_parameters(s) + s.dense_layers * 3 * h * s.inner + moe_layers * moe_fixed + ends
    lookup = s.vocab * h  # the embedding (the LM head's too when tied: it is multiplied then)
    return {
        "total": dense + moe_layers * s.experts * expert,
        "active": dense + moe_layers * s.top_k * expert - (0 if s.tied else lookup),
    }


def kv_values_per_token(s: DeepSeekShape) -> int:
    """Values the MLA cache holds per token over all layers: the latent and the rope key of each."""
    return s.layers * (s.kv_rank + s.rope_dim)


def footprint_text(s: DeepSeekShape) -> str:
    """Its size in a few words, for the message that refuses to plan it."""
    p = deepseek_parameters(s)
    return (
        f"{p['total'] / 1e9:.1f}B parameters, {p['active'] / 1e9:.1f}B active per token, "
        f"a KV cache of {kv_values_per_token(s):,} values per token (MLA)"
    )
