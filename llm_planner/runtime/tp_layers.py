"""One member's share of a decoder task on a tensor-parallel group (the Megatron layout).

The layout is the one the planner costs (llm_planner.graph.decoder_graph,
`_tensor_parallel`), with the same collectives, one call each:

    block:       attention heads split k ways (q/k/v column-parallel, the KV cache of
                 the member's heads only), the output projection row-parallel, one
                 all-reduce of its output; the MLP's up (and gate) projection
                 column-parallel, the down projection row-parallel, one all-reduce.
                 Norms and the biases added after a reduction are replicated.
    embed:       the token table split by vocabulary rows; each member looks up the
                 ids in its rows (zeros elsewhere), one all-reduce; learned positions
                 replicated.
    final_norm:  replicated (every member normalises the whole hidden state).
    lm_head:     split by vocabulary rows; each member's argmax (value and index,
                 8 bytes per sample) all-gathered, the largest value wins (the
                 smallest index among equal values, as torch.argmax).

A member reads only its slices of each parameter (`source.tensor_slice`). The
group's collectives come from `ops` (llm_planner.runtime.comm.GroupComm under
MPI, or any object with `size`, `index`, `all_reduce_(t)` and `all_gather(t)`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from llm_planner.runtime.decoder_tasks import DecoderError
from llm_planner.runtime.weights import fill_module_


def even_range(total: int, k: int, index: int) -> tuple[int, int]:
    """Member `index`'s contiguous part of `total` rows split k ways (sizes differ by at most one)."""
    return total * index // k, total * (index + 1) // k


class _Slicer:
    """Reads the member's slices of parameters named as in the whole model."""

    def __init__(self, source, *, dtype: torch.dtype, device: torch.device):
        self.source, self.dtype, self.device = source, dtype, device

    def part(self, name: str, shape: tuple[int, ...], dim: int, start: int, stop: int) -> torch.Tensor:
        return self.source.tensor_slice(name, torch.Size(shape), dim, start, stop).to(
            device=self.device, dtype=self.dtype
        )

    def whole(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return self.source.tensor(name, torch.Size(shape)).to(device=self.device, dtype=self.dtype)

    def module(self, module: torch.nn.Module, prefix: str) -> torch.nn.Module:
        return fill_module_(module, prefix, self.source, dtype=self.dtype, device=self.device)


def check_divisible(config, family: str, k: int) -> None:
    """DecoderError unless heads, KV heads and the MLP width split k ways (the planner's rule)."""
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    width = _mlp_width(config, family)
    bad = [f"{what} {n}" for what, n in (("heads", heads), ("KV heads", kv), ("MLP width", width)) if n % k]
    if bad:
        raise DecoderError(f"a tensor-parallel group of {k} cannot split {', '.join(bad)}")
    if family == "gpt2" and (
        getattr(config, "scale_attn_by_inverse_layer_idx", False) or getattr(config, "reorder_and_upcast_attn", False)
    ):
        raise DecoderError(
            "GPT-2 configs with scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn run on single devices only"
        )


def _mlp_width(config, family: str) -> int:
    if family == "gpt2":
        return int(config.n_inner or 4 * config.hidden_size)
    return int(config.intermediate_size)


# ----------------------------------------------------------------------------
# Attention on the member's heads


def causal_mask(
    mask_2d: torch.Tensor | None, q_len: int, k_len: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """Additive [B, 1, q, k] mask: key j is visible to query i when j <= i + (k - q) and j is not padding.

    None when no key is padding and q = 1 (everything visible). Rows that see no
    key (queries at padded positions) get the dtype's minimum everywhere, so the
    softmax stays finite (their outputs are never used)."""
    if mask_2d is None and q_len == 1:
        return None
    keys = torch.arange(k_len, device=device)
    visible = keys[None, :] <= (torch.arange(q_len, device=device)[:, None] + (k_len - q_len))
    visible = visible[None, None]
    if mask_2d is not None:
        visible = visible & mask_2d.to(device=device, dtype=torch.bool)[:, None, None, :]
    return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, torch.finfo(dtype).min)


def _attend(q, k, v, mask, cache: dict, layer: int, rep: int) -> torch.Tensor:
    """Grow the layer's cache by (k, v), attend, and return [B, T, heads * d]."""
    if layer in cache:
        k = torch.cat([cache[layer][0], k], dim=2)
        v = torch.cat([cache[layer][1], v], dim=2)
    cache[layer] = (k, v)
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    causal = mask is None and q.shape[2] > 1
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=1.0 / math.sqrt(q.shape[-1]))
    batch, heads, tokens, d = out.shape
    return out.transpose(1, 2).reshape(batch, tokens, heads * d)


# ----------------------------------------------------------------------------
# Blocks


