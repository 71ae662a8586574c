"""transformers configs to DecoderConfig and back: config.json files, config dicts and
PretrainedConfig objects, read without importing transformers where a file is enough; a model
name resolved to a config file or a preset."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from llm_planner.core.fileio import parse_document, read_text
from llm_planner.core.fmt import quote
from llm_planner.graph.attention_window import hf_window_kwargs, window_fields
from llm_planner.graph.decoder_presets import is_preset, preset_config
from llm_planner.graph.ir import GraphError
from llm_planner.graph.mla import MLA_MODEL_TYPES
from llm_planner.graph.moe import UNPLANNED, moe_fields, refuse_foreign_keys
from llm_planner.graph.transformer import HF_MODEL_TYPES, DecoderConfig

log = logging.getLogger(__name__)


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
    hf_type = _architecture_type(r)
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


# model_types whose config.json names a transformers architecture of another type, read as that type:
# Kimi K2 (moonshotai/Kimi-K2-*: model_type kimi_k2) ships DeepseekV3ForCausalLM, DeepSeek-V3's layers
ARCHITECTURE_OF = {"kimi_k2": ("DeepseekV3ForCausalLM", "deepseek_v3")}


def _architecture_type(r: _Reader) -> str:
    """The config's model_type, or for one of ARCHITECTURE_OF the type whose architecture it names
    (GraphError naming the key when it names another)."""
    hf_type = r.get("model_type", str)
    if hf_type not in ARCHITECTURE_OF:
        return hf_type
    architecture, planned_as = ARCHITECTURE_OF[hf_type]
    named = r.get("architectures", list, [])
    if architecture not in named:
        raise GraphError(
            f"{r.source}: key 'architectures': model_type {quote(hf_type)} is planned as {planned_as} when its "
            f"architecture is {architecture}, got {named!r}"
        )
    return planned_as


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
    kv_default = {
        "llama": heads,
        "mistral": 8,
        "qwen2": 32,
        "qwen3": 32,
        "mixtral": 8,
        "qwen2_moe": 16,
        "qwen3_moe": 4,
        "phi3": heads,
        "deepseek_v3": heads,
        "deepseek_v2": heads,
        "llama4_text": 8,
        "glm4_moe": 8,
    }[hf_type]  # the transformers class defaults (Qwen3Config's and Llama4TextConfig's head_dim too: 128)
    rope = _Reader(r.get("rope_parameters", dict, {}), f"{r.source}: rope_parameters")
    theta = rope.get("rope_theta", float, r.get("rope_theta", float, 10000.0))
    if rope.get("rope_type", str, "default") != "default":
        log.info("%s: rope_type %r is not kept (it changes no shape or cost)", r.source, rope.data["rope_type"])
    kw: dict[str, Any] = dict(
        num_kv_heads=r.get("num_key_value_heads", int, kv_default),
        intermediate_size=r.get("intermediate_size", int),
        head_dim=r.get("head_dim", int, 128 if hf_type in ("qwen3", "llama4_text") else None),
        activation=r.get("hidden_act", str, "silu"),
        norm_eps=r.get(
            "rms_norm_eps", float, 1e-5 if hf_type in ("phi3", "mixtral", "llama4_text", "glm4_moe") else 1e-6
        ),
        rope_theta=theta,
        tie_word_embeddings=r.get("tie_word_embeddings", bool, False),
    )
    if hf_type == "llama":
        bias = r.get("attention_bias", bool, False)
        kw.update(qkv_bias=bias, out_bias=bias, mlp_bias=r.get("mlp_bias", bool, False))
    elif hf_type in ("qwen3", "qwen3_moe"):
        bias = r.get("attention_bias", bool, False)
        kw.update(qkv_bias=bias, out_bias=bias)
    elif hf_type == "glm4_moe":  # its partial rotary embedding changes no shape (its cost: whole heads here)
        kw.update(qkv_bias=r.get("attention_bias", bool, False), qk_norm=r.get("use_qk_norm", bool, False))
    elif hf_type == "llama4_text":  # intermediate_size is the experts' width (llm_planner.graph.moe)
        bias = r.get("attention_bias", bool, False)
        kw.update(qkv_bias=bias, out_bias=bias, intermediate_size=r.get("intermediate_size_mlp", int, 16384))
    elif hf_type == "qwen2_moe":
        kw.update(qkv_bias=r.get("qkv_bias", bool, True))
    elif hf_type in MLA_MODEL_TYPES:
        kw.update(_mla_fields(r))
    return {**kw, **moe_fields(r, hf_type), **window_fields(r, hf_type, r.get("num_hidden_layers", int))}


def _mla_fields(r: _Reader) -> dict[str, Any]:
    """deepseek_v3's latent attention (llm_planner.graph.mla), DeepseekV3Config's defaults where a key
    is left out; q_lora_rank null: a plain q projection."""
    rope, nope = r.get("qk_rope_head_dim", int, 64), r.get("qk_nope_head_dim", int, 128)
    bias = r.get("attention_bias", bool, False)
    q_rank = r.get("q_lora_rank", int, None) if "q_lora_rank" in r.data else 1536
    return dict(
        head_dim=rope + nope,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        v_head_dim=r.get("v_head_dim", int, 128),
        kv_lora_rank=r.get("kv_lora_rank", int, 512),
        q_lora_rank=q_rank or 0,
        qkv_bias=bias,
        out_bias=bias,
    )


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
    """Read a transformers config.json (any model_type of HF_MODEL_TYPES) without importing transformers."""
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
    """The transformers config (GPT2Config, OPTConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config,
    and the MoE types') of cfg."""
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
            "qwen3": transformers.Qwen3Config,
            "phi3": transformers.Phi3Config,
            "mixtral": transformers.MixtralConfig,
            "qwen2_moe": transformers.Qwen2MoeConfig,
            "qwen3_moe": transformers.Qwen3MoeConfig,
            "deepseek_v3": transformers.DeepseekV3Config,
            "deepseek_v2": transformers.DeepseekV2Config,
            "llama4_text": transformers.Llama4TextConfig,
            "glm4_moe": transformers.Glm4MoeConfig,
        }
        shared = dict(
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
        )
        hf = classes[cfg.hf_model_type](**shared | hf_window_kwargs(cfg) | _hf_extra(cfg) | common)
    back = from_hf_config(hf, name=cfg.name)
    diff = [f.name for f in dataclasses.fields(cfg) if getattr(back, f.name) != getattr(cfg, f.name)]
    assert not diff, f"to_hf_config lost fields {diff} of {cfg.name!r}"
    return hf


