"""Mixture-of-experts decoders: which transformers configs carry experts, how they are read, and
the parameters of an MoE layer's MLP. No torch needed.

An MoE layer replaces the dense MLP by a router and E routed experts, each a gated (SwiGLU) MLP
of width m; each token goes to the top-k experts its router scores highest, and (qwen2_moe)
through a shared expert of width s, scaled by a sigmoid gate, as well:

    router         h E                   (Linear(h, E), no bias)
    routed experts E 3 h m               (gate, up: h -> m; down: m -> h; no biases)
    shared expert  3 h s + h             (qwen2_moe: gate, up, down of width s, and its gate Linear(h, 1))

A token's linear FLOPs are 2 (h E + k 3 h m + 3 h s + h): the router and its k experts and the
shared expert (exact under any routing that drops no token). Memory holds every expert.

Read from a transformers config.json (`moe_fields`), by model_type:

    mixtral    num_local_experts, num_experts_per_tok; the experts' width is intermediate_size;
               the top-k routing weights always divided by their sum
    qwen2_moe  num_experts, num_experts_per_tok, moe_intermediate_size,
               shared_expert_intermediate_size; decoder_sparse_step, mlp_only_layers;
               norm_topk_prob (the top-k weights divided by their sum; default false)
    qwen3_moe  the same without the shared expert; q_norm and k_norm on each head (attention)
    deepseek_v2  as deepseek_v3 (DeepseekV2Config's defaults; its device-limited routing changes no
               cost: a token's k (token, expert) pairs move as k whatever their devices)
    glm4_moe   as deepseek_v3 (n_routed_experts, n_shared_experts, first_k_dense_replace: default 1)
               with grouped-query attention (biases on q, k, v; use_qk_norm switches the heads' norms)
    llama4_text  num_local_experts, num_experts_per_tok (top-k by sigmoid scores, not renormalised);
               the routed experts and one ungated shared expert are intermediate_size wide, the dense
               MLP intermediate_size_mlp (DecoderConfig.intermediate_size); every layer MoE
               (interleave_moe_layer_step 1); its query and key L2 norms have no weights

Their sliding windows are read as every model type's are (llm_planner.graph.attention_window).

The planner's layers are identical, so a config whose MoE layers are interleaved with dense ones
(decoder_sparse_step > 1, mlp_only_layers not empty) is refused naming the key, as is every
config carrying experts or compressed attention under a model_type that has none
(`refuse_foreign_keys`: a Mixtral config relabelled `mistral` is refused, never planned as
Mistral-7B), and the model_types of `UNPLANNED`, each with its reason (Llama 4's multimodal
wrapper `llama4`: its text_config, model_type llama4_text, is what is planned).
"""

from __future__ import annotations

from typing import Any

from llm_planner.graph.ir import GraphError
from llm_planner.graph.mla import DENSE_FIRST_TYPES

MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "llama4_text", "glm4_moe")
# model_types whose shared expert's output is scaled by a sigmoid gate, Linear(h, 1)
GATED_SHARED = ("qwen2_moe",)
# model_types people serve whose layout the planner does not model yet: why, naming the key
UNPLANNED = {
    "gpt_oss": "attention sinks, alternating sliding windows and biased experts are not modelled yet",
    "llama4": "a multimodal checkpoint (a vision encoder beside the decoder), whose vision encoder is not "
    "planned: plan the decoder from the config's text_config saved as a config.json (model_type llama4_text); "
    "the plan then holds no vision weights, so serve it for text alone",
}
# Keys that carry experts or compressed attention: refused under a model_type that has none.
FOREIGN_KEYS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "q_lora_rank",
    "kv_lora_rank",
)
# The transformers classes' defaults where a config.json leaves a key out.
_DEFAULTS = {
    "mixtral": dict(num_experts=8, experts_per_token=2),
    "qwen2_moe": dict(num_experts=60, experts_per_token=4, moe_intermediate_size=1408, shared_expert_size=5632),
    "qwen3_moe": dict(num_experts=128, experts_per_token=8, moe_intermediate_size=768),
    "deepseek_v3": dict(
        num_experts=256,
        experts_per_token=8,
        moe_intermediate_size=2048,
        shared_experts=1,
        first_dense=3,
        norm_topk=True,
    ),
    # DeepseekV2Config leaves num_experts_per_tok unset: a config must state it
    "deepseek_v2": dict(num_experts=64, moe_intermediate_size=1407, shared_experts=2, first_dense=0, norm_topk=False),
    "glm4_moe": dict(
        num_experts=128,
        experts_per_token=8,
        moe_intermediate_size=1408,
        shared_experts=1,
        first_dense=1,
        norm_topk=True,
    ),
    "llama4_text": dict(num_experts=16, experts_per_token=1, moe_intermediate_size=8192),
}


