"""GPT-style decoders (GPT-2/3, OPT, Llama) as configurations: presets, transformers
config files and objects, and their exact parameter counts. No torch needed.

Parameter counts are exact for the transformers classes GPT2LMHeadModel,
OPTForCausalLM, LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (tests
compare with the real models). llm_planner.graph.decoder_graph turns a configuration
into a task graph with analytic costs; docs/models.md has the presets and the formulas.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_planner.core.fileio import parse_document, read_text
from llm_planner.core.fmt import quote
from llm_planner.graph.attention_window import check_window_field, hf_window_kwargs, window_fields
from llm_planner.graph.decoder_limits import check_name, check_sizes, check_values
from llm_planner.graph.ir import GraphError
from llm_planner.graph.moe import UNPLANNED, check_moe, moe_fields, moe_parameters, refuse_foreign_keys

log = logging.getLogger(__name__)

FAMILIES = ("gpt2", "opt", "llama")
# transformers model_type -> architecture family it shares its layout with
HF_MODEL_TYPES = {
    "gpt2": "gpt2",
    "opt": "opt",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "mixtral": "llama",
    "qwen2_moe": "llama",
    "qwen3_moe": "llama",
}
# Structural flags that a transformers class fixes (None = free, read from the config).
_FIXED: dict[str, dict[str, Any]] = {
    "gpt2": dict(
        qkv_bias=True, out_bias=True, mlp_bias=True, norm_affine=True, pre_norm=True, final_norm=True, rope_theta=0.0
    ),
    "opt": dict(norm_eps=1e-5, rope_theta=0.0),
    "llama": dict(norm_affine=True, pre_norm=True, final_norm=True),
    "mistral": dict(qkv_bias=False, out_bias=False, mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
    "qwen2": dict(qkv_bias=True, out_bias=False, mlp_bias=False, norm_affine=True, pre_norm=True, final_norm=True),
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
    qk_norm: bool | None = None  # RMSNorm of each query and key head (qwen3_moe); None: the type's
    # MoE routing: the top-k weights divided by their sum (mixtral: always; qwen*_moe: the config's
    # norm_topk_prob, default false; dense: false). Changes no cost, only what the runtime computes.
    norm_topk_prob: bool | None = None
    # Tokens a sliding-window layer attends to, every layer alike (llm_planner.graph.attention_window);
    # None: full attention over the whole context. Planned only for contexts that fit inside it.
    sliding_window: int | None = None

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
            "qk_norm": hf_type == "qwen3_moe",
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
        if self.qk_norm != (self.hf_model_type == "qwen3_moe"):
            raise GraphError(f"{where}: qk_norm is {self.hf_model_type == 'qwen3_moe'} for {self.hf_model_type} models")
        shared = {
            "opt": ("qkv_bias", "out_bias", "mlp_bias"),
            "llama": ("qkv_bias", "out_bias"),
            "qwen3_moe": ("qkv_bias", "out_bias"),
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
        return self.num_experts > 0  # every layer's MLP is a mixture of experts (llm_planner.graph.moe)

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


def _moe(name: str, hf_type: str, layers: int, hidden: int, heads: int, kv_heads: int, **kw: Any) -> DecoderConfig:
    return DecoderConfig(
        name=name,
        model_type="llama",
        hf_model_type=hf_type,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        tie_word_embeddings=False,
        rope_theta=1e6,
        **kw,
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
        _moe(
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
        _moe(
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
        _moe(
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
                f"{c.hf_model_type if c.is_moe else c.model_type} decoder, {c.num_layers} layers, "
                f"hidden {c.hidden_size}, {heads}, "
                f"{count_parameters(c) / 1e9:.3g}B params, context {c.max_positions}",
            )
        )
    return out


def is_preset(name: str) -> bool:
    return name in _PRESETS


def preset_config(name: str) -> DecoderConfig:
    if name not in _PRESETS:
        raise GraphError(f"unknown decoder preset {name!r} (presets: {', '.join(_PRESETS)})")
    return _PRESETS[name]


# -- transformers configs ----------------------------------------------------------

_REQUIRED = object()


class _Reader:
    """Typed access to a config dict; every error names the source and the key."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data, self.source = data, source

    def get(self, key: str, kind: type, default: Any = _REQUIRED) -> Any:
        value = self.data.get(key)
        if value is None and default is _REQUIRED:
            raise GraphError(f"{self.source}: missing key {key!r}")
        if value is None:
            return default
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, (int, float) if kind is float else kind):
            raise GraphError(f"{self.source}: key {key!r} must be {kind.__name__}, got {quote(value)}")
        return float(value) if kind is float else value


