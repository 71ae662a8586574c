"""A placement task's time pieces on a device or a tensor-parallel group: which model times it.

Decoder layers are timed by the kernel model the serving planner uses (llm_planner.cost.iteration),
everything else by its task roofline (llm_planner.cost.roofline):

- a decoder layer task of a graph llm_planner.graph.decoder_graph built (role "block", or its
  sublayers' "attn" and "mlp" at granularity "sublayer") runs, per sample (one sequence), the
  load of its phase (T tokens, C keys per layer as the graph's docstring counts them, L = seq_len):

      decode step:  Load(decodes = 1, decode_keys = L)                    T = 1, C = L
      prefill:      Load(prompt_tokens = L, prompt_keys = L (L + 1) / 2)  T = L, C = L (L + 1) / 2

  and for b samples the load times b. Its time is the sum of its kernels (linear layers on all
  b T tokens with the weights read once, decode attention over the caches, prompt attention,
  elementwise ops; on a group of k the kernel model's split and its all-reduces, one per sublayer,
  each the kind's per-call collective overhead plus 2 (k - 1) link latencies and the ring's bytes),
  each its own rounded roofline; `layer_pieces.layer_pieces` gives its pieces, the exact upper
  envelope of that sum, so every solver, bound and the verifier read it as any max-of-affine
  task time;
- embed, final_norm, lm_head, and the tasks of other graphs (fx, randomly wired, workload files):
  the task's roofline (`roofline.group_task_time_pieces`), as the serving planner times a
  decoder's end parts.

A graph's decoder is taken from its meta (decoder_config, phase, seq_len, dtype) only where the
meta's dtype is the problem's; a layer task whose FLOPs per sample are not the kernel model's
(a graph file edited after it was built) keeps its roofline, with a warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from llm_planner.core.spec import DeviceKindSpec, LinkSpec
from llm_planner.cost.iteration import SUBLAYERS, Load, layer_flops, layer_kernels, sublayer_kernels
from llm_planner.cost.layer_pieces import layer_pieces
from llm_planner.cost.roofline import CostError, Piece, group_task_time_pieces, task_supported
from llm_planner.graph.ir import GraphError, Task, TaskGraph
from llm_planner.graph.transformer import DecoderConfig

log = logging.getLogger(__name__)

LAYER_ROLE = "block"  # the role label of a whole decoder layer's task (llm_planner.graph.decoder_graph)
LAYER_ROLES = (LAYER_ROLE, *SUBLAYERS)  # a layer, or one of its sublayers


@dataclass(frozen=True, kw_only=True)
class DecoderLoad:
    """A decoder graph's layers, as the kernel model reads them: the config, the load one sample
    puts on one layer, the dtype of weights, activations and KV cache, and the tasks it times with
    the role of each (LAYER_ROLES; module docstring)."""

    config: DecoderConfig
    per_sample: Load
    dtype: str
    layers: Mapping[str, str]  # task name -> its role


def sample_load(phase: str, seq_len: int) -> Load:
    """One sequence's load on one layer of a decoder graph of `phase` at `seq_len` (module docstring)."""
    if phase == "decode":
        return Load(decodes=1.0, decode_keys=float(seq_len))
    return Load(prompt_tokens=float(seq_len), prompt_keys=seq_len * (seq_len + 1) / 2)


def decoder_load(graph: TaskGraph, dtype: str) -> DecoderLoad | None:
    """The decoder behind `graph`'s layer tasks; None for a graph no decoder builder made, or one
    whose dtype is not `dtype` (module docstring). Raises CostError for a malformed meta."""
    meta = graph.meta_dict()
    if "decoder_config" not in meta or meta.get("dtype") != dtype:
        return None
    phase, seq_len = meta.get("phase"), meta.get("seq_len")
    if phase not in ("decode", "prefill") or isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise CostError(
            f"graph {graph.name!r}: meta phase must be 'decode' or 'prefill' and seq_len a positive integer, "
            f"got {phase!r} and {seq_len!r}"
        )
    try:
        config = DecoderConfig(**meta["decoder_config"])
    except (GraphError, TypeError) as exc:
        raise CostError(f"graph {graph.name!r}: meta decoder_config: {exc}") from None
    per_sample = sample_load(phase, seq_len)
    flops = {role: layer_flops(config, dtype, per_sample, None if role == LAYER_ROLE else role) for role in LAYER_ROLES}
    roles = {t.name: t.label("role") for t in graph.tasks if t.label("role") in LAYER_ROLES and not t.time_s_by_kind}
    layers = {n: r for n, r in roles.items() if math.isclose(graph.task(n).flops_per_sample, flops[r], rel_tol=1e-9)}
    if len(layers) < len(roles):
        others = [n for n in roles if n not in layers]
        log.warning(
            "graph %r: %d layer tasks (%s) do not have the FLOPs per sample of their part of a layer of %s; "
            "they are timed by their roofline",
            graph.name,
            len(others),
            ", ".join(others[:3]) + (", ..." if len(others) > 3 else ""),
            config.name,
        )
    return DecoderLoad(config=config, per_sample=per_sample, dtype=dtype, layers=layers)


def placement_task_pieces(
    task: Task, kind: DeviceKindSpec, k: int, link: LinkSpec | None, dtype: str, decoder: DecoderLoad | None
) -> tuple[Piece, ...]:
    """Affine pieces whose maximum is `task`'s time for b >= 1 samples on a device of `kind` (k = 1)
    or on a group of k whose collectives cross `link`: the kernel model for a layer task of
    `decoder` (`decoder_load`), the roofline otherwise (module docstring). Raises CostError as those do."""
    role = None if decoder is None else decoder.layers.get(task.name)
    if role is None:
        return group_task_time_pieces(task, kind, k, link, dtype)
    if not task_supported(task, kind):
        raise CostError(f"task {task.name!r} cannot run on device kind {kind.name!r}")
    return _layer_pieces(decoder.config, decoder.per_sample, decoder.dtype, role, kind, k, link if k > 1 else None)


@lru_cache(maxsize=1024)
def _layer_pieces(
    config: DecoderConfig, per_sample: Load, dtype: str, role: str, kind: DeviceKindSpec, k: int, link: LinkSpec | None
) -> tuple[Piece, ...]:
    if role == LAYER_ROLE:
        return layer_pieces(layer_kernels(config, dtype, kind, k, link), per_sample)
    return layer_pieces(sublayer_kernels(config, dtype, kind, role, k, link), per_sample)
