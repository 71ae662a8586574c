"""The serving verifier's own arithmetic of one replica: its stage times, busy periods, round
trip, TPOT, tokens/s, TTFT and memory per device, from the plan's stated layout (segments,
layers, concurrency, micro-batches), the workload and the cost layer's per-task figures.

It does not call the search's replica model (llm_planner.serving.replica.ReplicaModel: its
evaluation, split and concurrency search), so a defect there shows up as a difference. It takes
from llm_planner.serving the per-(class, degree) tables of llm_planner.serving.costs.StageCosts
(each part's roofline time pieces from llm_planner.cost.roofline, its weight, KV and workspace
bytes per device) and the links between stages (llm_planner.serving.layout.build_slots); the
module docstring of llm_planner.serving.verify lists those as not yet independent.

The steady state (docs/serving.md): micro-batches of sizes differing by at most one, b the
largest; a stage's iteration t_s(b) = step + l block(b) [+ embed(b) first] [+ norm(b) + head(b)
last]; its busy period the sum over the micro-batches; the round trip the stage times at b plus
each hand-off (latency + bytes / bandwidth; hidden states of b sequences and their prompt chunks,
the sampled ids back from the last stage); TPOT the larger of the round trip and the busiest
stage; tokens/s = C / TPOT; TTFT the iterations a prompt's chunks take plus a round trip; memory
per device: layers x (block weights + C KV per layer) + the end parts' weights + the largest
workspace at b sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_planner.serving.context import ServingContext
from llm_planner.serving.layout import Layout, build_slots


@dataclass(frozen=True)
class Derived:
    stage_s: tuple[float, ...]
    busy_s: tuple[float, ...]
    round_trip_s: float
    tpot_s: float
    tokens_per_s: float
    ttft_s: float
    mem_bytes: tuple[float, ...]
    usable_bytes: tuple[float, ...]


def _part_s(costs, part: str, b: int) -> float:
    return costs.part_s(part, b) if b > 0 else 0.0


def _iteration_s(costs, b: int, layers: int, first: bool, last: bool) -> float:
    if b <= 0:
        return 0.0
    t = costs.step_s + layers * _part_s(costs, "block", b)
    if first:
        t += _part_s(costs, "embed", b)
    if last:
        t += _part_s(costs, "final_norm", b) + _part_s(costs, "lm_head", b)
    return t


def _memory(costs, layers: int, first: bool, last: bool, concurrency: int, b: int) -> float:
    weights = costs.weight_bytes
    held = layers * (weights["block"] + concurrency * costs.kv_bytes_per_seq)
    ends = (weights["embed"] if first else 0.0) + ((weights["final_norm"] + weights["lm_head"]) if last else 0.0)
    parts = (["block"] if layers else []) + (["embed"] if first else []) + (["final_norm", "lm_head"] if last else [])
    workspace = max((costs.workspace_bytes_per_seq[p] for p in parts), default=0.0) * b
    return held + ends + workspace


def derive(ctx: ServingContext, layout: Layout, layers: list[int], concurrency: int, m: int) -> Derived:
    """Every figure of one replica (module docstring)."""
    slots = build_slots(layout, ctx.cache, ctx.cluster.inter_node, ctx.between)
    q, r = divmod(concurrency, m)
    sizes = [q + 1] * r + [q] * (m - r)
    b = max(sizes)
    p = len(slots)
    stage, busy, mem, usable = [], [], [], []
    for s, (slot, n) in enumerate(zip(slots, layers)):
        first, last = s == 0, s == p - 1
        stage.append(_iteration_s(slot.costs, b, n, first, last))
        busy.append(sum(_iteration_s(slot.costs, x, n, first, last) for x in sizes))
        mem.append(_memory(slot.costs, n, first, last, concurrency, b))
        usable.append(slot.costs.server_class.kind.usable_mem_bytes)
    tasks = ctx.tasks
    handoff = 0.0
    for s, slot in enumerate(slots):
        nbytes = b * (tasks.return_bytes_per_seq if s == p - 1 else tasks.handoff_bytes_per_seq)
        if slot.link_next is not None and nbytes > 0:
            handoff += slot.link_next.latency_s + nbytes / slot.link_next.bw_bytes_per_s
    trip = sum(stage) + handoff
    tpot = max(trip, max(busy))
    chunk = max(1.0, b * ctx.workload.prefill_per_output)
    prompt = ctx.workload.prefill_per_output * ctx.workload.mean_output_len  # E[P], as the search writes it
    ttft = math.ceil(prompt / chunk) * tpot + trip
    return Derived(
        stage_s=tuple(stage),
        busy_s=tuple(busy),
        round_trip_s=trip,
        tpot_s=tpot,
        tokens_per_s=concurrency / tpot,
        ttft_s=ttft,
        mem_bytes=tuple(mem),
        usable_bytes=tuple(usable),
    )