def refuse_foreign_keys(data: dict[str, Any], hf_type: str, source: str) -> None:
    """Raise GraphError naming the first key of FOREIGN_KEYS that a config of a model_type without
    experts carries (a value other than null, 0 or an empty list)."""
    if hf_type in MOE_MODEL_TYPES:
        return
    for key in FOREIGN_KEYS:
        if data.get(key) not in (None, 0, []):
            raise GraphError(
                f"{source}: key {key!r}: model_type {hf_type!r} has no experts or compressed attention, but the "
                f"config sets {key}={data[key]!r}; it would be planned as a dense {hf_type} model (set the "
                "model_type the checkpoint was made with)"
            )


def moe_fields(r: Any, hf_type: str) -> dict[str, Any]:
    """The DecoderConfig MoE fields of a config of a MOE_MODEL_TYPES model_type, read with `r`
    (llm_planner.graph.hf_config's typed reader); {} for any other."""
    if hf_type not in MOE_MODEL_TYPES:
        return {}
    d = _DEFAULTS[hf_type]
    if hf_type == "mixtral":
        return dict(
            num_experts=r.get("num_local_experts", int, d["num_experts"]),
            experts_per_token=r.get("num_experts_per_tok", int, d["experts_per_token"]),
            moe_intermediate_size=r.get("intermediate_size", int),
        )
    if hf_type in DENSE_FIRST_TYPES:
        return _deepseek_fields(r, d)
    if hf_type == "llama4_text":
        return _llama4_fields(r, d)
    step = r.get("decoder_sparse_step", int, 1)
    if step != 1:
        raise GraphError(
            f"{r.source}: key 'decoder_sparse_step': {step} puts dense MLP layers between the MoE ones; "
            "the planner's layers are identical, so only 1 (every layer MoE) is planned"
        )
    if r.get("mlp_only_layers", list, []):
        raise GraphError(
            f"{r.source}: key 'mlp_only_layers': dense MLP layers among the MoE ones are not planned "
            "(the planner's layers are identical): only an empty list is"
        )
    experts = r.get("num_experts", int, None)
    out = dict(
        num_experts=experts if experts is not None else r.get("num_local_experts", int, d["num_experts"]),
        experts_per_token=r.get("num_experts_per_tok", int, d["experts_per_token"]),
        moe_intermediate_size=r.get("moe_intermediate_size", int, d["moe_intermediate_size"]),
        norm_topk_prob=r.get("norm_topk_prob", bool, False),
    )
    if hf_type == "qwen2_moe":
        out["shared_expert_size"] = r.get("shared_expert_intermediate_size", int, d["shared_expert_size"])
    return out


def _deepseek_fields(r: Any, d: dict[str, Any]) -> dict[str, Any]:
    """deepseek_v2, deepseek_v3 and glm4_moe: n_routed_experts, num_experts_per_tok, moe_intermediate_size,
    n_shared_experts shared experts of that width (one MLP n_shared wide, no gate), the first
    first_k_dense_replace layers dense; the routing's groups, scaling and score correction change no
    cost."""
    layers = r.get("num_hidden_layers", int)
    dense = min(r.get("first_k_dense_replace", int, d["first_dense"]), layers)
    if dense < 0:
        raise GraphError(f"{r.source}: key 'first_k_dense_replace' must be >= 0, got {dense}")
    if r.get("moe_layer_freq", int, 1) != 1:
        raise GraphError(
            f"{r.source}: key 'moe_layer_freq': dense layers between the MoE ones are not planned; only 1 is"
        )
    width = r.get("moe_intermediate_size", int, d["moe_intermediate_size"])
    if dense == layers:  # every layer dense: no experts, the layers alike
        return {}
    return dict(
        num_experts=r.get("n_routed_experts", int, d["num_experts"]),
        experts_per_token=_top_k(r, d),
        moe_intermediate_size=width,
        shared_expert_size=r.get("n_shared_experts", int, d["shared_experts"]) * width,
        norm_topk_prob=r.get("norm_topk_prob", bool, d["norm_topk"]),
        first_dense_layers=dense,
    )


def _llama4_fields(r: Any, d: dict[str, Any]) -> dict[str, Any]:
    """llama4_text: num_local_experts routed experts and one shared expert, all intermediate_size wide
    (the dense MLP's width, intermediate_size_mlp, is DecoderConfig.intermediate_size), top
    num_experts_per_tok by sigmoid scores (not renormalised). Interleaved dense layers
    (interleave_moe_layer_step > 1, as Llama 4 Maverick's, or moe_layers short of every layer) are
    refused naming the key: the planner's layers are identical."""
    layers = r.get("num_hidden_layers", int)
    step = r.get("interleave_moe_layer_step", int, 1)
    if step != 1:
        raise GraphError(
            f"{r.source}: key 'interleave_moe_layer_step': {step} puts dense MLP layers between the MoE ones; "
            "the planner's layers are identical, so only 1 (every layer MoE) is planned"
        )
    moe_layers = r.get("moe_layers", list, None)
    if moe_layers is not None and any(isinstance(v, bool) or not isinstance(v, int) for v in moe_layers):
        raise GraphError(f"{r.source}: key 'moe_layers' must list layer indices (integers), got {moe_layers!r:.200}")
    if moe_layers is not None and sorted(moe_layers) != list(range(layers)):
        raise GraphError(
            f"{r.source}: key 'moe_layers': dense MLP layers among the MoE ones are not planned (the planner's "
            f"layers are identical): only every layer, 0 to {layers - 1}, is"
        )
    width = r.get("intermediate_size", int, d["moe_intermediate_size"])
    return dict(
        num_experts=r.get("num_local_experts", int, d["num_experts"]),
        experts_per_token=r.get("num_experts_per_tok", int, d["experts_per_token"]),
        moe_intermediate_size=width,
        shared_expert_size=width,
    )


