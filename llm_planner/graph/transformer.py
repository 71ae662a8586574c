"""GPT-style decoders (GPT-2/3, OPT, Llama) as configurations (DecoderConfig) and their exact
parameter counts. No torch needed. The presets are in llm_planner.graph.decoder_presets, reading
and writing transformers configs in llm_planner.graph.hf_config.

Parameter counts are exact for the transformers classes GPT2LMHeadModel,
OPTForCausalLM, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and
Phi3ForCausalLM (tests
compare with the real models). llm_planner.graph.decoder_graph turns a configuration
into a task graph with analytic costs; docs/models.md has the presets and the formulas.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from llm_planner.core.fmt import quote
from llm_planner.graph.attention_window import check_window_field
from llm_planner.graph.decoder_limits import check_name, check_sizes, check_values
from llm_planner.graph.ir import GraphError
from llm_planner.graph.mla import check_mla, mla_attention_parameters
from llm_planner.graph.moe import check_moe, moe_parameters

log = logging.getLogger(__name__)

FAMILIES = ("gpt2", "opt", "llama")
# transformers model_type -> architecture family it shares its layout with
HF_MODEL_TYPES = {
    "gpt2": "gpt2",
    "opt": "opt",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "phi3": "llama",
    "mixtral": "llama",
    "qwen2_moe": "llama",
    "qwen3_moe": "llama",
    "deepseek_v2": "llama",
    "deepseek_v3": "llama",
    "llama4_text": "llama",
    "glm4_moe": "llama",
}
# transformers model_types whose attention norms each query and key head (q_norm, k_norm: RMSNorm
# over head_dim) before the rotary embedding
QK_NORM_TYPES = ("qwen3", "qwen3_moe")
QK_NORM_FREE = ("glm4_moe",)  # types whose config switches those norms (use_qk_norm; default off)
# Structural flags that a transformers class fixes (None = free, read from the config).
_FIXED: dict[str, dict[str, Any]] = {
    "gpt2": dict(
        qkv_bias=True, out_bias=True, mlp_bias=True, norm_affine=True, pre_norm=True, final_norm=True, rope_theta=0.0
    ),
    "opt": dict(norm_eps=1e-5, rope_theta=0.0),
    "llama": dict(norm_affine=True, pre_norm=True, final_norm=True),
    "mistral": dict(qkv_bias=False, out_bias=False, mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
    "qwen2": dict(qkv_bias=True, out_bias=False, mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
    "qwen3": dict(mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
    # phi3: llama's layout with q, k and v in one Linear and gate and up in another (the same weights)
    "phi3": dict(qkv_bias=False, out_bias=False, mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
    "mixtral": dict(
        qkv_bias=False,
        out_bias=False,
        mlp_bias=False,
        norm_affine=True,
        pre_norm=True,
        final_norm=True,
        norm_topk_prob=True,  # MixtralSparseMoeBlock always divides the top-k weights by their sum
    ),
    "qwen2_moe": dict(qkv_bias=True, out_bias=False, mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
    "qwen3_moe": dict(mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
    # deepseek_v3: multi-head latent attention (MLA) and a dense MLP in the first layers
    "deepseek_v3": dict(mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
    "deepseek_v2": dict(mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
    # llama4_text: Llama 4's decoder; its top-1 router's sigmoid scores are not renormalised
    "llama4_text": dict(mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True, norm_topk_prob=False),
    # glm4_moe: GLM-4.5's layers: biases on q, k and v only, a dense MLP in the first layers
    "glm4_moe": dict(out_bias=False, mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
}
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": dict(activation="gelu_new", norm_eps=1e-5),
    "opt": dict(
        activation="relu", qkv_bias=True, out_bias=True, mlp_bias=True, norm_affine=True, pre_norm=True, final_norm=True
    ),
    "llama": dict(activation="silu", norm_eps=1e-6, rope_theta=10000.0, qkv_bias=False, out_bias=False, mlp_bias=False),
}

# DecoderConfig fields that change no task's time or memory, left out of a measured time's key
# (llm_planner.cost.measured): the name, the routing weights' normalisation, and the window (planned
# only where it holds the whole context, and there attention is full attention).
COSTLESS_FIELDS = ("name", "norm_topk_prob", "sliding_window")


@dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    name: str
    model_type: str  # architecture family: "gpt2" | "opt" | "llama"
    num_layers: int  # decoder blocks
    hidden_size: int  # residual stream width h
    num_heads: int  # query heads nh
    num_kv_heads: int  # key/value heads nkv (< nh: grouped-query attention); gpt2/opt: = nh
    intermediate_size: int  # MLP inner width (gpt2: n_inner or 4h; opt: ffn_dim)
    vocab_size: int  # V
    max_positions: int  # longest sequence (learned position table size for gpt2/opt)
    tie_word_embeddings: bool  # lm_head shares the token embedding matrix
    head_dim: int | None = None  # per-head width hd; None: hidden_size // num_heads
    word_embed_dim: int | None = None  # token embedding width (OPT word_embed_proj_dim); None: hidden_size
    qkv_bias: bool | None = None  # biases on the q/k/v projections; None: the family's default
    out_bias: bool | None = None  # bias on the attention output projection
    mlp_bias: bool | None = None  # biases on the MLP projections
    norm_affine: bool | None = None  # norms have learned scale (and LayerNorm shift); OPT may turn off
    pre_norm: bool | None = None  # norm before each sublayer (OPT-350m: False, norm after the residual)
    final_norm: bool | None = None  # a norm after the last block (OPT: do_layer_norm_before and not removed)
    activation: str | None = None  # MLP activation name as transformers spells it
    norm_eps: float | None = None  # epsilon of the norms
    rope_theta: float | None = None  # rotary base (llama family); 0.0 for learned positions
    hf_model_type: str | None = None  # transformers model_type to_hf_config builds; None: model_type
    # Mixture of experts (llm_planner.graph.moe; every layer MoE, 0 for a dense model): routed experts
    # per layer, experts each token goes to (top-k), a routed expert's MLP width (mixtral: =
    # intermediate_size; qwen*_moe: moe_intermediate_size, intermediate_size then unused), the shared
    # expert's width (qwen2_moe shared_expert_intermediate_size)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_size: int = 0
    # RMSNorm of each query and key head (qwen3, qwen3_moe; glm4_moe's switch); None: the type's
    qk_norm: bool | None = None
    # MoE routing: the top-k weights divided by their sum (mixtral: always; qwen*_moe: the config's
    # norm_topk_prob, default false; dense: false). Changes no cost, only what the runtime computes.
    norm_topk_prob: bool | None = None
    # Tokens a sliding-window layer attends to, every layer alike (llm_planner.graph.attention_window);
    # None: full attention over the whole context. Planned only for contexts that fit inside it.
    sliding_window: int | None = None
    # Multi-head latent attention (deepseek_v3; llm_planner.graph.mla): the KV latent's rank (0: not
    # MLA), the query latent's (0: a plain q projection), per head the rope and no-rope query/key
    # widths and the value width. head_dim is then the query/key width (rope + no-rope).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Decoder layers at the start whose MLP is dense (intermediate_size wide) where the rest are MoE
    # (deepseek_v3 first_k_dense_replace); 0: every layer alike.
    first_dense_layers: int = 0

    def __post_init__(self) -> None:
        check_name("decoder config", self.name)
        where = f"decoder config {self.name!r}"
        if self.model_type not in FAMILIES:
            raise GraphError(f"{where}: model_type must be one of {FAMILIES}, got {self.model_type!r}")
        hf_type = self.hf_model_type or self.model_type
        if HF_MODEL_TYPES.get(hf_type) != self.model_type:
            allowed = [k for k, v in HF_MODEL_TYPES.items() if v == self.model_type]
            raise GraphError(
                f"{where}: hf_model_type must be one of {allowed} for model_type {self.model_type!r}, got {hf_type!r}"
            )
        _check_positive(
            where,
            self,
            (
                "num_layers",
                "hidden_size",
                "num_heads",
                "num_kv_heads",
                "intermediate_size",
                "vocab_size",
                "max_positions",
            ),
        )
        object.__setattr__(self, "hf_model_type", hf_type)
        fill = {
            "head_dim": self.hidden_size // self.num_heads,
            "word_embed_dim": self.hidden_size,
            "qk_norm": hf_type in QK_NORM_TYPES,
            "norm_topk_prob": False,
            **_DEFAULTS[self.model_type],
            **_FIXED[hf_type],
        }
        for key, value in fill.items():
            if getattr(self, key) is None:  # unset: the family's default
                object.__setattr__(self, key, value)
        _check_positive(where, self, ("head_dim", "word_embed_dim"))
        check_sizes(where, self)
        check_values(where, self)
        check_moe(where, self)
        check_mla(where, self)
        check_window_field(where, self)
        self._check(where)

    def _check(self, where: str) -> None:
        if self.num_heads % self.num_kv_heads:
            raise GraphError(
                f"{where}: num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.model_type != "llama" and (
            self.num_kv_heads != self.num_heads or self.head_dim * self.num_heads != self.hidden_size
        ):
            raise GraphError(
                f"{where}: {self.model_type} needs num_kv_heads == num_heads and hidden_size == num_heads * head_dim"
            )
        if self.hf_model_type == "llama" and self.hidden_size % self.num_heads:
            raise GraphError(
                f"{where}: llama needs hidden_size ({self.hidden_size}) "
                f"to be a multiple of num_heads ({self.num_heads})"
            )
        if self.model_type != "opt" and self.word_embed_dim != self.hidden_size:
            raise GraphError(f"{where}: word_embed_dim differs from hidden_size, which only opt supports")
        for key, value in _FIXED[self.hf_model_type].items():
            if getattr(self, key) != value:
                raise GraphError(f"{where}: {self.hf_model_type} models have {key}={value}, got {getattr(self, key)!r}")
        if self.hf_model_type in QK_NORM_FREE:
            if not isinstance(self.qk_norm, bool):
                raise GraphError(f"{where}: qk_norm must be true or false, got {self.qk_norm!r}")
        elif self.qk_norm != (self.hf_model_type in QK_NORM_TYPES):
            raise GraphError(
                f"{where}: qk_norm is {self.hf_model_type in QK_NORM_TYPES} for {self.hf_model_type} models"
            )
        shared = {
            "opt": ("qkv_bias", "out_bias", "mlp_bias"),
            "llama": ("qkv_bias", "out_bias"),
            "qwen3": ("qkv_bias", "out_bias"),
            "qwen3_moe": ("qkv_bias", "out_bias"),
            "llama4_text": ("qkv_bias", "out_bias"),
        }.get(self.hf_model_type, ())
        if len({getattr(self, k) for k in shared}) > 1:
            raise GraphError(f"{where}: {self.hf_model_type} has one switch for {'/'.join(shared)}; they must agree")
        if self.model_type == "opt" and self.final_norm and not self.pre_norm:
            raise GraphError(f"{where}: opt has a final norm only with pre_norm=True")

    # Layout facts fixed by the family (no field: no transformers class varies them).
    @property
    def norm(self) -> str:
        return "rmsnorm" if self.model_type == "llama" else "layernorm"

    @property
    def gated_mlp(self) -> bool:
        return self.model_type == "llama"  # SwiGLU: down(act(gate(x)) * up(x))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0  # the MLP of every layer past first_dense_layers is a mixture of experts

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0  # multi-head latent attention (llm_planner.graph.mla)

    def dense_layer(self) -> DecoderConfig:
        """One of the first_dense_layers as a one-layer configuration: the same attention, a dense MLP
        of intermediate_size (what llm_planner.graph.decoder_graph and the serving costs price them by)."""
        return dataclasses.replace(
            self,
            num_layers=1,
            first_dense_layers=0,
            num_experts=0,
            experts_per_token=0,
            moe_intermediate_size=0,
            shared_expert_size=0,
            norm_topk_prob=False,
        )

    def moe_layer(self) -> DecoderConfig:
        """One of the layers past first_dense_layers as a one-layer configuration."""
        return dataclasses.replace(self, num_layers=1, first_dense_layers=0)

    @property
    def learned_positions(self) -> bool:
        return self.model_type != "llama"  # llama family: rotary embeddings, no parameters

    @property
    def position_offset(self) -> int:
        return 2 if self.model_type == "opt" else 0  # OPTLearnedPositionalEmbedding has 2 extra rows


def _check_positive(where: str, cfg: DecoderConfig, keys: tuple[str, ...]) -> None:
    for key in keys:
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GraphError(f"{where}: {key} must be a positive integer, got {quote(value)}")


# -- parameters ------------------------------------------------------------------


def norm_parameters(cfg: DecoderConfig) -> int:
    if not cfg.norm_affine:
        return 0
    return cfg.hidden_size * (2 if cfg.norm == "layernorm" else 1)  # LayerNorm: scale + shift; RMSNorm: scale


def matmul_parameters(cfg: DecoderConfig) -> dict[str, int]:
    """Weights of the linear layers of each part that a token multiplies (what 2 * params * tokens
    FLOPs counts; an MoE layer's router, top-k experts and shared expert: llm_planner.graph.moe)."""
    h, a, kv, dw = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.word_embed_dim
    proj = dw * h if dw != h else 0  # OPT project_in / project_out
    return {
        "embed": proj,
        "attn": mla_attention_parameters(cfg)["linear"] if cfg.is_mla else h * a * 2 + h * kv * 2,
        "mlp": moe_parameters(cfg)["active"] if cfg.is_moe else h * cfg.intermediate_size * (3 if cfg.gated_mlp else 2),
        "final_norm": proj,
        "lm_head": cfg.vocab_size * dw,
    }


def stored_mlp_parameters(cfg: DecoderConfig) -> int:
    """Linear weights one layer's MLP holds: every expert of an MoE layer, the matmul ones of a dense one."""
    if cfg.is_moe:
        p = moe_parameters(cfg)
        return p["router"] + p["experts"] + p["shared"]
    return matmul_parameters(cfg)["mlp"]


def part_parameters(cfg: DecoderConfig) -> dict[str, int]:
    """Exact parameters of embed, one attn sublayer, one mlp sublayer, final_norm and lm_head."""
    h, a, kv, inner = (
        cfg.hidden_size,
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    )
    out = matmul_parameters(cfg)
    out["embed"] += cfg.vocab_size * cfg.word_embed_dim
    if cfg.learned_positions:
        out["embed"] += (cfg.max_positions + cfg.position_offset) * h
    if cfg.is_mla:
        mla = mla_attention_parameters(cfg)
        out["attn"] += norm_parameters(cfg) + mla["norms"] + mla["biases"]
    else:
        out["attn"] += (
            norm_parameters(cfg) + (a + 2 * kv) * cfg.qkv_bias + h * cfg.out_bias + 2 * cfg.head_dim * cfg.qk_norm
        )
    out["mlp"] = (
        stored_mlp_parameters(cfg) + norm_parameters(cfg) + (inner * (2 if cfg.gated_mlp else 1) + h) * cfg.mlp_bias
    )
    out["final_norm"] += norm_parameters(cfg) * cfg.final_norm
    return out


def count_active_parameters(cfg: DecoderConfig) -> int:
    """Parameters one token uses: count_parameters less, per MoE layer, the experts it is not routed to."""
    unused = stored_mlp_parameters(cfg) - matmul_parameters(cfg)["mlp"]
    return count_parameters(cfg) - (cfg.num_layers - cfg.first_dense_layers) * unused


def count_parameters(cfg: DecoderConfig) -> int:
    """Exact parameter count of the transformers CausalLM model; a tied lm_head counts once."""
    p = part_parameters(cfg)
    head = 0 if cfg.tie_word_embeddings else p["lm_head"]
    dense = cfg.first_dense_layers and cfg.first_dense_layers * (part_parameters(cfg.dense_layer())["mlp"] - p["mlp"])
    return p["embed"] + cfg.num_layers * (p["attn"] + p["mlp"]) + dense + p["final_norm"] + head
