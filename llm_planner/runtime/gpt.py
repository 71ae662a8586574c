"""Decoder LLM stages: the part of a GPT-style model that one rank owns, and
the bookkeeping of greedy generation that every rank derives on its own.

Tasks are the decoder chain of llm_planner.graph.transformer in block
granularity: "embed", "block.0" ... "block.{n-1}", "final_norm", "lm_head". A
rank builds only the modules of its tasks, as the Hugging Face classes of the
model family (GPT2Block, LlamaDecoderLayer, ...), with parameters from
llm_planner.runtime.weights. Running a stage does what the whole model's
forward does for those tasks, in the same order with the same arguments, so
the tokens equal those of `model.generate(do_sample=False)`:

    embed:       hidden = wte(ids) (+ wpe(position_ids) for GPT-2)
    block.i:     hidden = block_i(hidden, cache, causal mask, position ids [, rotary cos/sin])
    final_norm:  hidden = norm(hidden)[:, -1:]         (generate keeps one position)
    lm_head:     ids = argmax(float32(lm_head(hidden)[:, -1]))  (pad after EOS)

The causal mask is built with transformers' own `create_causal_mask` from the
2D padding mask, against the cache of the stage's first layer (all layers of a
stream hold the same length). Position ids follow `generate`: cumsum of the
padding mask minus one, then +1 per new token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llm_planner.graph import decoder_presets, hf_config
from llm_planner.runtime import decoder_tasks as dt
from llm_planner.runtime import moe_layers, tp_layers
from llm_planner.runtime.decoder_tasks import FAMILIES, DecoderError, check_decoder_tasks, decoder_tasks  # noqa: F401 (re-exported)
from llm_planner.runtime.weights import CheckpointWeights, SeededWeights, fill_module_


def load_hf_config(model: dict[str, Any], checkpoint: str | None = None):
    """The transformers config of a plan's model: from the checkpoint, a config dir/file, or a preset."""
    from transformers import AutoConfig

    if checkpoint is not None:
        if not (Path(checkpoint) / "config.json").is_file():
            raise DecoderError(f"{checkpoint}: checkpoint directory has no config.json")
        return AutoConfig.from_pretrained(checkpoint, local_files_only=True)
    name = str(model.get("name", ""))
    path = Path(name)
    if path.is_dir() or path.suffix == ".json":
        config_dir = path if path.is_dir() else path.parent
        if not (config_dir / "config.json").is_file():
            raise DecoderError(f"{name}: no config.json there")
        return AutoConfig.from_pretrained(str(config_dir), local_files_only=True)
    if not decoder_presets.is_preset(name):
        raise DecoderError(f"model {name!r}: not a directory with config.json, a config.json or a decoder preset")
    return hf_config.to_hf_config(decoder_presets.preset_config(name))


def num_layers_of(config) -> int:
    return int(config.num_hidden_layers)


@dataclass(frozen=True, kw_only=True)
class _Family:
    """Where a family keeps its modules in the whole model (names used for weights)."""

    embed: tuple[str, ...]
    block: str  # format string with {i}
    norm: str
    lm_head: str
    tied_to: str  # the embedding matrix an LM head shares when tie_word_embeddings


_NAMES = {
    "gpt2": _Family(
        embed=("transformer.wte", "transformer.wpe"),
        block="transformer.h.{i}",
        norm="transformer.ln_f",
        lm_head="lm_head",
        tied_to="transformer.wte.weight",
    ),
    "llama": _Family(
        embed=("model.embed_tokens",),
        block="model.layers.{i}",
        norm="model.norm",
        lm_head="lm_head",
        tied_to="model.embed_tokens.weight",
    ),
}
# qwen3 and the MoE types: their embedding, norm, head and block prefixes are llama's
_NAMES.update({family: _NAMES["llama"] for family in ("qwen3", *dt.MOE_FAMILIES)})


def family_of(config) -> str:
    """The config's model type, one the runtime builds (MoE types: serving only, DecoderShard refuses their blocks)."""
    model_type = getattr(config, "model_type", "")
    if model_type not in dt.SERVED_FAMILIES:
        raise DecoderError(f"model type {model_type!r}: the runtime runs {', '.join(dt.SERVED_FAMILIES)} decoders")
    return model_type


