"""Decoder plans checked without torch: the chain's task names, the model a
plan names (or a checkpoint holds), and the prompts.

The launcher runs these checks before anything starts; the ranks repeat the
task check. Names are those of llm_planner.graph.transformer in block
granularity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llm_planner.graph import decoder_presets, hf_config

FAMILIES = ("gpt2", "llama", "qwen3")  # transformers model types the runtime builds
# mixture-of-experts model types the serving runtime builds as well (llm_planner.runtime.moe_layers):
# the placement runtime (latency and throughput plans, which the planner refuses for them) does not
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")
SERVED_FAMILIES = FAMILIES + MOE_FAMILIES
# the fields a checkpoint's config must share with the plan's model
MODEL_FIELDS = (
    "model_type",
    "hf_model_type",
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "vocab_size",
    "num_experts",
    "experts_per_token",
    "moe_intermediate_size",
    "shared_expert_size",
    "norm_topk_prob",
    "sliding_window",
)


class DecoderError(ValueError):
    """A decoder plan or model the runtime cannot run; the message says which and why."""


def decoder_tasks(num_layers: int) -> list[str]:
    return ["embed", *(f"block.{i}" for i in range(num_layers)), "final_norm", "lm_head"]


def check_decoder_tasks(tasks: list[str] | set[str], num_layers: int, *, source: str) -> None:
    """Raise DecoderError unless the plan's tasks are exactly the chain of a model with `num_layers` blocks."""
    expected = decoder_tasks(num_layers)
    got = set(tasks)
    if any(".attn" in t or ".mlp" in t for t in got):
        raise DecoderError(
            f"{source}: the runtime runs 'block' granularity plans only; "
            "this plan splits blocks into attn/mlp (sublayer)"
        )
    if got != set(expected):
        missing = sorted(set(expected) - got)[:5]
        extra = sorted(got - set(expected))[:5]
        raise DecoderError(
            f"{source}: the plan does not match the model ({num_layers} decoder blocks): "
            f"missing tasks {missing}, unknown tasks {extra}"
        )


def planned_decoder_config(
    model: dict[str, Any], checkpoint: str | None, *, source: str, families: tuple[str, ...] = FAMILIES
):
    """The DecoderConfig a plan's model names (a config dir or file, or a preset), checked against a checkpoint's;
    DecoderError unless its model type is one of `families` (the runtime that will run it)."""

    name = str(model.get("name", ""))
    path = Path(name)
    if path.is_dir() or path.suffix == ".json":
        planned = hf_config.load_config_file(path / "config.json" if path.is_dir() else path)
    elif decoder_presets.is_preset(name):
        planned = decoder_presets.preset_config(name)
    else:
        raise DecoderError(
            f"{source}: inputs.model.name: {name!r} is not a directory with config.json, a config.json or a preset"
        )
    config = planned
    if checkpoint is not None:
        config_path = Path(checkpoint) / "config.json"
        if not config_path.is_file():
            raise DecoderError(f"{checkpoint}: checkpoint directory has no config.json")
        config = hf_config.load_config_file(config_path)
        diff = [
            f"{f}: plan {getattr(planned, f)} vs checkpoint {getattr(config, f)}"
            for f in MODEL_FIELDS
            if getattr(planned, f) != getattr(config, f)
        ]
        if diff:
            raise DecoderError(
                f"{source}: the plan was made for another model than checkpoint {checkpoint}: " + "; ".join(diff)
            )
    if config.hf_model_type not in families:
        raise DecoderError(
            f"{source}: model type {config.hf_model_type!r}: the runtime runs {', '.join(families)} decoders"
        )
    return config


def check_prompts(prompts: list[list[int]] | tuple, max_new_tokens: int, config) -> None:
    """Every prompt non-empty, inside the vocabulary, and short enough for the model's positions."""
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise DecoderError(f"prompt_ids[{i}]: empty prompt")
        bad = [t for t in prompt if not (isinstance(t, int) and 0 <= t < config.vocab_size)]
        if bad:
            raise DecoderError(
                f"prompt_ids[{i}]: token ids {bad[:5]} are outside the vocabulary [0, {config.vocab_size})"
            )
        if len(prompt) + max_new_tokens > config.max_positions:
            raise DecoderError(
                f"prompt_ids[{i}]: {len(prompt)} prompt + {max_new_tokens} new tokens exceed the model's "
                f"{config.max_positions} positions"
            )
