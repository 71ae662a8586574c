"""Sliding-window attention: which transformers configs slide a window over the context, how the
window is read, and the one rule by which the planner plans such a model. No torch needed.

A layer with a sliding window of W tokens attends to the last W tokens only, and an engine caps its
KV cache at W tokens. The planner's costs and memory are those of full attention over the whole
context (llm_planner.cost). For a context of at most W tokens both are the same computation: the
window holds every token. So, with C the longest context a plan serves (prompt + output tokens of
its longest request, or the seq_len of a placement plan):

    every layer slides W, C <= W   planned: full attention is what the model computes (logged once)
    every layer slides W, C > W    refused naming the model, the key, W and C (`check_window`):
                                   attention over a capped KV cache is not modelled
    some layers slide, some not    refused when the config is read, naming the key: the planner's
                                   layers are identical

Read from a transformers config.json (`window_fields`) as the transformers 5 classes read it:

    mistral    sliding_window on every layer (a missing key: the class default 4096; null: none)
    mixtral    sliding_window on every layer (missing or null: none)
    phi3       the same (Phi-3-mini-4k-instruct: 2047)
    qwen2      only when use_sliding_window is true (default false): sliding_window (default 4096;
               null: none) on the layers that layer_types calls "sliding_attention", or, without
               layer_types, on the layers i >= max_window_layers (default 28)
    qwen3      as qwen2
    qwen2_moe  the same, but without layer_types on the even layers i < max_window_layers
               (alternating: a mix whenever a layer slides and there are two or more)
    qwen3_moe  only when use_sliding_window is true: sliding_window on every layer (the class
               reads no max_window_layers or layer_types)
    llama4_text  chunked attention of attention_chunk_size tokens (default 8192; null: none) on the
               layers that layer_types calls "chunked_attention" (default: those with rotary
               embeddings, three in four): a token attends to its own chunk only. For a context of
               at most W tokens that is full attention too, so W is held as the window and the one
               rule above applies, whichever layers chunk (a context past W is refused naming
               attention_chunk_size)

gpt2, opt and llama have no window. DecoderConfig.sliding_window holds W (None: full attention);
`hf_window_kwargs` writes it back into a transformers config so that the runtime's reference
model computes what the checkpoint does.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from llm_planner.core.fmt import quote
from llm_planner.graph.ir import GraphError

log = logging.getLogger(__name__)

WINDOW_MODEL_TYPES = ("mistral", "mixtral", "phi3", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama4_text")
CHUNKED_TYPES = ("llama4_text",)  # the window is attention_chunk_size: chunks, not a slide (module docstring)
_CLASS_CHUNK = 8192  # Llama4TextConfig's default attention_chunk_size
EVERY_LAYER_TYPES = ("mistral", "mixtral", "phi3")  # sliding_window, when set, on every layer
_CLASS_WINDOW = 4096  # the default sliding_window of MistralConfig and the Qwen configs
_CLASS_MAX_WINDOW_LAYERS = 28  # the default max_window_layers of Qwen2Config and Qwen2MoeConfig
_FULL, _SLIDING = ("full_attention", "attention"), "sliding_attention"  # "attention": the legacy name


def window_fields(r: Any, hf_type: str, num_layers: int) -> dict[str, Any]:
    """{"sliding_window": W or None} of a config of model_type `hf_type` with `num_layers` layers, read
    with `r` (llm_planner.graph.hf_config's typed reader); {} for a type without a window. GraphError
    naming the key when some layers slide and others do not (module docstring)."""
    if hf_type not in WINDOW_MODEL_TYPES:
        return {}
    if hf_type in CHUNKED_TYPES:
        return {"sliding_window": _chunk(r, num_layers)}
    if hf_type in EVERY_LAYER_TYPES:
        default = _CLASS_WINDOW if hf_type == "mistral" and "sliding_window" not in r.data else None
        return {"sliding_window": _window(r, default)}
    if not r.get("use_sliding_window", bool, False):
        return {"sliding_window": None}
    window = _window(r, _CLASS_WINDOW if "sliding_window" not in r.data else None)
    if window is None or hf_type == "qwen3_moe":
        return {"sliding_window": window}
    sliding, key = _sliding_layers(r, hf_type, num_layers)
    if 0 < len(sliding) < num_layers:
        raise GraphError(
            f"{r.source}: key {key!r}: with use_sliding_window true, layers {_ranges(sliding)} of {num_layers} "
            f"slide a window of {window} tokens and the others attend to the whole context; the planner's layers "
            "are identical, so only a window on every layer or on none is planned"
        )
    return {"sliding_window": window if sliding else None}


def _chunk(r: Any, num_layers: int) -> int | None:
    """llama4_text's attention_chunk_size when some layer chunks, else None: the layers layer_types
    calls "chunked_attention", else those no_rope_layers marks 1 (rotary embeddings, which chunk); an
    empty or missing no_rope_layers is the class default, every layer but each
    no_rope_layer_interval-th (default 4), as Meta's published config (`no_rope_layers: []`) has it."""
    size = r.get("attention_chunk_size", int, None) if "attention_chunk_size" in r.data else _CLASS_CHUNK
    if size is not None and size < 1:
        raise GraphError(
            f"{r.source}: key 'attention_chunk_size' must be a positive integer or null, got {quote(size)}"
        )
    types = r.get("layer_types", list, None)
    if types is not None:
        if len(types) != num_layers or any(t not in ("chunked_attention", "full_attention") for t in types):
            raise GraphError(
                f"{r.source}: key 'layer_types' must list {num_layers} entries (num_hidden_layers), each "
                f"'chunked_attention' or 'full_attention', got {quote(types)}"
            )
        return size if "chunked_attention" in types else None
    rope = r.get("no_rope_layers", list, None)
    if rope:
        if len(rope) != num_layers or any(v not in (0, 1) or isinstance(v, bool) for v in rope):
            raise GraphError(
                f"{r.source}: key 'no_rope_layers' must list {num_layers} entries (num_hidden_layers), each 0 or 1, "
                f"got {quote(rope)}"
            )
        return size if any(rope) else None
    interval = r.get("no_rope_layer_interval", int, 4)
    return size if interval != 1 else None  # an interval of 1: no layer has rotary embeddings


def _window(r: Any, default: int | None) -> int | None:
    window = r.get("sliding_window", int, default)
    if window is not None and window < 1:
        raise GraphError(f"{r.source}: key 'sliding_window' must be a positive integer or null, got {quote(window)}")
    return window


def _sliding_layers(r: Any, hf_type: str, num_layers: int) -> tuple[list[int], str]:
    """The layers that slide and the key that says so: layer_types, else max_window_layers."""
    types = r.get("layer_types", list, None)
    if types is None:
        first = r.get("max_window_layers", int, _CLASS_MAX_WINDOW_LAYERS)
        if hf_type in ("qwen2", "qwen3"):
            return [i for i in range(num_layers) if i >= first], "max_window_layers"
        return [i for i in range(num_layers) if i % 2 == 0 and i < first], "max_window_layers"
    if len(types) != num_layers or any(t not in (*_FULL, _SLIDING) for t in types):
        raise GraphError(
            f"{r.source}: key 'layer_types' must list {num_layers} entries (num_hidden_layers), each "
            f"'full_attention' or 'sliding_attention', got {quote(types)}"
        )
    return [i for i, t in enumerate(types) if t == _SLIDING], "layer_types"


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], layers[0]
    for prev, cur in zip(layers, [*layers[1:], None]):
        if cur != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(out)


