"""Multi-head latent attention (MLA: DeepSeek-V2/V3, transformers' DeepseekV3Attention): its
parameters, its KV cache and its sizes per member of a tensor-parallel group. No torch needed.

With h the hidden size, n heads, r_q and r_kv the query and KV latent ranks, d_n, d_r and d_v
the per-head no-rope and rope query/key widths and the value width, a layer's attention holds

    q      q_a: h r_q, its RMSNorm r_q, q_b: r_q n (d_n + d_r)   (r_q = 0: q: h n (d_n + d_r))
    kv     kv_a: h (r_kv + d_r), its RMSNorm r_kv, kv_b: r_kv n (d_n + d_v)
    o      n d_v h;  biases (attention_bias): r_q + (r_kv + d_r) + h

and its KV cache holds per token the latent and the rope key, r_kv + d_r values, not per head.
Engines (vLLM, SGLang) run it on a tensor-parallel group of k with q_a and kv_a and both norms
replicated, q_b and kv_b split by heads (column), o by heads (row, one all-reduce), and the
whole cache on every member (it has no heads to split).

Per token a member multiplies its share of every linear weight once (2 FLOPs per weight), in
decode too: there the engines fold kv_b into the query and the output ("absorbed" MLA), the same
multiplications applied to the query and the attention's output instead of to the cache. The
attention itself, per key a query sees:

    decode   (absorbed) QK over r_kv + d_r and AV over r_kv per head: 2 (n/k) (2 r_kv + d_r)
             FLOPs, the latent read once for all heads: (r_kv + d_r) KV bytes
    prefill  (the prompt's keys and values decompressed by kv_b, then attention as MHA):
             2 (n/k) (d_n + d_r + d_v) FLOPs

Left out: a chunked prompt's earlier chunks, decompressed again for its later ones.
"""

from __future__ import annotations

from typing import Any

from llm_planner.graph.ir import GraphError

MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
# model_types with a dense MLP in the first layers (first_k_dense_replace)
DENSE_FIRST_TYPES = ("deepseek_v2", "deepseek_v3", "glm4_moe")
MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def check_mla(where: str, cfg: Any) -> None:
    """Raise GraphError unless cfg's MLA and dense-layer fields fit its model_type (module docstring)."""
    for key in (*MLA_FIELDS, "first_dense_layers"):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GraphError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    if cfg.first_dense_layers and cfg.hf_model_type not in DENSE_FIRST_TYPES:
        raise GraphError(f"{where}: {cfg.hf_model_type} models have no dense first layers")
    _check_dense_first(where, cfg)
    if cfg.hf_model_type not in MLA_MODEL_TYPES:
        if any(getattr(cfg, key) for key in MLA_FIELDS):
            raise GraphError(f"{where}: {cfg.hf_model_type} models have no latent attention")
        return
    for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        if getattr(cfg, key) < 1:
            raise GraphError(f"{where}: {cfg.hf_model_type} needs {key} >= 1")
    if cfg.head_dim != cfg.qk_rope_head_dim + cfg.qk_nope_head_dim:
        raise GraphError(f"{where}: head_dim must be qk_rope_head_dim + qk_nope_head_dim for {cfg.hf_model_type}")


def _check_dense_first(where: str, cfg: Any) -> None:
    """Dense first layers leave some layers with experts (DENSE_FIRST_TYPES)."""
    if cfg.first_dense_layers and (not cfg.is_moe or cfg.first_dense_layers >= cfg.num_layers):
        raise GraphError(
            f"{where}: first_dense_layers ({cfg.first_dense_layers}) must be below num_layers ({cfg.num_layers}) "
            "and the layers after them have experts (a model whose layers are all dense has 0 and no experts)"
        )


def mla_attention_parameters(cfg: Any) -> dict[str, int]:
    """One layer's MLA parameters without the input norm (module docstring): `linear` (the weights
    a token multiplies), `norms` (the latents' RMSNorms) and `biases`."""
    h, n, r_q, r_kv = cfg.hidden_size, cfg.num_heads, cfg.q_lora_rank, cfg.kv_lora_rank
    qk, d_r, d_v = cfg.head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    q = h * r_q + r_q * n * qk if r_q else h * n * qk
    kv = h * (r_kv + d_r) + r_kv * n * (cfg.qk_nope_head_dim + d_v)
    biases = cfg.qkv_bias * (r_q + r_kv + d_r) + cfg.out_bias * h
    return {"linear": q + kv + n * d_v * h, "norms": r_q + r_kv, "biases": biases}


def mla_replicated_linear(cfg: Any) -> int:
    """The linear weights every member of a tensor-parallel group holds whole: q_a and kv_a."""
    return cfg.hidden_size * (cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim)


def kv_elements_per_token(cfg: Any) -> int:
    """Values one layer's cache holds per token: the latent and the rope key (whole on every member)."""
    return cfg.kv_lora_rank + cfg.qk_rope_head_dim


def member_linear_parameters(cfg: Any, k: int) -> float:
    """Linear weights of one layer's attention that a member of a group of k holds."""
    rep = mla_replicated_linear(cfg)
    return rep + (mla_attention_parameters(cfg)["linear"] - rep) / k


def member_traffic(cfg: Any, k: int) -> tuple[float, float]:
    """(activations in and out of the projections, elementwise traffic besides the input norm and
    residual add) per token on a member of a group of k: the latents whole, the heads' share."""
    h, r_q, r_kv, d_r = cfg.hidden_size, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    heads = cfg.num_heads / k
    q = (h + r_q) + (r_q + heads * cfg.head_dim) if r_q else h + heads * cfg.head_dim
    kv = (h + r_kv + d_r) + (r_kv + heads * (cfg.qk_nope_head_dim + cfg.v_head_dim))
    io = q + kv + (heads * cfg.v_head_dim + h)
    elementwise = 2 * r_q + 2 * r_kv + 2 * (heads * d_r + d_r)  # the latents' norms, the rotary embedding
    return io, elementwise


def decode_flops_per_key(cfg: Any, k: int) -> float:
    """Absorbed attention of one decode query against one cached token, on a member of k."""
    return 2 * cfg.num_heads / k * (2 * cfg.kv_lora_rank + cfg.qk_rope_head_dim)


def prefill_flops_per_key(cfg: Any, k: int) -> float:
    """Attention of one prompt query against one key after decompression, on a member of k."""
    return 2 * cfg.num_heads / k * (cfg.head_dim + cfg.v_head_dim)


def decode_io_per_token(cfg: Any, k: int) -> float:
    """Elements a decode query's attention reads and writes besides the cache: the absorbed query
    (latent and rope widths) and its output (the latent's width), per head of the member."""
    return cfg.num_heads / k * (2 * cfg.kv_lora_rank + cfg.qk_rope_head_dim)


def prefill_io_per_token(cfg: Any, k: int) -> float:
    """Elements a prompt token's attention reads and writes besides the cache write: q, k, v, o."""
    return cfg.num_heads / k * (2 * cfg.head_dim + 2 * cfg.v_head_dim)
