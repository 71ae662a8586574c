"""One pipeline stage of a served replica: its layers' weights, a KV cache of slots, and one
iteration over a ragged batch.

A stage holds decoder layers [first, first + n) (the first stage the embedding too, the last the
final norm and the LM head), on one device or as one member of a tensor-parallel group of any
degree k: every task is built by llm_planner.runtime.tp_layers from the declared layout
(llm_planner.graph.tp_layout) with the member's slice of each weight, and a single device is a
group of one (`tp_layers.Unconnected(1)`: its collectives do nothing); a mixture of experts' MLP
holds a slice of every expert (llm_planner.runtime.moe_layers). Weights come from a seed or a
checkpoint (llm_planner.runtime.weights), by their names in the whole model's checkpoint.

KV cache: per layer, keys and values [slots, kv_heads / k, context, head_dim], allocated once;
slot s holds the sequence the scheduler put there (llm_planner.runtime.serve_scheduler), and a
new sequence in a freed slot overwrites it from position 0 (nothing past its length is read).

An iteration's tokens are packed, [T, hidden], T the sum of the entries' tokens (no padding).
Linear layers run on all T at once. Attention (`attend`) writes each entry's keys and values at
its positions, then:

    decodes (1 token each): batched, query i over keys [0, start_i] of its slot; the keys of the
                            batch gathered to the longest length, a boolean mask hides the rest
                            (exp(-inf) = 0: a hidden key adds exactly nothing); the query heads
                            that share a key/value head are packed as its queries, so grouped-query
                            keys are not copied per query head (prompt chunks alike)
    prompt chunks (n > 1):  queries start..start+n-1 over keys [0, start + n), causal; the chunks
                            of one shape (start, n) batched (`PromptGroup`: a closed loop's wave
                            of prompts is one batch), their mask built once per iteration

The iteration's indices (each token's slot and position, the decodes' rows, slots and mask) are
built once per iteration on the device (`index_of`), so no layer copies an index from the host or
waits on the device to read one: on a GPU the layers' kernels queue without a stop.

On CUDA, torch's cuDNN attention is turned off for the process (`CUDNN_ATTENTION_OFF`): cuDNN
builds an execution plan for each new shape, and a decode batch's keys grow by one every
iteration, so it built one per layer per iteration (on an H200, 65 decodes of Llama-3 8B took a
median 62.8 ms an iteration while the key lengths were new and 13.9 ms once they repeated:
docs/serve-runtime.md, "On a GPU"); the other kernels take any length.

Positions are each sequence's own (start + j), for learned positions (GPT-2) and rotary
embeddings (Llama) alike, so a sequence's tokens do not depend on what shares its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llm_planner.graph import hf_config
from llm_planner.graph.attention_window import window_refusal
from llm_planner.runtime import ep_moe, gpt, tp_layers
from llm_planner.runtime.serve_scheduler import Entry

CUDNN_ATTENTION_OFF = True


def _offsets(entries: tuple[Entry, ...] | list[Entry]) -> list[int]:
    out, at = [], 0
    for e in entries:
        out.append(at)
        at += e.tokens
    return out


def positions_of(entries, device: torch.device) -> torch.Tensor:
    """Each packed token's position in its own sequence."""
    return torch.cat([torch.arange(e.start, e.start + e.tokens) for e in entries]).to(device)


@dataclass(frozen=True)
class PromptGroup:
    """The prompt chunks of an iteration that share a shape (start, tokens n), attended as one batch."""

    rows: torch.Tensor  # [c, n] each chunk's tokens' rows among the packed tokens
    slots: torch.Tensor  # [c] their slots
    length: int  # start + n: the keys each chunk's last token sees
    visible: torch.Tensor  # [1, 1, rep * n, length] causal, row r n + j (query head r of a group, token j)


@dataclass(frozen=True)
class IterIndex:
    """An iteration's indices on the device, built once for all its layers (`index_of`): no layer
    copies an index from the host or waits on the device to read one."""

    position: torch.Tensor  # [T] each packed token's position in its sequence
    slot_of: torch.Tensor  # [T] each packed token's slot
    decode_rows: torch.Tensor | None  # [d] the decodes' rows among the packed tokens (None: no decode)
    decode_slots: torch.Tensor | None  # [d] their slots
    visible: torch.Tensor | None  # [d, 1, 1, length] which of the first `length` keys each decode sees
    length: int  # the longest decode's keys
    prompts: tuple[PromptGroup, ...]  # the prompt chunks, grouped by shape


def index_of(entries, device: torch.device, rep: int = 1) -> IterIndex:
    """The indices of `entries` (a packed iteration) on `device`; `rep` query heads share a key/value head."""
    offsets = _offsets(entries)
    slot_of = torch.tensor([e.slot for e in entries for _ in range(e.tokens)]).to(device)
    singles = [(e, at) for e, at in zip(entries, offsets) if e.tokens == 1]
    prompts = _prompt_groups(entries, offsets, device, rep)
    position = positions_of(entries, device)
    if not singles:
        return IterIndex(position, slot_of, None, None, None, 0, prompts)
    host = torch.tensor([[at, e.slot, e.start + 1] for e, at in singles])
    rows, slots, lengths = host.to(device).unbind(1)
    length = max(e.start + 1 for e, _ in singles)
    visible = (torch.arange(length, device=device)[None, :] < lengths[:, None])[:, None, None, :]
    return IterIndex(position, slot_of, rows, slots, visible, length, prompts)