def config_from_dict(data: Any, source: str, name: str | None = None) -> DecoderConfig:
    """A transformers config dict (config.json or PretrainedConfig.to_dict()) -> DecoderConfig."""
    if not isinstance(data, dict):
        raise GraphError(f"{source}: expected a JSON object at the top level, got {type(data).__name__}")
    r = _Reader(data, source)
    hf_type = r.get("model_type", str)
    if hf_type in UNPLANNED:
        raise GraphError(f"{source}: key 'model_type': {quote(hf_type)} is not planned: {UNPLANNED[hf_type]}")
    if hf_type not in HF_MODEL_TYPES:
        raise GraphError(
            f"{source}: key 'model_type': unsupported {quote(hf_type)} (supported: {', '.join(HF_MODEL_TYPES)})"
        )
    refuse_foreign_keys(data, hf_type, source)
    name = name or r.get("_name_or_path", str, "") or hf_type
    family = HF_MODEL_TYPES[hf_type]
    if family == "gpt2":
        hidden, heads = r.get("n_embd", int), r.get("n_head", int)
        kw = dict(
            num_layers=r.get("n_layer", int),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=heads,
            intermediate_size=r.get("n_inner", int, 4 * hidden),
            max_positions=r.get("n_positions", int),
            activation=r.get("activation_function", str, "gelu_new"),
            norm_eps=r.get("layer_norm_epsilon", float, 1e-5),
            tie_word_embeddings=r.get("tie_word_embeddings", bool, True),
        )
    else:
        hidden, heads = r.get("hidden_size", int), r.get("num_attention_heads", int)
        kw = dict(
            num_layers=r.get("num_hidden_layers", int),
            hidden_size=hidden,
            num_heads=heads,
            max_positions=r.get("max_position_embeddings", int),
        )
        kw.update(_opt_fields(r, heads) if family == "opt" else _llama_fields(r, hf_type, heads))
    try:
        return DecoderConfig(
            name=name, model_type=family, hf_model_type=hf_type, vocab_size=r.get("vocab_size", int), **kw
        )
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None


def _opt_fields(r: _Reader, heads: int) -> dict[str, Any]:
    pre_norm = r.get("do_layer_norm_before", bool, True)
    bias = r.get("enable_bias", bool, True)
    return dict(
        num_kv_heads=heads,
        intermediate_size=r.get("ffn_dim", int),
        word_embed_dim=r.get("word_embed_proj_dim", int, None),
        pre_norm=pre_norm,
        final_norm=pre_norm and not r.get("_remove_final_layer_norm", bool, False),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=bias,
        norm_affine=r.get("layer_norm_elementwise_affine", bool, True),
        activation=r.get("activation_function", str, "relu"),
        tie_word_embeddings=r.get("tie_word_embeddings", bool, True),
    )


def _llama_fields(r: _Reader, hf_type: str, heads: int) -> dict[str, Any]:
    kv_default = {"llama": heads, "mistral": 8, "qwen2": 32, "mixtral": 8, "qwen2_moe": 16, "qwen3_moe": 4}[
        hf_type
    ]  # the transformers class defaults
    rope = _Reader(r.get("rope_parameters", dict, {}), f"{r.source}: rope_parameters")
    theta = rope.get("rope_theta", float, r.get("rope_theta", float, 10000.0))
    if rope.get("rope_type", str, "default") != "default":
        log.info("%s: rope_type %r is not kept (it changes no shape or cost)", r.source, rope.data["rope_type"])
    kw: dict[str, Any] = dict(
        num_kv_heads=r.get("num_key_value_heads", int, kv_default),
        intermediate_size=r.get("intermediate_size", int),
        head_dim=r.get("head_dim", int, None),
        activation=r.get("hidden_act", str, "silu"),
        norm_eps=r.get("rms_norm_eps", float, 1e-6),
        rope_theta=theta,
        tie_word_embeddings=r.get("tie_word_embeddings", bool, False),
    )
    if hf_type == "llama":
        bias = r.get("attention_bias", bool, False)
        kw.update(qkv_bias=bias, out_bias=bias, mlp_bias=r.get("mlp_bias", bool, False))
    elif hf_type == "qwen3_moe":
        bias = r.get("attention_bias", bool, False)
        kw.update(qkv_bias=bias, out_bias=bias)
    elif hf_type == "qwen2_moe":
        kw.update(qkv_bias=r.get("qkv_bias", bool, True))
    return {**kw, **moe_fields(r, hf_type), **window_fields(r, hf_type, r.get("num_hidden_layers", int))}


def named_config(name: str) -> DecoderConfig | None:
    """The decoder a model name means: a config.json, a directory holding one, or a preset; None
    when it is none of them."""
    path = config_file_of(name)
    if path is not None:
        return load_config_file(path)
    return preset_config(name) if is_preset(name) else None


def config_file_of(name: str) -> Path | None:
    """The config.json a model name names (a .json file, or a directory holding config.json); None for
    a name that names no file (a preset's)."""
    path = Path(name)
    try:
        if path.is_dir():
            return path / "config.json"
    except (OSError, ValueError):  # a name too long for a path, or not one at all
        return None
    return path if path.suffix == ".json" else None