def prepare_config(config, attn_implementation: str = "sdpa"):
    """Fix the attention implementation so ranks and the reference model compute alike."""
    config._attn_implementation = attn_implementation
    return config


def weight_source(config, *, checkpoint: str | None, seed: int):
    names = _NAMES[family_of(config)]
    aliases = {f"{names.lm_head}.weight": names.tied_to} if getattr(config, "tie_word_embeddings", False) else {}
    if checkpoint is not None:
        return CheckpointWeights(checkpoint, aliases=aliases)
    return SeededWeights(seed=seed, std=float(getattr(config, "initializer_range", 0.02)), aliases=aliases)


class DecoderShard:
    """The modules of one rank's decoder tasks, and how to run a stage of them."""

    def __init__(self, config, tasks: set[str], *, device: torch.device, dtype: torch.dtype, source, group=None):
        """`group`: the collectives of the rank's tensor-parallel group (size >= 2), or None for a single device."""
        self.config, self.family = config, family_of(config)
        self.device, self.dtype = device, dtype
        self.modules: dict[str, torch.nn.Module] = {}
        self.parts: dict[str, Any] = {}  # task -> this member's share (tensor-parallel groups only)
        self.group = group if group is not None and group.size > 1 else None
        names = _NAMES[self.family]
        if self.family in dt.MOE_FAMILIES and any(t.startswith("block.") for t in tasks):
            raise DecoderError(f"model type {self.family!r}: its MoE blocks run in serving plans only (`launch`)")
        if self.group is not None:  # the declared layout (llm_planner.graph.tp_layout) of each task
            layout_config = hf_config.from_hf_config(config)
            tp_layers.check_runs_on_groups(config, self.family)
            tp_layers.check_divisible(layout_config, self.group.size)
        for task in sorted(tasks, key=_task_key):
            if self.group is not None and task != "final_norm":
                self.parts[task] = tp_layers.build_shard(
                    task, layout_config, self.family, self.group, source, dtype=dtype, device=device
                )
                continue
            for prefix, module in self._build(task, names):
                self.modules[prefix] = fill_module_(module, prefix, source, dtype=dtype, device=device)
        self.rotary = None
        if self.family != "gpt2" and any(t.startswith("block.") for t in tasks):  # rotary positions
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

            self.rotary = LlamaRotaryEmbedding(config=config).to(device)
        self.names = names

    def _build(self, task: str, names: _Family) -> list[tuple[str, torch.nn.Module]]:
        """The task's modules, allocated on the meta device: `fill_module_` gives them real storage."""
        c = self.config
        if self.family == "gpt2":
            from transformers.models.gpt2.modeling_gpt2 import GPT2Block as Block

            norm_class, norm_eps = torch.nn.LayerNorm, c.layer_norm_epsilon
        elif self.family == "qwen3":  # llama's layer with q and k norms on each head
            from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer as Block
            from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm as norm_class

            norm_eps = c.rms_norm_eps
        else:
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer as Block
            from transformers.models.llama.modeling_llama import LlamaRMSNorm as norm_class

            norm_eps = c.rms_norm_eps
        with torch.device("meta"):
            if task == "embed":
                embeds = [torch.nn.Embedding(c.vocab_size, c.hidden_size)]
                if self.family == "gpt2":
                    embeds.append(torch.nn.Embedding(c.max_position_embeddings, c.hidden_size))
                return list(zip(names.embed, embeds))
            if task.startswith("block."):
                i = int(task.split(".")[1])
                return [(names.block.format(i=i), Block(c, layer_idx=i))]
            if task == "final_norm":
                return [(names.norm, norm_class(c.hidden_size, eps=norm_eps))]
            assert task == "lm_head", task
            return [(names.lm_head, torch.nn.Linear(c.hidden_size, c.vocab_size, bias=False))]

    # -- running -----------------------------------------------------------------
    def run_stage(
        self, tasks: list[str], value: torch.Tensor, stream: "StreamState", step: int, on_task=None
    ) -> torch.Tensor:
        """Run a stage's tasks on `value` (token ids before embed, hidden states after).

        `on_task(name, seconds)` receives the measured time of each task.
        """
        context = None
        for task in tasks:
            start = time.perf_counter()
            if task.startswith("block."):
                if context is None:  # once per stage call, before its first layer grows the cache
                    context = self._block_context(int(task.split(".")[1]), value, stream, step)
                value = self._block(int(task.split(".")[1]), value, stream, context)
            elif task == "embed":
                value = self._embed(value.to(self.device), stream.position_ids(step))
            elif task == "final_norm":
                value = self.modules[self.names.norm](value)[:, -1:, :]
            elif task in self.parts:
                value = stream.finish_step(self.parts[task](value))
            else:
                value = self._lm_head(value, stream)
            if self.device.type == "cuda":  # time the kernels, not their launch
                torch.cuda.synchronize(self.device)
            if on_task is not None:
                on_task(task, time.perf_counter() - start)
        return value

    def _embed(self, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        if "embed" in self.parts:
            return self.parts["embed"](ids, position_ids)
        hidden = self.modules[self.names.embed[0]](ids)
        if self.family == "gpt2":
            hidden = hidden + self.modules[self.names.embed[1]](position_ids)
        return hidden

    def _block_context(
        self, first_layer: int, hidden: torch.Tensor, stream: "StreamState", step: int
    ) -> dict[str, Any]:
        from transformers.masking_utils import create_causal_mask

        position_ids = stream.position_ids(step)
        if self.group is not None:
            return self._shard_context(first_layer, hidden, stream, step, position_ids)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=stream.attention_mask(step),
            past_key_values=stream.cache,
            position_ids=position_ids,
            layer_idx=first_layer,
        )
        context: dict[str, Any] = {"attention_mask": mask, "position_ids": position_ids}
        if self.rotary is not None:
            context["position_embeddings"] = self.rotary(hidden, position_ids=position_ids)
        return context

    def _shard_context(
        self, first_layer: int, hidden: torch.Tensor, stream: "StreamState", step: int, position_ids
    ) -> dict[str, Any]:
        """The tensor-parallel blocks' mask (llm_planner.runtime.tp_layers.causal_mask) and rotary embedding."""
        past = stream.shard_cache[first_layer][0].shape[2] if first_layer in stream.shard_cache else 0
        tokens = int(hidden.shape[1])
        mask = tp_layers.causal_mask(stream.attention_mask(step), tokens, past + tokens, hidden.dtype, self.device)
        context: dict[str, Any] = {"mask": mask}
        if self.rotary is not None:
            context["position_embeddings"] = self.rotary(hidden, position_ids=position_ids)
        return context

    def _block(self, i: int, hidden: torch.Tensor, stream: "StreamState", context: dict[str, Any]) -> torch.Tensor:
        if self.group is not None:
            return self.parts[f"block.{i}"](hidden, stream.shard_cache, context)
        block = self.modules[self.names.block.format(i=i)]
        out = block(hidden, past_key_values=stream.cache, use_cache=True, **context)
        return out[0] if isinstance(out, tuple) else out

    def _lm_head(self, hidden: torch.Tensor, stream: "StreamState") -> torch.Tensor:
        logits = self.modules[self.names.lm_head](hidden)[:, -1, :].to(dtype=torch.float32)
        return stream.finish_step(torch.argmax(logits, dim=-1))

    def new_stream(self, **kwargs) -> "StreamState":
        from transformers import DynamicCache

        return StreamState(cache=DynamicCache(config=self.config), device=self.device, **kwargs)


