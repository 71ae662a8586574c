"""The limits and value rules of a decoder configuration (a preset, a config.json, a transformers
config), checked when the configuration is made, before any graph is built.

The sizes are far above every published model (Llama 3 405B: 126 layers, hidden 16,384, MLP
53,248, vocabulary 128,256; GPT-3: 96 layers, hidden 12,288) and low enough that a model at the
limits is built or refused in seconds (docs/inputs.md has the measured times). The value rules:
norm epsilons finite and in (0, 1]; the rotary base of the llama family finite and positive;
the activation one that transformers knows (the runtime builds it with transformers' ACT2FN).
"""

from __future__ import annotations

import math
from typing import Any

from llm_planner.core.fmt import quote
from llm_planner.graph.ir import GraphError

MAX_NAME_CHARS = 256
MAX_SIZES = {
    "num_layers": 1_024,
    "hidden_size": 131_072,
    "num_heads": 4_096,
    "num_kv_heads": 4_096,
    "intermediate_size": 524_288,
    "vocab_size": 4_194_304,
    "max_positions": 16_777_216,
    "head_dim": 16_384,
    "word_embed_dim": 131_072,
    "num_experts": 4_096,
    "moe_intermediate_size": 524_288,
    "shared_expert_size": 524_288,
    "kv_lora_rank": 131_072,
    "q_lora_rank": 131_072,
    "qk_rope_head_dim": 16_384,
    "qk_nope_head_dim": 16_384,
    "v_head_dim": 16_384,
}
# transformers.activations.ACT2CLS (transformers 4.4x-5.x); the runtime looks the name up there
ACTIVATIONS = frozenset(
    (
        "gelu gelu_10 gelu_accurate gelu_fast gelu_new gelu_python gelu_python_tanh gelu_pytorch_tanh hardswish "
        "laplace leaky_relu linear mish prelu quick_gelu relu relu2 relu6 sigmoid silu sqrtsoftplus swish tanh xielu"
    ).split()
)


def check_name(where: str, name: Any) -> None:
    """A model name: a string of at most MAX_NAME_CHARS characters, with no control characters."""
    if not isinstance(name, str):
        raise GraphError(f"{where}: name must be a string, got {quote(name)}")
    if len(name) > MAX_NAME_CHARS:
        raise GraphError(
            f"{where}: name {quote(name)} is longer than {MAX_NAME_CHARS} characters ({len(name):,}), the limit"
        )
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name):
        raise GraphError(f"{where}: name {quote(name)} holds a control character")


def check_sizes(where: str, cfg: Any) -> None:
    """Every size of cfg at most its limit in MAX_SIZES (positivity is checked by the caller)."""
    for key, limit in MAX_SIZES.items():
        value = getattr(cfg, key)
        if isinstance(value, int) and value > limit:
            raise GraphError(f"{where}: {key} {value:,} is above the limit of {limit:,} (docs/inputs.md)")


def check_values(where: str, cfg: Any) -> None:
    """The norm epsilon, the rotary base and the activation (the module docstring's rules)."""
    eps = cfg.norm_eps
    if not (_number(eps) and 0 < eps <= 1):
        raise GraphError(f"{where}: norm_eps must be a finite number in (0, 1], got {quote(eps)}")
    theta = cfg.rope_theta
    if not _number(theta) or theta < 0 or (cfg.model_type == "llama" and theta == 0):
        want = "a finite number above 0" if cfg.model_type == "llama" else "0 (learned positions)"
        raise GraphError(f"{where}: rope_theta must be {want}, got {quote(theta)}")
    if cfg.activation not in ACTIVATIONS:
        raise GraphError(
            f"{where}: activation {quote(cfg.activation)} is not one transformers knows "
            f"(known: {', '.join(sorted(ACTIVATIONS))})"
        )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
