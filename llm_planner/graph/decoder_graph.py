"""The task graph of a GPT-style decoder and its analytic costs: no torch needed.

A decoder becomes a chain  embed -> block.0 .. block.{n-1} -> final_norm -> lm_head
(granularity "block"), or with each block split into block.{i}.attn -> block.{i}.mlp
(granularity "sublayer"); the first `first_dense_layers` blocks (DeepSeek's) with a dense MLP,
the rest with experts. Multi-head latent attention's costs are llm_planner.graph.mla's.
Costs per sequence (a "sample"), with L = seq_len, T tokens in flight (T = L for "prefill",
T = 1 for "decode" with a context of L tokens), b bytes per element, a = nh * hd the
attention width, kv = nkv * hd, C the keys a query sees:

    flops_per_sample     = 2 * P_matmul * T  +  4 * a * sum(C) per layer
                           prefill: sum(C) = L (L + 1) / 2 (causal), decode: sum(C) = L
                           (Kaplan et al. 2020, "Scaling laws for neural language models",
                           table 1: C_fwd = 2N + 2 n_layer n_ctx d_attn; Narayanan et al.
                           2021, "Efficient large-scale language model training on GPU
                           clusters using Megatron-LM", sec. 5.1: 4 B s^2 h per layer for
                           QK^T and AV, halved here for causal masking). Elementwise ops
                           (norms, biases, activations, softmax) are left out: O(h) per
                           token against O(h^2); their traffic is in bytes_per_sample.
                           lm_head projects only the last position (all greedy decoding
                           needs), so its FLOPs are 2 * V * d_word per sequence.
    bytes_per_sample     = b * T * sum over ops of (elements read + written per token),
                           each op unfused, attention core fused (FlashAttention, Dao et
                           al. 2022: the L x L scores never reach memory); decode adds the
                           KV-cache read 2 * kv * L * b per layer. Weights are not here.
    mem_bytes_per_sample = 2 * kv * L * b per layer (its KV cache), on block / attn tasks.
    weight_bytes         = parameters of the task * b; a tied embedding is carried by both
                           embed and lm_head, so the task sum exceeds num_params by V * d_word.

On a tensor-parallel group each task splits as its layout in llm_planner.graph.tp_layout
declares (which weights split by column, by row, by vocabulary, which are replicated, which
collectives a call makes); `tp_layout.tp_fields` turns it into the task's `tp_` fields, and the
runtime builds a member's share from the same declaration.

The configurations (presets, config files, transformers configs) and the exact parameter
counts are in llm_planner.graph.transformer; docs/models.md has the presets and the formulas.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from llm_planner.core.constants import DTYPE_BYTES, GRANULARITIES, PHASES
from llm_planner.graph.attention_window import check_window
from llm_planner.graph.ir import Edge, GraphError, Task, TaskGraph
from llm_planner.graph.mla import (
    decode_flops_per_key,
    decode_io_per_token,
    kv_elements_per_token,
    member_traffic,
    prefill_flops_per_key,
    prefill_io_per_token,
)
from llm_planner.graph.moe import shared_gate
from llm_planner.graph.tp_layout import KINDS, task_layout, tp_fields
from llm_planner.graph.transformer import DecoderConfig, count_parameters, matmul_parameters, part_parameters

ID_BYTES = 8  # token ids are int64


def _traffic_per_token(cfg: DecoderConfig, decode: bool) -> dict[str, int]:
    """Elements read + written per token in flight by each part, op by op (no fusion but attention)."""
    h, a, kv, dw = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.word_embed_dim
    norm, residual = 2 * h, 3 * h
    rope = 2 * (a + kv) if not cfg.learned_positions else 0  # rotate q and k
    core = 2 * a + 2 * kv  # prefill: read q, k, v, write o; decode: read q, write the new k, v to the cache, write o
    attn = norm + (h + a + 2 * kv) + rope + core + (a + h) + residual + (2 * kv if not decode else 0)  # + cache write
    return {
        "embed": dw + (dw + h if dw != h else 0) + (2 * h if cfg.learned_positions else 0),  # gather, project_in, + pos
        "attn": _mla_traffic(cfg, decode) if cfg.is_mla else attn,
        "mlp": norm + _mlp_traffic(cfg) + residual,
        "final_norm": norm * cfg.final_norm + (h + dw if dw != h else 0),
    }


def _mla_traffic(cfg: DecoderConfig, decode: bool) -> float:
    """Elements a token's latent attention reads and writes (llm_planner.graph.mla), one device."""
    io, elementwise = member_traffic(cfg, 1)
    core = decode_io_per_token(cfg, 1) if decode else prefill_io_per_token(cfg, 1) + kv_elements_per_token(cfg)
    return 2 * cfg.hidden_size + io + elementwise + core + 3 * cfg.hidden_size  # norm, ..., residual