def _hf_extra(cfg: DecoderConfig) -> dict[str, Any]:
    """The keyword arguments of a llama-family transformers config beyond the shared ones."""
    moe = dict(num_experts_per_tok=cfg.experts_per_token)
    if cfg.hf_model_type == "llama":
        return dict(attention_bias=cfg.qkv_bias, mlp_bias=cfg.mlp_bias)
    if cfg.hf_model_type == "qwen3":
        return dict(attention_bias=cfg.qkv_bias)
    if cfg.hf_model_type == "phi3":  # Phi3Config's pad id 32000 would not fit a smaller vocabulary; it has no cost
        return dict(pad_token_id=None)
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
    if cfg.hf_model_type in MLA_MODEL_TYPES:
        return _deepseek_extra(cfg)
    if cfg.hf_model_type == "glm4_moe":
        return _glm_extra(cfg)
    if cfg.hf_model_type == "llama4_text":
        return dict(
            attention_bias=cfg.qkv_bias,
            num_local_experts=cfg.num_experts,
            intermediate_size=cfg.moe_intermediate_size,
            intermediate_size_mlp=cfg.intermediate_size,
            interleave_moe_layer_step=1,
            **moe,
        )
    return {}


def _routed_extra(cfg: DecoderConfig) -> dict[str, Any]:
    """The keyword arguments DeepSeek's and GLM-4.5's configs share: routed and shared experts, dense
    first layers (every layer dense: the experts' keys carry no weight)."""
    width = cfg.moe_intermediate_size or 1
    return dict(
        attention_bias=cfg.qkv_bias,
        n_routed_experts=cfg.num_experts or 1,
        num_experts_per_tok=cfg.experts_per_token or 1,
        moe_intermediate_size=width,
        n_shared_experts=cfg.shared_expert_size // width,
        norm_topk_prob=cfg.norm_topk_prob,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=cfg.first_dense_layers if cfg.is_moe else cfg.num_layers,
    )


def _glm_extra(cfg: DecoderConfig) -> dict[str, Any]:
    """Glm4MoeConfig's keyword arguments beyond the shared ones (its experts, dense layers, norms)."""
    return dict(_routed_extra(cfg), use_qk_norm=cfg.qk_norm)


def _deepseek_extra(cfg: DecoderConfig) -> dict[str, Any]:
    """DeepseekV2Config's and DeepseekV3Config's keyword arguments beyond the shared ones (its experts,
    latents, dense layers)."""
    return dict(
        _routed_extra(cfg),
        kv_lora_rank=cfg.kv_lora_rank,
        q_lora_rank=cfg.q_lora_rank or None,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        qk_nope_head_dim=cfg.qk_nope_head_dim,
        v_head_dim=cfg.v_head_dim,
        head_dim=cfg.qk_rope_head_dim,
    )