class GPT2BlockShard:
    """GPT2Block's computation on 1/k of the heads and of the MLP width (Conv1D weights are [in, out])."""

    def __init__(self, config, layer: int, ops, slicer: _Slicer):
        from transformers.activations import ACT2FN

        h, heads, k, r = int(config.hidden_size), int(config.num_attention_heads), ops.size, ops.index
        self.layer, self.ops, self.d = layer, ops, h // heads
        self.heads = heads // k
        w, lo = self.heads * self.d, r * (heads // k) * self.d
        p = f"transformer.h.{layer}"
        with torch.device("meta"):
            ln_1, ln_2 = (torch.nn.LayerNorm(h, eps=config.layer_norm_epsilon) for _ in range(2))
        self.ln_1, self.ln_2 = slicer.module(ln_1, f"{p}.ln_1"), slicer.module(ln_2, f"{p}.ln_2")
        cols = [(j * h + lo, j * h + lo + w) for j in range(3)]  # q, k, v: the member's heads of each
        self.qkv_w = torch.cat([slicer.part(f"{p}.attn.c_attn.weight", (h, 3 * h), 1, a, b) for a, b in cols], dim=1)
        self.qkv_b = torch.cat([slicer.part(f"{p}.attn.c_attn.bias", (3 * h,), 0, a, b) for a, b in cols])
        self.proj_w = slicer.part(f"{p}.attn.c_proj.weight", (h, h), 0, lo, lo + w)
        self.proj_b = slicer.whole(f"{p}.attn.c_proj.bias", (h,))
        inner = _mlp_width(config, "gpt2")
        a, b = even_range(inner, k, r)
        self.fc_w, self.fc_b = (
            slicer.part(f"{p}.mlp.c_fc.weight", (h, inner), 1, a, b),
            slicer.part(f"{p}.mlp.c_fc.bias", (inner,), 0, a, b),
        )
        self.out_w, self.out_b = (
            slicer.part(f"{p}.mlp.c_proj.weight", (inner, h), 0, a, b),
            slicer.whole(f"{p}.mlp.c_proj.bias", (h,)),
        )
        self.act = ACT2FN[config.activation_function]

    def __call__(self, x: torch.Tensor, cache: dict, context: dict[str, Any]) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = (
            x_.view(batch, tokens, self.heads, self.d).transpose(1, 2)
            for x_ in (self.ln_1(x) @ self.qkv_w + self.qkv_b).split(self.heads * self.d, dim=2)
        )
        attn = _attend(q, k, v, context["mask"], cache, self.layer, 1) @ self.proj_w
        x = x + self.ops.all_reduce_(attn) + self.proj_b
        up = self.act(self.ln_2(x) @ self.fc_w + self.fc_b) @ self.out_w
        return x + self.ops.all_reduce_(up) + self.out_b


class LlamaBlockShard:
    """LlamaDecoderLayer's computation on 1/k of the heads (and KV heads) and of the MLP width."""

    def __init__(self, config, layer: int, ops, slicer: _Slicer):
        from transformers.activations import ACT2FN
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        h, heads, k, r = int(config.hidden_size), int(config.num_attention_heads), ops.size, ops.index
        kv = int(config.num_key_value_heads or heads)
        self.layer, self.ops = layer, ops
        self.d = int(getattr(config, "head_dim", None) or h // heads)
        self.heads, self.kv, self.rep = heads // k, kv // k, heads // kv
        p = f"model.layers.{layer}"
        with torch.device("meta"):
            norms = [LlamaRMSNorm(h, eps=config.rms_norm_eps) for _ in range(2)]
        self.norm_1, self.norm_2 = (
            slicer.module(norms[0], f"{p}.input_layernorm"),
            slicer.module(norms[1], f"{p}.post_attention_layernorm"),
        )
        qa, qb = r * self.heads * self.d, (r + 1) * self.heads * self.d
        ka, kb = r * self.kv * self.d, (r + 1) * self.kv * self.d
        rows = {"q_proj": (heads * self.d, qa, qb), "k_proj": (kv * self.d, ka, kb), "v_proj": (kv * self.d, ka, kb)}
        self.w = {n: slicer.part(f"{p}.self_attn.{n}.weight", (out, h), 0, a, b) for n, (out, a, b) in rows.items()}
        self.b = (
            {n: slicer.part(f"{p}.self_attn.{n}.bias", (out,), 0, a, b) for n, (out, a, b) in rows.items()}
            if getattr(config, "attention_bias", False)
            else {}
        )
        self.o_w = slicer.part(f"{p}.self_attn.o_proj.weight", (h, heads * self.d), 1, qa, qb)
        self.o_b = (
            slicer.whole(f"{p}.self_attn.o_proj.bias", (h,)) if getattr(config, "attention_bias", False) else None
        )
        inner = int(config.intermediate_size)
        a, b = even_range(inner, k, r)
        mlp_bias = getattr(config, "mlp_bias", False)
        for n in ("gate_proj", "up_proj"):
            self.w[n] = slicer.part(f"{p}.mlp.{n}.weight", (inner, h), 0, a, b)
            if mlp_bias:
                self.b[n] = slicer.part(f"{p}.mlp.{n}.bias", (inner,), 0, a, b)
        self.down_w = slicer.part(f"{p}.mlp.down_proj.weight", (h, inner), 1, a, b)
        self.down_b = slicer.whole(f"{p}.mlp.down_proj.bias", (h,)) if mlp_bias else None
        self.act = ACT2FN[config.hidden_act]

    def _proj(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w[name], self.b.get(name))

    def __call__(self, x: torch.Tensor, cache: dict, context: dict[str, Any]) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, tokens, _ = x.shape
        y = self.norm_1(x)
        q = self._proj("q_proj", y).view(batch, tokens, self.heads, self.d).transpose(1, 2)
        k = self._proj("k_proj", y).view(batch, tokens, self.kv, self.d).transpose(1, 2)
        v = self._proj("v_proj", y).view(batch, tokens, self.kv, self.d).transpose(1, 2)
        cos, sin = context["position_embeddings"]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        attn = self.ops.all_reduce_(F.linear(_attend(q, k, v, context["mask"], cache, self.layer, self.rep), self.o_w))
        x = x + (attn if self.o_b is None else attn + self.o_b)
        y = self.norm_2(x)
        down = self.ops.all_reduce_(
            F.linear(self.act(self._proj("gate_proj", y)) * self._proj("up_proj", y), self.down_w)
        )
        return x + (down if self.down_b is None else down + self.down_b)


# ----------------------------------------------------------------------------
# Embedding and LM head, split by vocabulary


class EmbedShard:
    """The member's rows of the token table; the position table (GPT-2) whole."""

    def __init__(self, config, table: str, positions: str | None, ops, slicer: _Slicer):
        vocab, h = int(config.vocab_size), int(config.hidden_size)
        self.ops = ops
        self.lo, self.hi = even_range(vocab, ops.size, ops.index)
        self.rows = slicer.part(table, (vocab, h), 0, self.lo, self.hi)
        self.positions = slicer.whole(positions, (int(config.max_position_embeddings), h)) if positions else None

    def __call__(self, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.lo
        outside = (local < 0) | (local >= self.hi - self.lo)
        out = F.embedding(local.clamp(0, self.hi - self.lo - 1), self.rows).masked_fill(outside[..., None], 0.0)
        out = self.ops.all_reduce_(out)
        return out if self.positions is None else out + F.embedding(position_ids, self.positions)


class HeadShard:
    """The member's rows of the LM head; returns the global greedy token of each row."""

    def __init__(self, config, name: str, ops, slicer: _Slicer):
        vocab, h = int(config.vocab_size), int(config.hidden_size)
        self.ops = ops
        self.lo, self.hi = even_range(vocab, ops.size, ops.index)
        self.rows = slicer.part(name, (vocab, h), 0, self.lo, self.hi)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden[:, -1, :], self.rows).to(torch.float32)
        index = torch.argmax(logits, dim=-1)
        mine = torch.stack(
            [logits.gather(1, index[:, None])[:, 0], (index + self.lo).to(torch.float32)], dim=1
        )  # [B, 2]
        every = self.ops.all_gather(mine)  # [k, B, 2], members in vocabulary order
        best = every[:, :, 0].max(dim=0).values
        first = torch.argmax((every[:, :, 0] == best).to(torch.int8), dim=0)  # the first member holding the maximum
        return every[first, torch.arange(every.shape[1]), 1].to(torch.long)


class Unconnected:
    """Member 0 of a group of `size` timed alone (profiling): its collectives do nothing; the cost model
    adds them from the link (llm_planner.cost.collective_pieces)."""

    index = 0

    def __init__(self, size: int):
        self.size = size

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float32).expand(self.size, *t.shape)


def build_shard(task: str, config, family: str, ops, source, *, dtype: torch.dtype, device: torch.device):
    """The member's callable for `task` (embed, block.i or lm_head; final_norm is replicated)."""
    slicer = _Slicer(source, dtype=dtype, device=device)
    if task.startswith("block."):
        block = GPT2BlockShard if family == "gpt2" else LlamaBlockShard
        return block(config, int(task.split(".")[1]), ops, slicer)
    if task == "embed":
        if family == "gpt2":
            return EmbedShard(config, "transformer.wte.weight", "transformer.wpe.weight", ops, slicer)
        return EmbedShard(config, "model.embed_tokens.weight", None, ops, slicer)
    assert task == "lm_head", task
    return HeadShard(config, "lm_head.weight", ops, slicer)