def _mlp_traffic(cfg: DecoderConfig) -> float:
    """Elements a token's MLP projections and activation read and write (an MoE layer: the router's
    input and scores, and per expert it goes to, top-k and shared, a dense MLP of that width)."""
    h = cfg.hidden_size

    def dense(inner: int) -> int:  # up (and gate), the activation, down
        up = inner * (2 if cfg.gated_mlp else 1)
        return (h + up) + (up + inner) + (inner + h)

    if not cfg.is_moe:
        return dense(cfg.intermediate_size)
    shared = dense(cfg.shared_expert_size) + (h + 1) * shared_gate(cfg) if cfg.shared_expert_size else 0
    return (h + cfg.num_experts) + cfg.experts_per_token * dense(cfg.moe_intermediate_size) + shared


def _layer_costs(cfg: DecoderConfig, phase: str, seq_len: int, dtype_bytes: int) -> dict[str, dict[str, float]]:
    """flops / bytes / weight / mem per sequence of each part (attn and mlp: one layer)."""
    decode = phase == "decode"
    tokens = 1 if decode else seq_len
    a, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    keys = seq_len if decode else seq_len * (seq_len + 1) // 2  # sum over queries of the keys each sees
    matmul, params, traffic = matmul_parameters(cfg), part_parameters(cfg), _traffic_per_token(cfg, decode)
    kv_cache = (kv_elements_per_token(cfg) if cfg.is_mla else 2 * kv) * seq_len * dtype_bytes
    if cfg.is_mla:
        per_key = decode_flops_per_key(cfg, 1) if decode else prefill_flops_per_key(cfg, 1)
    else:
        per_key = 4.0 * a
    out = {}
    for part in ("embed", "attn", "mlp", "final_norm"):
        out[part] = {
            "flops": 2.0 * matmul[part] * tokens,
            "bytes": float(traffic[part] * tokens * dtype_bytes),
            "weight": float(params[part] * dtype_bytes),
            "mem": 0.0,
        }
    out["embed"]["bytes"] += ID_BYTES * tokens
    out["attn"]["flops"] += per_key * keys
    out["attn"]["bytes"] += kv_cache if decode else 0.0
    out["attn"]["mem"] = float(kv_cache)
    dw = cfg.word_embed_dim  # lm_head: logits of the last position only
    out["lm_head"] = {
        "flops": 2.0 * matmul["lm_head"],
        "bytes": float((dw + cfg.vocab_size) * dtype_bytes),
        "weight": float(params["lm_head"] * dtype_bytes),
        "mem": 0.0,
    }
    for part, width in _workspace_widths(cfg).items():
        out[part]["workspace"] = float(width * (1 if part == "lm_head" else tokens) * dtype_bytes)
    return out


def _workspace_widths(cfg: DecoderConfig) -> dict[str, int]:
    """Elements per token alive at once at each part's widest point (its input, the widest
    intermediate and what is written from it; the attention core fused, so no L x L scores)."""
    h, a, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    attn = h + a + 2 * kv + a  # the input, q, k and v, the output
    if cfg.is_mla:  # the input, q and its output counted at q's width, k and v decompressed for a prompt
        attn = h + 2 * a + cfg.num_heads * (cfg.head_dim + cfg.v_head_dim)
    inner = cfg.moe_intermediate_size * cfg.experts_per_token if cfg.is_moe else cfg.intermediate_size
    inner = max(inner, cfg.shared_expert_size)
    up = inner * (2 if cfg.gated_mlp else 1)
    return {
        "embed": 2 * h,
        "attn": attn,
        "mlp": h + up + inner + cfg.num_experts,
        "final_norm": 2 * h,
        "lm_head": cfg.word_embed_dim + cfg.vocab_size,
    }