def _prompt_groups(entries, offsets: list[int], device: torch.device, rep: int) -> tuple[PromptGroup, ...]:
    shapes: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e, at in zip(entries, offsets):
        if e.tokens != 1:
            shapes.setdefault((e.start, e.tokens), []).append((at, e.slot))
    groups = []
    for (start, n), members in shapes.items():
        rows = torch.tensor([list(range(at, at + n)) for at, _ in members]).to(device)
        slots = torch.tensor([slot for _, slot in members]).to(device)
        length = start + n
        causal = torch.arange(length, device=device)[None, :] <= torch.arange(n, device=device)[:, None] + start
        groups.append(PromptGroup(rows, slots, length, causal.repeat(rep, 1)[None, None]))
    return tuple(groups)


def attend(q, k, v, cache_k, cache_v, index: IterIndex, rep: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, heads, d], k and v [T, kv_heads, d] of the packed entries -> [T, heads * d] (module docstring),
    written into `out` ([T, heads, d]) when given; `index` built for `rep` query heads per key/value head."""
    # every packed token's keys and values written at (its slot, its position) in one indexed copy
    cache_k[index.slot_of, :, index.position] = k
    cache_v[index.slot_of, :, index.position] = v
    out = torch.empty_like(q) if out is None else out
    scale = 1.0 / math.sqrt(q.shape[-1])
    if index.decode_rows is not None:
        slots, length, rows = index.decode_slots, index.length, index.decode_rows
        keys, values = cache_k[slots, :, :length], cache_v[slots, :, :length]
        # each key/value head's `rep` query heads packed as its queries: the cache is read, not copied per head
        packed = q[rows].reshape(len(rows), keys.shape[1], rep, q.shape[-1])
        o = F.scaled_dot_product_attention(packed, keys, values, attn_mask=index.visible, scale=scale)
        out[rows] = o.reshape(len(rows), q.shape[1], q.shape[-1])
    for group in index.prompts:
        _prompt_attention(q, cache_k, cache_v, group, scale, out)
    return out.reshape(q.shape[0], -1)


def _prompt_attention(q, cache_k, cache_v, group: PromptGroup, scale: float, out: torch.Tensor) -> None:
    """A group's chunks: each one's queries over its slot's keys [0, start + n), causal, into `out`; each
    key/value head's query heads packed as its queries (rows head-major: row r n + j of a group is query
    head r's token j, and sees what token j sees), so the cache is read, not copied per head."""
    (c, n), (_, heads, d) = group.rows.shape, q.shape
    keys, values = cache_k[group.slots, :, : group.length], cache_v[group.slots, :, : group.length]
    packed = q[group.rows].transpose(1, 2).reshape(c, keys.shape[1], heads // keys.shape[1] * n, d)
    assert group.visible.shape[2] == packed.shape[2], "index_of was built for another number of query heads per KV head"
    o = F.scaled_dot_product_attention(packed, keys, values, attn_mask=group.visible, scale=scale)
    out[group.rows.reshape(-1)] = o.reshape(c, heads, n, d).transpose(1, 2).reshape(c * n, heads, d)


class ServeBlock(tp_layers.BlockShard):
    """A decoder block (or a member's share of one) over a packed iteration and a slot KV cache."""

    def __init__(
        self, cfg, layer: int, t: dict, ops, *, slots: int, context_len: int, renormalise=None, expert_ops=None
    ):
        super().__init__(cfg, layer, t, ops, renormalise=renormalise, expert_ops=expert_ops)
        like = t["q"]
        shape = (slots, self.kv, context_len, self.d)
        self.cache_k = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.cache_v = torch.zeros(shape, dtype=like.dtype, device=like.device)

    def forward(self, x: torch.Tensor, index: IterIndex, rotary) -> torch.Tensor:  # type: ignore[override]
        q, k, v = self.attention_inputs(x, rotary)
        return self.after_attention(x, attend(q, k, v, self.cache_k, self.cache_v, index, self.rep))

    def attention_inputs(self, x: torch.Tensor, rotary) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer up to its attention: q [T, heads, d], k and v [T, kv_heads, d], rotated (llama)."""
        q, k, v = self.split_heads(x)
        if self.rotary:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            q, k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], *rotary)
            q, k = q[0].transpose(0, 1), k[0].transpose(0, 1)
        return q, k, v

    def after_attention(self, x: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """The layer after its attention ([T, heads * d]): the output projection, the MLP, both residuals."""
        x = x + self.o(attention)
        return x + self.mlp(x)


class ServeStage:
    """Layers [first_layer, first_layer + num_layers) of the model, with the ends when first / last."""

    def __init__(
        self,
        config,
        *,
        first_layer: int,
        num_layers: int,
        slots: int,
        context_len: int,
        device: torch.device,
        dtype: torch.dtype,
        source,
        ops=None,
        experts=None,
    ):
        """`config`: the transformers config; `ops`: the group's collectives (None: a single device);
        `experts`: instead, the collectives of a group with data-parallel attention, whose members hold every
        weight whole but split the routed experts (llm_planner.runtime.ep_moe)."""
        if experts is not None and ops is not None:
            raise ValueError("a stage is a tensor-parallel group (ops) or a data-parallel one (experts), not both")
        self.config, self.family = config, gpt.family_of(config)
        self.device = device
        if device.type == "cuda" and CUDNN_ATTENTION_OFF:
            torch.backends.cuda.enable_cudnn_sdp(False)  # for the whole process (module docstring)
        self.ops = ops if ops is not None else tp_layers.Unconnected(1)
        cfg = hf_config.from_hf_config(config)
        tp_layers.check_runs_on_groups(config, self.family)
        total = gpt.num_layers_of(config)
        self.first, self.last = first_layer == 0, first_layer + num_layers == total
        if context_len > cfg.max_positions:
            raise gpt.DecoderError(f"a context of {context_len} tokens exceeds the model's {cfg.max_positions}")
        why = window_refusal(cfg, context_len, f"a context of {context_len} tokens")
        if why is not None:
            raise gpt.DecoderError(f"model {cfg.name!r}: {why}")

        def build(task: str):
            return tp_layers.build_shard(task, cfg, self.family, self.ops, source, dtype=dtype, device=device)

        self.embed = build("embed") if self.first else None
        tp_layers.check_divisible(cfg, self.ops.size)
        self.blocks = []
        renormalise = cfg.norm_topk_prob if cfg.is_moe else None
        if experts is not None and not cfg.is_moe:
            raise gpt.DecoderError(f"model {cfg.name!r}: data-parallel attention splits experts; it has none")
        keep = ep_moe.holds(cfg, experts.size, experts.index) if experts is not None else None
        for i in range(first_layer, first_layer + num_layers):
            t = tp_layers.member_tensors(
                f"block.{i}",
                cfg,
                self.family,
                self.ops.size,
                self.ops.index,
                source,
                dtype=dtype,
                device=device,
                keep=keep,
            )
            block = ServeBlock(
                cfg, i, t, self.ops, slots=slots, context_len=context_len, renormalise=renormalise, expert_ops=experts
            )
            self.blocks.append(block)
        self.norm = self.head = None
        if self.last:
            ends = gpt.DecoderShard(config, {"final_norm"}, device=device, dtype=dtype, source=source)
            self.norm = ends.modules[ends.names.norm]
            self.head = build("lm_head")
        self.rotary = None
        if not cfg.learned_positions:  # llama and the MoE types: the same rotary embedding
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

            self.rotary = LlamaRotaryEmbedding(config=config).to(device)

    def run(self, entries, value: torch.Tensor) -> torch.Tensor:
        """One iteration: token ids [T] in (first stage) or hidden states [T, hidden]; hidden states out,
        or on the last stage the greedy token of each sampling entry ([n] ids, entry order)."""
        index = self.index(entries)
        value = value.to(self.device)
        x = self.embed(value, index.position) if self.embed is not None else value
        rotary = self.rotary_of(x, index.position)
        for block in self.blocks:
            x = block(x, index, rotary)
        return self.sample(entries, x) if self.last else x

    def idle(self) -> torch.Tensor:
        """An iteration of a data-parallel member with no tokens: its part in every layer's expert collectives
        (llm_planner.runtime.ep_moe); no token out."""
        hidden = self.config.hidden_size
        x = torch.empty(0, hidden, device=self.device, dtype=self.blocks[0].qkv.weight.dtype)
        for block in self.blocks:
            block.mlp(x)
        return torch.empty(0, dtype=torch.long)

    def index(self, entries) -> IterIndex:
        """The iteration's indices on this stage's device, for its layers' query heads per KV head."""
        return index_of(entries, self.device, self.blocks[0].rep)

    def rotary_of(self, x: torch.Tensor, positions: torch.Tensor):
        """The rotary embedding's (cos, sin) at `positions` (None: learned positions)."""
        return self.rotary(x[None], position_ids=positions[None]) if self.rotary is not None else None

    def sample(self, entries, x: torch.Tensor) -> torch.Tensor:
        """The last stage's greedy token of each sampling entry ([n] ids on the CPU, entry order)."""
        rows = [at + e.tokens - 1 for e, at in zip(entries, _offsets(entries)) if e.sample]
        if not rows:
            return torch.empty(0, dtype=torch.long)
        hidden = self.norm(x[torch.tensor(rows, device=x.device)])
        return self.head(hidden[:, None, :]).to("cpu")