def model_source(name: str) -> str:
    """What messages call the model a name means: its config.json's path, or the name (a preset's)."""
    path = config_file_of(name)
    return str(path) if path is not None else f"model {name!r}"


def load_config_file(path: Path) -> DecoderConfig:
    """Read a transformers config.json (gpt2, opt, llama, mistral, qwen2) without importing transformers."""
    path = Path(path)
    data = parse_document(read_text(path, GraphError), str(path), GraphError, as_json=True, finite=True)
    default_name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    name = data.get("_name_or_path") if isinstance(data, dict) else None
    return config_from_dict(data, str(path), name=name if isinstance(name, str) and name else default_name)


def from_hf_config(config: Any, name: str | None = None) -> DecoderConfig:
    """Any transformers PretrainedConfig of a supported model_type -> DecoderConfig."""
    source = f"transformers {type(config).__name__}"
    return config_from_dict(config.to_dict(), source, name=name or getattr(config, "name_or_path", "") or None)


def to_hf_config(cfg: DecoderConfig) -> Any:
    """The transformers config (GPT2Config, OPTConfig, LlamaConfig, MistralConfig, Qwen2Config) of cfg."""
    import transformers  # lazy: the rest of this module needs no torch

    common = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_word_embeddings)
    if cfg.model_type == "gpt2":
        hf = transformers.GPT2Config(
            n_positions=cfg.max_positions,
            n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers,
            n_head=cfg.num_heads,
            n_inner=cfg.intermediate_size,
            activation_function=cfg.activation,
            layer_norm_epsilon=cfg.norm_eps,
            **common,
        )
    elif cfg.model_type == "opt":
        hf = transformers.OPTConfig(
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers,
            ffn_dim=cfg.intermediate_size,
            max_position_embeddings=cfg.max_positions,
            do_layer_norm_before=cfg.pre_norm,
            _remove_final_layer_norm=cfg.pre_norm and not cfg.final_norm,
            word_embed_proj_dim=cfg.word_embed_dim,
            num_attention_heads=cfg.num_heads,
            activation_function=cfg.activation,
            enable_bias=cfg.qkv_bias,
            layer_norm_elementwise_affine=cfg.norm_affine,
            **common,
        )
    else:
        classes = {
            "llama": transformers.LlamaConfig,
            "mistral": transformers.MistralConfig,
            "qwen2": transformers.Qwen2Config,
            "mixtral": transformers.MixtralConfig,
            "qwen2_moe": transformers.Qwen2MoeConfig,
            "qwen3_moe": transformers.Qwen3MoeConfig,
        }
        extra = _hf_extra(cfg)
        hf = classes[cfg.hf_model_type](
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            hidden_act=cfg.activation,
            max_position_embeddings=cfg.max_positions,
            rms_norm_eps=cfg.norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
            **hf_window_kwargs(cfg),
            **extra,
            **common,
        )
    back = from_hf_config(hf, name=cfg.name)
    diff = [f.name for f in dataclasses.fields(cfg) if getattr(back, f.name) != getattr(cfg, f.name)]
    assert not diff, f"to_hf_config lost fields {diff} of {cfg.name!r}"
    return hf


def _hf_extra(cfg: DecoderConfig) -> dict[str, Any]:
    """The keyword arguments of a llama-family transformers config beyond the shared ones."""
    moe = dict(num_experts_per_tok=cfg.experts_per_token)
    if cfg.hf_model_type == "llama":
        return dict(attention_bias=cfg.qkv_bias, mlp_bias=cfg.mlp_bias)
    if cfg.hf_model_type == "mixtral":
        return dict(num_local_experts=cfg.num_experts, **moe)
    if cfg.hf_model_type in ("qwen2_moe", "qwen3_moe"):
        moe.update(
            num_experts=cfg.num_experts,
            moe_intermediate_size=cfg.moe_intermediate_size,
            norm_topk_prob=cfg.norm_topk_prob,
        )
        if cfg.hf_model_type == "qwen2_moe":
            return dict(shared_expert_intermediate_size=cfg.shared_expert_size, **moe)
        return dict(attention_bias=cfg.qkv_bias, **moe)
    return {}


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
        "attn": h * a * 2 + h * kv * 2,
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
    return count_parameters(cfg) - cfg.num_layers * unused


def count_parameters(cfg: DecoderConfig) -> int:
    """Exact parameter count of the transformers CausalLM model; a tied lm_head counts once."""
    p = part_parameters(cfg)
    head = 0 if cfg.tie_word_embeddings else p["lm_head"]
    return p["embed"] + cfg.num_layers * (p["attn"] + p["mlp"]) + p["final_norm"] + head