def _task(name: str, role: str, cost: dict[str, float], tp: dict[str, Any], layer: int | None = None) -> Task:
    labels: tuple[tuple[str, Any], ...] = (("role", role),) + ((("layer", layer),) if layer is not None else ())
    tp = dict(tp)
    for key, whole in (
        ("tp_replicated_weight_bytes", cost["weight"]),
        ("tp_replicated_bytes_per_sample", cost["bytes"]),
        ("tp_replicated_mem_bytes_per_sample", cost["mem"]),
    ):
        if key in tp and tp[key] is None:  # replicated entirely
            tp[key] = whole
    return Task(
        name=name,
        kind=role,
        flops_per_sample=cost["flops"],
        bytes_per_sample=cost["bytes"],
        weight_bytes=cost["weight"],
        mem_bytes_per_sample=cost["mem"],
        workspace_bytes_per_sample=cost["workspace"],
        labels=labels,
        **tp,
    )


def _costs_and_layouts(cfg: DecoderConfig, phase: str, seq_len: int, b: int) -> tuple[dict, dict]:
    """Each part's costs per sequence (_layer_costs) and tensor-parallel fields of a configuration
    whose layers are alike (one of the dense first layers, or the rest)."""
    tokens = 1 if phase == "decode" else seq_len
    tp = {kind: tp_fields(task_layout(cfg, kind), tokens=tokens, dtype_bytes=b) for kind in KINDS}
    return _layer_costs(cfg, phase, seq_len, b), tp


def build_decoder_graph(config: DecoderConfig, *, phase: str, seq_len: int, granularity: str, dtype: str) -> TaskGraph:
    """The chain embed -> block.i (or block.i.attn -> block.i.mlp) -> final_norm -> lm_head."""
    if phase not in PHASES:
        raise GraphError(f"model {config.name!r}: phase must be one of {PHASES}, got {phase!r}")
    if granularity not in GRANULARITIES:
        raise GraphError(f"model {config.name!r}: granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if dtype not in DTYPE_BYTES:
        raise GraphError(f"model {config.name!r}: dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise GraphError(f"model {config.name!r}: seq_len must be a positive integer, got {seq_len!r}")
    if config.learned_positions and seq_len > config.max_positions:
        raise GraphError(
            f"model {config.name!r}: seq_len {seq_len} exceeds its {config.max_positions} learned positions"
        )
    check_window(config, seq_len, f"seq_len {seq_len} tokens")
    b = DTYPE_BYTES[dtype]
    tokens = 1 if phase == "decode" else seq_len
    moe = _costs_and_layouts(config, phase, seq_len, b)
    dense = _costs_and_layouts(config.dense_layer(), phase, seq_len, b) if config.first_dense_layers else moe
    ends, end_tp = moe  # embed, final_norm and lm_head: the same in both
    tasks = [_task("embed", "embed", ends["embed"], end_tp["embed"])]
    for i in range(config.num_layers):
        c, tp = dense if i < config.first_dense_layers else moe
        if granularity == "block":
            block = {k: c["attn"][k] + c["mlp"][k] for k in c["attn"]}
            block["workspace"] = max(c["attn"]["workspace"], c["mlp"]["workspace"])  # one sublayer at a time
            tasks.append(_task(f"block.{i}", "block", block, tp["block"], i))
        else:
            tasks += [
                _task(f"block.{i}.attn", "attn", c["attn"], tp["attn"], i),
                _task(f"block.{i}.mlp", "mlp", c["mlp"], tp["mlp"], i),
            ]
    tasks += [
        _task("final_norm", "final_norm", ends["final_norm"], end_tp["final_norm"]),
        _task("lm_head", "lm_head", ends["lm_head"], end_tp["lm_head"]),
    ]
    widths = [config.hidden_size] * (len(tasks) - 2) + [
        config.word_embed_dim
    ]  # final_norm -> lm_head: after project_out
    edges = tuple(
        Edge(src=s.name, dst=d.name, bytes_per_sample=float(tokens * w * b))
        for s, d, w in zip(tasks, tasks[1:], widths)
    )
    meta = (
        ("model", config.name),
        ("model_type", config.model_type),
        ("num_layers", config.num_layers),
        ("hidden_size", config.hidden_size),
        ("vocab_size", config.vocab_size),
        ("num_params", count_parameters(config)),
        ("phase", phase),
        ("seq_len", seq_len),
        ("dtype", dtype),
        ("granularity", granularity),
        ("decoder_config", dataclasses.asdict(config)),
    )
    return TaskGraph(name=config.name, tasks=tuple(tasks), edges=edges, meta=meta).validate()
