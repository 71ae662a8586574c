"""One member's share of a decoder task on a tensor-parallel group, built from the declared layout.

The layout is the one the planner costs, llm_planner.graph.tp_layout: which weights of a task
split by column, by row or by vocabulary, which are replicated, and the collectives a call
makes. Nothing here is written per model family but `_stored`, the table that says where a
family keeps each declared weight in its checkpoint (GPT-2 fuses q, k and v into one Conv1D
and stores its linears as (in, out)). A member reads exactly `TPWeight.member_range` of each
tensor (`source.tensor_slice`) and wires the primitives of llm_planner.runtime.tp_primitives:

    block:       attention: norm, ColumnParallelLinear(q, k, v), rotary (llama), attention over
                 the member's heads (its KV cache holds its KV heads), RowParallelLinear(o): one
                 all-reduce, then the bias (qwen3_moe: each query and key head normed first);
                 MLP: norm, ColumnParallelLinear(gate, up), activation (times up when gated),
                 RowParallelLinear(down): one all-reduce; a mixture of experts' MLP instead:
                 norm, the router whole and a slice of every expert (runtime.moe_layers): one
                 all-reduce.
    embed:       VocabParallelEmbedding(tokens): one all-reduce; learned positions replicated.
    lm_head:     VocabParallelArgmax(head): one all-gather of each member's (largest logit, index).
    final_norm:  replicated (llm_planner.runtime.gpt builds it whole).

The group's collectives come from `ops` (llm_planner.runtime.comm.GroupComm under MPI, or any
object with `size`, `index`, `all_reduce_(t)` and `all_gather(t)`).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from llm_planner.graph.tp_layout import task_layout
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.runtime.decoder_tasks import DecoderError
from llm_planner.runtime.ep_moe import ExpertParallelMoE
from llm_planner.runtime.moe_layers import MoEShard, checkpoint_names
from llm_planner.runtime.tp_primitives import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelArgmax,
    VocabParallelEmbedding,
    frozen,
)


@dataclass(frozen=True, kw_only=True)
class Stored:
    """Where a family keeps a declared weight: the tensor's name in the whole model, its stored shape
    (None: the declared one), whether it is stored (in, out), and where the declared rows start
    along the split dimension of a tensor that fuses several (GPT-2's c_attn)."""

    name: str
    shape: tuple[int, ...] | None = None
    transposed: bool = False
    offset: int = 0


def _gpt2_block(cfg: DecoderConfig, p: str) -> dict[str, Stored]:
    h, inner = cfg.hidden_size, cfg.intermediate_size
    out = {
        "attn_norm.weight": Stored(name=f"{p}.ln_1.weight"),
        "attn_norm.bias": Stored(name=f"{p}.ln_1.bias"),
        "o": Stored(name=f"{p}.attn.c_proj.weight", shape=(h, h), transposed=True),
        "o.bias": Stored(name=f"{p}.attn.c_proj.bias"),
        "mlp_norm.weight": Stored(name=f"{p}.ln_2.weight"),
        "mlp_norm.bias": Stored(name=f"{p}.ln_2.bias"),
        "up": Stored(name=f"{p}.mlp.c_fc.weight", shape=(h, inner), transposed=True),
        "up.bias": Stored(name=f"{p}.mlp.c_fc.bias"),
        "down": Stored(name=f"{p}.mlp.c_proj.weight", shape=(inner, h), transposed=True),
        "down.bias": Stored(name=f"{p}.mlp.c_proj.bias"),
    }
    for j, n in enumerate(("q", "k", "v")):  # one Conv1D [h, 3h]: q, k, v side by side
        out[n] = Stored(name=f"{p}.attn.c_attn.weight", shape=(h, 3 * h), transposed=True, offset=j * h)
        out[f"{n}.bias"] = Stored(name=f"{p}.attn.c_attn.bias", shape=(3 * h,), offset=j * h)
    return out


def _llama_block(cfg: DecoderConfig, p: str) -> dict[str, Stored]:
    names = {
        "attn_norm.weight": "input_layernorm.weight",
        "mlp_norm.weight": "post_attention_layernorm.weight",
        **{n: f"self_attn.{n}_proj.weight" for n in ("q", "k", "v", "o")},
        **{f"{n}.bias": f"self_attn.{n}_proj.bias" for n in ("q", "k", "v", "o")},
        **{n: f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")},
        **{f"{n}.bias": f"mlp.{n}_proj.bias" for n in ("gate", "up", "down")},
    }
    if cfg.qk_norm:
        names.update({f"{n}_norm.weight": f"self_attn.{n}_norm.weight" for n in ("q", "k")})
    out = {k: Stored(name=f"{p}.{v}") for k, v in names.items()}
    if cfg.is_moe:
        out.update({k: Stored(name=v) for k, v in checkpoint_names(cfg, p).items()})
    return out


def _stored(family: str, cfg: DecoderConfig, kind: str, layer: int | None) -> dict[str, Stored]:
    """Where `family` keeps each weight that the layout of `kind` may declare."""
    if kind == "block":
        block = _gpt2_block if family == "gpt2" else _llama_block
        return block(cfg, f"transformer.h.{layer}" if family == "gpt2" else f"model.layers.{layer}")
    if kind == "embed":
        if family == "gpt2":
            return {"tokens": Stored(name="transformer.wte.weight"), "positions": Stored(name="transformer.wpe.weight")}
        return {"tokens": Stored(name="model.embed_tokens.weight")}
    assert kind == "lm_head", kind
    return {"head": Stored(name="lm_head.weight")}


READ_THREADS = 4  # at most: each thread holds a whole fp32 tensor before it slices it


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks on this OS
        return os.cpu_count() or 1


class _Slicer:
    """Reads parts of parameters named as in the whole model, in the shard's dtype and device."""

    def __init__(self, source, *, dtype: torch.dtype, device: torch.device):
        self.source, self.dtype, self.device = source, dtype, device

    def part(self, name: str, shape: tuple[int, ...], dim: int, start: int, stop: int) -> torch.Tensor:
        return self.source.tensor_slice(name, torch.Size(shape), dim, start, stop).to(
            device=self.device, dtype=self.dtype
        )

    def parts(self, requests: list[tuple]) -> list[torch.Tensor]:
        """`part(*r)` of each request, in order; drawn on several threads when the source allows
        (seeded weights: each tensor's own generator, so the values do not depend on the order)."""
        if not getattr(self.source, "thread_safe", False) or len(requests) < 2:
            return [self.part(*r) for r in requests]
        with ThreadPoolExecutor(min(len(requests), _cores(), READ_THREADS)) as pool:
            return list(pool.map(lambda r: self.part(*r), requests))


def member_tensors(
    task: str, cfg: DecoderConfig, family: str, k: int, index: int, source, *, dtype: torch.dtype, device, keep=None
) -> dict[str, torch.Tensor]:
    """Member `index` of k's part of every weight that the layout of `task` declares, in torch's (out, in)
    layout: `TPWeight.member_range` along the split dimension, read where `family` stores the weight;
    `keep(name)` False leaves a weight out (a data-parallel member's experts: llm_planner.runtime.ep_moe)."""
    kind = _kind(task)
    stored = _stored(family, cfg, kind, int(task.split(".")[1]) if kind == "block" else None)
    slicer = _Slicer(source, dtype=dtype, device=device)
    weights = [w for w in task_layout(cfg, kind).weights if keep is None or keep(w.name)]
    requests = []
    for w in weights:
        s = stored[w.name]
        lo, hi = w.member_range(k, index)
        dim = w.dim or 0
        requests.append((s.name, s.shape or w.shape, 1 - dim if s.transposed else dim, s.offset + lo, s.offset + hi))
    out = {}
    for w, t in zip(weights, slicer.parts(requests)):
        out[w.name] = t.t().contiguous() if stored[w.name].transposed else t
        assert tuple(out[w.name].shape) == w.member_shape(k, index), (w.name, tuple(out[w.name].shape))
    return out


def _kind(task: str) -> str:
    """The layout kind of a decoder task that has a tensor-parallel share (embed, block.i, lm_head)."""
    kind = "block" if task.startswith("block.") else task
    if kind not in ("block", "embed", "lm_head"):
        raise DecoderError(f"task {task!r}: no tensor-parallel share (final_norm is replicated)")
    return kind


def check_divisible(config: DecoderConfig, k: int, kinds: tuple[str, ...] = ("block",)) -> None:
    """DecoderError unless the counts the layouts of `kinds` split (heads, KV heads, MLP width) split k ways."""
    bad = [count for kind in kinds for count in task_layout(config, kind).cannot_split(k)]
    if bad:
        raise DecoderError(f"a tensor-parallel group of {k} cannot split {', '.join(bad)}")


def check_runs_on_groups(hf_config, family: str) -> None:
    """DecoderError for the configurations whose attention these shares do not compute."""
    if family == "gpt2" and (
        getattr(hf_config, "scale_attn_by_inverse_layer_idx", False)
        or getattr(hf_config, "reorder_and_upcast_attn", False)
    ):
        raise DecoderError(
            "GPT-2 configs with scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn run on single devices only"
        )


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


class _Norm(torch.nn.Module):
    """A replicated norm: LayerNorm (scale and shift) or RMSNorm (scale; as transformers' LlamaRMSNorm)."""

    def __init__(self, cfg: DecoderConfig, t: dict[str, torch.Tensor], name: str):
        super().__init__()
        self.kind, self.eps = cfg.norm, float(cfg.norm_eps)
        self.weight, self.bias = (frozen(t.get(f"{name}.{p}")) for p in ("weight", "bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        y = x.to(torch.float32)
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return y if self.weight is None else self.weight * y


class BlockShard(torch.nn.Module):
    """A decoder block on 1/k of the heads (and KV heads) and of the MLP width, or of every expert's
    width in a mixture of experts (llm_planner.runtime.moe_layers; `renormalise`: its routing rule)."""

    def __init__(
        self, cfg: DecoderConfig, layer: int, t: dict[str, torch.Tensor], ops, *, renormalise=None, expert_ops=None
    ):
        """`expert_ops`: the group a data-parallel member splits the experts over (llm_planner.runtime.ep_moe;
        `ops` is then a group of one), else None."""
        from transformers.activations import ACT2FN

        super().__init__()
        if not cfg.pre_norm:
            raise DecoderError(f"model {cfg.name!r}: tensor-parallel blocks run pre-norm decoders only")
        k, self.layer = ops.size, layer
        self.heads, self.kv, self.d = cfg.num_heads // k, cfg.num_kv_heads // k, cfg.head_dim
        self.rep, self.rotary = cfg.num_heads // cfg.num_kv_heads, not cfg.learned_positions
        self.attn_norm, self.mlp_norm = _Norm(cfg, t, "attn_norm"), _Norm(cfg, t, "mlp_norm")
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:  # each head's query and key (qwen3_moe), before the rotary embedding
            self.q_norm, self.k_norm = _Norm(cfg, t, "q_norm"), _Norm(cfg, t, "k_norm")
        qkv = ("q", "k", "v")
        self.qkv = ColumnParallelLinear([t[n] for n in qkv], [t.get(f"{n}.bias") for n in qkv])
        self.o = RowParallelLinear(t["o"], t.get("o.bias"), ops)
        if cfg.is_moe:
            if renormalise is None:
                raise DecoderError(f"model {cfg.name!r}: an MoE block needs its routing rule (renormalise)")
            if expert_ops is not None:
                self.moe = ExpertParallelMoE(cfg, t, expert_ops, renormalise=renormalise)
            else:
                self.moe = MoEShard(cfg, t, ops, renormalise=renormalise)
            return
        self.moe = None
        ups = ("gate", "up") if cfg.gated_mlp else ("up",)
        self.up = ColumnParallelLinear([t[n] for n in ups], [t.get(f"{n}.bias") for n in ups])
        self.down = RowParallelLinear(t["down"], t.get("down.bias"), ops)
        self.act = ACT2FN[cfg.activation]

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [..., heads or KV heads, d] of x [..., h], the query and key norms applied."""
        parts = zip(self.qkv(self.attn_norm(x)), (self.heads, self.kv, self.kv))
        q, k, v = (y.unflatten(-1, (n, self.d)) for y, n in parts)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP sublayer's output (the residual not added), one all-reduce."""
        x = self.mlp_norm(x)
        if self.moe is not None:
            return self.moe(x)
        parts = self.up(x)
        inner = self.act(parts[0]) * parts[1] if len(parts) == 2 else self.act(parts[0])
        return self.down(inner)

    def forward(self, x: torch.Tensor, cache: dict, context: dict[str, Any]) -> torch.Tensor:
        q, k, v = (y.transpose(1, 2) for y in self.split_heads(x))
        if self.rotary:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            q, k = apply_rotary_pos_emb(q, k, *context["position_embeddings"])
        x = x + self.o(_attend(q, k, v, context["mask"], cache, self.layer, self.rep))
        return x + self.mlp(x)


class EmbedShard(torch.nn.Module):
    """The member's vocabulary rows of the token table; the learned positions (GPT-2) whole."""

    def __init__(self, t: dict[str, torch.Tensor], lo: int, ops):
        super().__init__()
        self.tokens = VocabParallelEmbedding(t["tokens"], lo, ops)
        self.positions = frozen(t.get("positions"))

    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        out = self.tokens(ids)
        return out if self.positions is None else out + F.embedding(position_ids, self.positions)


class Unconnected:
    """Member 0 of a group of `size` timed alone (profiling): its collectives do nothing; the cost model
    adds them from the link (llm_planner.cost.roofline.collective_pieces)."""

    index = 0

    def __init__(self, size: int):
        self.size = size

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float32).expand(self.size, *t.shape)

    def all_gather_v(self, t: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return t.to(torch.float32)

    def reduce_scatter_v(self, t: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return t


def build_shard(task: str, cfg: DecoderConfig, family: str, ops, source, *, dtype: torch.dtype, device: torch.device):
    """The member's callable for `task` (embed, block.i or lm_head; final_norm is replicated), from its layout."""
    kind = _kind(task)
    check_divisible(cfg, ops.size, (kind,))
    t = member_tensors(task, cfg, family, ops.size, ops.index, source, dtype=dtype, device=device)
    if kind == "block":
        return BlockShard(cfg, int(task.split(".")[1]), t, ops)
    layout = task_layout(cfg, kind)
    lo, _ = layout.weight("tokens" if kind == "embed" else "head").member_range(ops.size, ops.index)
    return EmbedShard(t, lo, ops) if kind == "embed" else VocabParallelArgmax(t["head"], lo, ops)