def _top_k(r: Any, d: dict[str, Any]) -> int:
    """num_experts_per_tok, or the class default where the class has one (DeepseekV2Config has none)."""
    if "experts_per_token" in d:
        return r.get("num_experts_per_tok", int, d["experts_per_token"])
    return r.get("num_experts_per_tok", int)


def check_moe(where: str, cfg: Any) -> None:
    """Raise GraphError unless cfg's MoE fields fit its model_type (module docstring)."""
    moe = cfg.hf_model_type in MOE_MODEL_TYPES
    sizes = ("num_experts", "experts_per_token", "moe_intermediate_size", "shared_expert_size")
    for key in sizes:
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GraphError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    if not isinstance(cfg.norm_topk_prob, bool):
        raise GraphError(f"{where}: norm_topk_prob must be true or false, got {cfg.norm_topk_prob!r}")
    if not moe:
        if any(getattr(cfg, key) for key in sizes) or cfg.norm_topk_prob:
            raise GraphError(
                f"{where}: {cfg.hf_model_type} models have no experts (nor norm_topk_prob); "
                "set model_type to an MoE one"
            )
        return
    if cfg.hf_model_type in DENSE_FIRST_TYPES and not any(getattr(cfg, key) for key in sizes):
        return  # every layer dense (llm_planner.graph.mla checks that first_dense_layers is 0 then)
    if cfg.num_experts < 1 or cfg.moe_intermediate_size < 1:
        raise GraphError(f"{where}: {cfg.hf_model_type} needs num_experts and moe_intermediate_size >= 1")
    if not 1 <= cfg.experts_per_token <= cfg.num_experts:
        raise GraphError(
            f"{where}: experts_per_token must be from 1 to num_experts ({cfg.num_experts}), got {cfg.experts_per_token}"
        )
    if cfg.hf_model_type == "qwen2_moe" and cfg.shared_expert_size < 1:
        raise GraphError(f"{where}: qwen2_moe has a shared expert: shared_expert_size must be >= 1")
    if cfg.shared_expert_size > 0 and cfg.hf_model_type not in ("qwen2_moe", "llama4_text", *DENSE_FIRST_TYPES):
        raise GraphError(
            f"{where}: a shared expert (shared_expert_size > 0) is qwen2_moe's, deepseek_v3's, glm4_moe's and "
            "llama4_text's alone"
        )
    if cfg.hf_model_type == "llama4_text" and cfg.shared_expert_size != cfg.moe_intermediate_size:
        raise GraphError(f"{where}: llama4_text has one shared expert as wide as the routed ones")
    if cfg.hf_model_type == "mixtral" and cfg.moe_intermediate_size != cfg.intermediate_size:
        raise GraphError(f"{where}: mixtral's experts are intermediate_size wide: moe_intermediate_size must equal it")


def moe_parameters(cfg: Any) -> dict[str, int]:
    """Linear parameters of one MoE layer's MLP: `router`, `expert` (one routed expert), `experts`
    (all E), `shared` (the shared expert and its gate; 0 without), `active` (what one token
    multiplies: router, top-k experts, shared)."""
    h, m = cfg.hidden_size, cfg.moe_intermediate_size
    router, expert = h * cfg.num_experts, 3 * h * m
    shared = 3 * h * cfg.shared_expert_size + (h if shared_gate(cfg) else 0)
    return {
        "router": router,
        "expert": expert,
        "experts": cfg.num_experts * expert,
        "shared": shared,
        "active": router + cfg.experts_per_token * expert + shared,
    }


def shared_gate(cfg: Any) -> bool:
    """Whether the shared expert's output passes a sigmoid gate, Linear(h, 1) (qwen2_moe)."""
    return cfg.shared_expert_size > 0 and cfg.hf_model_type in GATED_SHARED


def experts_touched(num_experts: int, top_k: int, tokens: float, picks: tuple[float, ...] | None = None) -> float:
    """Expected distinct experts that `tokens` tokens reach. Uniform routing (`picks` None), each
    token picking top_k of num_experts at random: E (1 - (1 - k / E)^T) (each expert is missed by
    one token with probability 1 - k / E, independently across tokens). A measured router
    (`picks`: for each expert the chance one token reaches it, k s_e for its share s_e of the routed
    rows): sum_e (1 - (1 - q_e)^T), fewer than uniform for any skew with the same k. Concave and
    increasing in T either way; k at T = 1, the experts the router reaches as T grows."""
    if tokens <= 0:
        return 0.0
    if picks is None:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    return sum(1.0 - (1.0 - q) ** tokens for q in picks)