def check_window_field(where: str, cfg: Any) -> None:
    """DecoderConfig's sliding_window: None, or a positive integer for a type that has a window."""
    window = cfg.sliding_window
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise GraphError(f"{where}: sliding_window must be a positive integer or None, got {quote(window)}")
    if cfg.hf_model_type not in WINDOW_MODEL_TYPES:
        raise GraphError(
            f"{where}: {cfg.hf_model_type} models have no sliding window (those with one: "
            f"{', '.join(WINDOW_MODEL_TYPES)})"
        )


def hf_window_kwargs(cfg: Any) -> dict[str, Any]:
    """The keyword arguments that give a transformers config of cfg's type cfg's window on every
    layer, or none ({} for a type without a window)."""
    window = cfg.sliding_window
    if cfg.hf_model_type in EVERY_LAYER_TYPES:
        return {"sliding_window": window}
    if cfg.hf_model_type in CHUNKED_TYPES:
        return {"attention_chunk_size": window}
    if cfg.hf_model_type not in WINDOW_MODEL_TYPES:
        return {}
    if window is None:
        return {"use_sliding_window": False}
    out: dict[str, Any] = {"use_sliding_window": True, "sliding_window": window}
    if cfg.hf_model_type != "qwen3_moe":
        out["layer_types"] = [_SLIDING] * cfg.num_layers
    return out


def window_refusal(cfg: Any, context_tokens: int, context: str) -> str | None:
    """Why a plan of `context_tokens` tokens per sequence (described by `context`, as "prompt 4000 +
    output 512 tokens") cannot be made for cfg; None when it can (module docstring). Logs once per
    model and window that full attention is planned when a window holds the context."""
    window = cfg.sliding_window
    if window is None:
        return None
    if context_tokens > window and cfg.hf_model_type in CHUNKED_TYPES:
        return (
            f"attention_chunk_size {window} < {context}: chunked attention (a token attends within its chunk of "
            f"{window}) is not modelled; contexts of at most {window} tokens are planned"
        )
    if context_tokens > window:
        return (
            f"sliding_window {window} < {context}: sliding-window attention (KV cache capped at the window) is not "
            f"modelled; contexts of at most {window} tokens are planned"
        )
    _say_full_attention(cfg.name, window)
    return None


def check_window(cfg: Any, context_tokens: int, context: str, source: str | None = None) -> None:
    """GraphError from `window_refusal`, naming `source` (the model's file or preset name; default: the
    model's name)."""
    why = window_refusal(cfg, context_tokens, context)
    if why is not None:
        raise GraphError(f"{source or f'model {cfg.name!r}'}: {why}")


@lru_cache(maxsize=64)
def _say_full_attention(name: str, window: int) -> None:
    log.info(
        "model %r attends within a window of %d tokens (sliding, or chunks); every context planned fits inside "
        "it, where full attention is what the model computes, and that is what is planned",
        name,
        window,
    )