def _task_key(task: str) -> tuple[int, int]:
    if task == "embed":
        return (0, 0)
    if task.startswith("block."):
        return (1, int(task.split(".")[1]))
    return (2, 0 if task == "final_norm" else 1)


def pad_prompts(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Left-pad prompts to one length; the 2D mask is None when no prompt needed padding."""
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, length - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, length - len(prompt) :] = 1
    return ids, (None if bool(mask.all()) else mask)


def prompt_pad_id(config) -> int:
    """The id that left-pads short prompts (masked out; any id inside the vocabulary)."""
    _, pad = special_tokens(config)
    return pad if 0 <= pad < int(config.vocab_size) else 0


def special_tokens(config) -> tuple[list[int], int]:
    """(EOS ids, pad id) the way `generate` picks them: pad falls back to the first EOS."""
    eos = getattr(config, "eos_token_id", None)
    eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    pad = getattr(config, "pad_token_id", None)
    pad_id = int(pad) if pad is not None else (eos_ids[0] if eos_ids else 0)
    return eos_ids, pad_id


@dataclass(kw_only=True)
class StreamState:
    """One micro-batch of requests in flight: its KV cache (for this rank's layers) and masks."""

    requests: list[int]  # indices of the requests in the whole batch
    prompt_ids: torch.Tensor  # [B, T] left-padded
    prompt_mask: torch.Tensor | None  # [B, T] or None without padding
    eos_ids: list[int]
    pad_id: int
    cache: Any = None
    shard_cache: dict = field(default_factory=dict)  # tensor-parallel members: layer -> (keys, values) of their heads
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    generated: list[torch.Tensor] = field(default_factory=list)
    unfinished: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_ids.shape[1])

    def attention_mask(self, step: int) -> torch.Tensor | None:
        if self.prompt_mask is None:
            return None
        ones = torch.ones((self.batch, step), dtype=torch.long)
        return torch.cat([self.prompt_mask, ones], dim=1).to(self.device)

    def position_ids(self, step: int) -> torch.Tensor:
        mask = self.prompt_mask if self.prompt_mask is not None else torch.ones_like(self.prompt_ids)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        if step == 0:
            return positions.to(self.device)
        return (positions[:, -1:] + step).to(self.device)

    def finish_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Greedy bookkeeping of `generate`: pad after EOS; returns the ids fed back."""
        tokens = tokens.to("cpu")
        if self.unfinished is None:
            self.unfinished = torch.ones(self.batch, dtype=torch.long)
        tokens = tokens * self.unfinished + self.pad_id * (1 - self.unfinished)
        if self.eos_ids:
            self.unfinished = self.unfinished * (~torch.isin(tokens, torch.tensor(self.eos_ids))).long()
        self.generated.append(tokens)
        return tokens.view(-1, 1)

    def tokens(self) -> list[list[int]]:
        """Generated ids per request, cut after the first EOS (as `generate` leaves them before padding)."""
        out = []
        rows = torch.stack(self.generated, dim=1).tolist() if self.generated else [[] for _ in range(self.batch)]
        for row in rows:
            cut = next((j + 1 for j, t in enumerate(row) if t in self.eos_ids), len(row))
            out.append(row[:cut])
        return out


def value_shape(
    task_before: str | None, stream: StreamState, step: int, hidden_size: int
) -> tuple[tuple[int, ...], str]:
    """Shape and kind ("ids" or "hidden") of the value that enters the task after `task_before`."""
    if task_before is None or task_before == "lm_head":
        return ((stream.batch, stream.prompt_len if step == 0 else 1), "ids")
    if task_before == "final_norm":
        return ((stream.batch, 1, hidden_size), "hidden")
    return ((stream.batch, stream.prompt_len if step == 0 else 1, hidden_size), "hidden")


def config_summary(config) -> dict[str, Any]:
    return json.loads(
        json.dumps(
            {k: getattr(config, k, None) for k in ("model_type", "num_hidden_layers", "hidden_size", "vocab_size")}
        )
    )


# ----------------------------------------------------------------------------
# The whole model in one process: the reference the pipeline is checked against


def build_whole_model(config, source) -> torch.nn.Module:
    """The whole Hugging Face model with parameters from `source` (tests and benchmarks only)."""
    from transformers import AutoModelForCausalLM

    if family_of(config) in dt.MOE_FAMILIES:  # experts fused in memory, one tensor each in checkpoints
        return moe_layers.whole_model(config, source)
    model = AutoModelForCausalLM.from_config(config)
    if isinstance(source, CheckpointWeights):
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(source.tensor(name, param.shape))
        return model.eval()
    from llm_planner.runtime.weights import init_whole_model_

    return init_whole_model_(model, source)


def generate_whole(model: torch.nn.Module, config, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy `model.generate` on the left-padded batch; new ids per request, cut after the first EOS."""
    eos, pad = special_tokens(config)
    ids, mask = pad_prompts(prompts, prompt_pad_id(config))
    kwargs = {} if mask is None else {"attention_mask": mask}
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad, **kwargs)
    rows = out[:, ids.shape[1] :].tolist()
    return [row[: next((j + 1 for j, t in enumerate(row) if t in eos), len(row))] for row in rows]
