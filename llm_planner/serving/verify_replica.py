"""The serving verifier's own arithmetic of one replica: its stage times, busy periods, round
trip, TPOT, tokens/s, TTFT and memory per device, from the plan's stated layout (segments,
layers, concurrency, micro-batches), the workload and the cost layer's per-task figures.

It calls neither the search's replica model (llm_planner.serving.replica.ReplicaModel: its
evaluation, split and concurrency search) nor its stage costs (llm_planner.serving.costs.StageCosts),
so a defect in either shows up as a difference: each part's time on a stage's device or group is
the cost layer's: a decoder layer's kernels evaluated on the iteration's load directly
(llm_planner.cost.iteration.LayerKernels.time_s, not the search's pieces of it; or a measured
block time where llm_planner.serving.layer_time.measured_layer_time, the one rule, applies one),
the end parts' rooflines (llm_planner.cost.roofline.group_task_time_pieces), bytes per member
roofline.shard_of's. It takes from llm_planner.serving the decoder's tasks per sequence in flight
(serving.tasks.build_serving_tasks), the server classes and the links between stages
(llm_planner.serving.layout.build_slots); the module docstring of llm_planner.serving.verify lists
those as not yet independent.

The steady state (docs/serving.md): micro-batches of sizes differing by at most one, b the largest;
a stage's iteration t_s(b) = step + l block(b) [+ embed(b) + d dense(b) first] [+ norm(b) + head(b) last]
(block(b) with the prompt share in the engine's chunks: llm_planner.cost.chunks); its busy period
the sum over the micro-batches; the round trip the stage times at b plus each hand-off (latency +
bytes / bandwidth; hidden states of b sequences and their prompt chunks, the sampled ids back from
the last stage); TPOT the larger of the round trip and the busiest stage; tokens/s = C / TPOT;
TTFT: a mean prompt in chunks of min(E[P], (budget - b) / r) tokens (r the largest data-parallel
attention group's ranks, else 1), one per cycle, each visit at least the steady state's cycle, the
last one's round trip (at least the steady state's, and each chunk's iteration carrying it) yielding
the token, after half a cycle for the micro-batch's next visit where other sequences are in flight
(llm_planner.cost.chunks.next_visit_s) and the wait for the prompts of the b - 1 others
(llm_planner.cost.chunks.prompt_wait_s); memory per device: layers x (block weights +
C KV per layer) + the end parts' weights (and the first stage's d dense layers with their KV) + the
largest workspace at b sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_planner.cost.chunks import next_visit_s, prompt_lumps, prompt_wait_s
from llm_planner.cost.dp_attention import dp_layer_kernels
from llm_planner.cost.iteration import Load, layer_kernels
from llm_planner.cost.roofline import evaluate_pieces, group_task_time_pieces, shard_of
from llm_planner.graph.mla import kv_elements_per_token
from llm_planner.graph.moe import moe_parameters
from llm_planner.serving.classes import DP_ALL2ALL, is_dp
from llm_planner.serving.context import ServingContext
from llm_planner.serving.layer_time import measured_layer_time
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


class _Costs:
    """One (class, degree)'s figures straight from the cost layer: each part's roofline time on the
    group (llm_planner.cost.roofline; a measured block time on one device where a profile has one)
    and what one member holds (roofline.shard_of)."""

    def __init__(self, ctx: ServingContext, class_name: str, degree: int, attention: str = "tp"):
        sc = ctx.by_name[class_name]
        self.step_s, self.usable = sc.kind.serving_step_s, sc.kind.usable_mem_bytes
        (self._data_parallel_parts if is_dp(attention) else self._tensor_parallel_parts)(ctx, sc, degree)
        kernels_of = _kernels_of(sc, degree, attention, ctx.tasks.redundant_experts)
        picks = _replica_chances(ctx) if is_dp(attention) else ctx.tasks.expert_picks  # EPLB's replicas on dpaK
        self.kernels = kernels_of(ctx.config, ctx.precision, ctx.tasks.imbalance_of(degree, attention), picks)
        self.dense_layers = ctx.config.first_dense_layers  # on the first stage, with a dense MLP
        self.ranks = degree if is_dp(attention) else 1  # schedulers the sequences split over
        self.dense = kernels_of(ctx.config.dense_layer(), ctx.precision) if self.dense_layers else None
        tasks = ctx.tasks
        self.measured = None
        if attention == "tp":
            self.measured = measured_layer_time(  # the one rule of where a measured time applies
                ctx.cache.profile, sc.kind, degree, self.kernels, tasks.per_sequence, tasks.hidden_bytes_per_token
            )
        wl = ctx.workload
        self.decode_keys, self.prompt_keys = wl.decode_context, (wl.mean_prompt_len + 1) / 2
        self.ratio, self.prompt_len, self.budget = (
            wl.prefill_per_output,
            wl.mean_prompt_len,
            ctx.options.max_batched_tokens,
        )
        self.steady_prompt_keys = sum(  # per sequence per iteration: its share of each prompt's causal keys
            share / wl.mean_output_len * r.prompt_len * (r.prompt_len + 1) / 2
            for r, share in zip(wl.requests, wl.shares)
        )

    def _tensor_parallel_parts(self, ctx: ServingContext, sc, degree: int) -> None:
        """The end parts' times on the group, and what a member holds (roofline.shard_of; MLA's
        latent cache whole on every member, by its own arithmetic: graph.mla)."""
        tasks = ctx.tasks.tasks
        ends = {part: task for part, task in tasks.items() if part not in ("block", "dense")}  # layers: kernels
        self.pieces = {
            part: group_task_time_pieces(task, sc.kind, degree, sc.intra_link, ctx.dtype) for part, task in ends.items()
        }
        seq = sc.kind.serving_sequence_s  # the engine's own work per sequence, on the head's part
        self.pieces["lm_head"] = tuple((f, s + seq) for f, s in self.pieces["lm_head"])
        member = {part: shard_of(task, degree) if degree > 1 else task for part, task in tasks.items()}
        self.weights = {part: t.weight_bytes for part, t in member.items()}
        self.workspace = {part: t.workspace_bytes_per_sample for part, t in member.items()}
        self.kv = member["block"].mem_bytes_per_sample
        if ctx.config.is_mla:
            self.kv = kv_elements_per_token(ctx.config) * _held(ctx) * ctx.precision.kv_bytes

    def _data_parallel_parts(self, ctx: ServingContext, sc, k: int) -> None:
        """Data-parallel attention (llm_planner.cost.dp_attention), by the verifier's own count: each
        member runs the end parts whole on its 1/k of the sequences and holds every weight whole but
        the routed experts, of which it holds (E + R)/k replicas (R: EPLB's redundant, 0 without),
        the whole caches of its sequences and their workspace."""
        tasks, wb = ctx.tasks.tasks, ctx.precision.weight_bytes
        ends = {part: task for part, task in tasks.items() if part not in ("block", "dense")}
        self.pieces = {
            part: tuple((f, s / k) for f, s in group_task_time_pieces(task, sc.kind, 1, None, ctx.dtype))
            for part, task in ends.items()
        }
        seq = sc.kind.serving_sequence_s / k  # the engine's own work per sequence, each rank on its own
        self.pieces["lm_head"] = tuple((f, s + seq) for f, s in self.pieces["lm_head"])
        self.weights = {part: task.weight_bytes for part, task in tasks.items()}
        e, redundant = ctx.config.num_experts, ctx.tasks.redundant_experts or 0  # EPLB: (E + R) / k replicas held
        self.weights["block"] -= wb * moe_parameters(ctx.config)["experts"] * (1 - (e + redundant) / (e * k))
        self.workspace = {part: task.workspace_bytes_per_sample / k for part, task in tasks.items()}
        self.kv = tasks["block"].mem_bytes_per_sample / k
        if ctx.config.is_mla:
            self.kv = kv_elements_per_token(ctx.config) * _held(ctx) * ctx.precision.kv_bytes / k

    def layer_s(self, b: int, prompt_tokens: float, keys: float | None = None, dense: bool = False) -> float:
        """One decoder layer (one of the dense first layers: `dense`) on b decodes and `prompt_tokens`
        prompt tokens (their queries seeing `keys` keys; default: those of a chunk of the mean prompt)."""
        if keys is None:
            keys = prompt_tokens * self.prompt_keys
        load = Load(decodes=b, decode_keys=b * self.decode_keys, prompt_tokens=prompt_tokens, prompt_keys=keys)
        if dense:
            return self.dense.time_s(load)
        return float(self.measured.load_s(load)) if self.measured is not None else self.kernels.time_s(load)

    def part_s(self, part: str, b: int) -> float:
        if b <= 0:
            return 0.0
        return evaluate_pieces(self.pieces[part], b)

    def steady_layer_s(self, b: int, dense: bool = False) -> float:
        """One decoder layer (a dense first one: `dense`) on b decodes and their prompt share: in the
        engine's chunks on the kernel model (llm_planner.cost.chunks), dense or MoE, spread evenly on
        a measured time (serving.layer_time)."""
        if not dense and self.measured is not None:  # a measured time: spread
            return self.layer_s(b, b * self.ratio, keys=b * self.steady_prompt_keys)  # each sequence's own prompts
        per_token = self.steady_prompt_keys / self.ratio if self.ratio > 0 else 0.0
        chunk = min(self.prompt_len, (self.budget - b) / self.ranks)  # each data-parallel rank its own chunks
        lumps = prompt_lumps(b * self.ratio, chunk, self.budget - b)
        return sum(w * self.layer_s(b, x, keys=x * per_token, dense=dense) for w, x in lumps)

    def iteration_s(self, b: int, layers: int, first: bool, last: bool, prompt_tokens: float | None = None) -> float:
        """A stage's iteration on b sequences with their steady prompt share (or `prompt_tokens`)."""
        if b <= 0:
            return 0.0
        layer = self.steady_layer_s(b) if prompt_tokens is None else self.layer_s(b, prompt_tokens)
        t = self.step_s + layers * layer
        if first:
            t += self.part_s("embed", b)
        if first and self.dense_layers:
            dense = (
                self.steady_layer_s(b, True) if prompt_tokens is None else self.layer_s(b, prompt_tokens, dense=True)
            )
            t += self.dense_layers * dense
        if last:
            t += self.part_s("final_norm", b) + self.part_s("lm_head", b)
        return t

    def memory(self, layers: int, first: bool, last: bool, concurrency: int, b: int) -> float:
        """Bytes of the stage's busiest device; data-parallel ranks hold ceil(C/k) sequences each
        (self.kv and the workspace are a k-th of one's)."""
        k = self.ranks
        concurrency, b = k * math.ceil(concurrency / k), k * math.ceil(b / k)
        w = self.weights
        dense = self.dense_layers if first else 0
        held = layers * (w["block"] + concurrency * self.kv) + dense * (w.get("dense", 0.0) + concurrency * self.kv)
        ends = (w["embed"] if first else 0.0) + ((w["final_norm"] + w["lm_head"]) if last else 0.0)
        parts = (
            (["block"] if layers else []) + (["embed"] if first else []) + (["final_norm", "lm_head"] if last else [])
        ) + ["dense"] * bool(dense)
        return held + ends + max((self.workspace[p] for p in parts), default=0.0) * b


def _replica_chances(ctx: ServingContext) -> tuple[float, ...] | None:
    """The chance one token reaches each routed expert a dpaK member may hold: under EPLB with R
    redundant (options.eplb), each replica's, by the verifier's own count: R times one more replica
    of the expert with the largest chance per replica (the lower expert on a tie), each replica
    reached with its expert's chance over its count; else the experts' (None: uniform)."""
    redundant, picks = ctx.tasks.redundant_experts, ctx.tasks.expert_picks
    if redundant is None:
        return picks
    cfg = ctx.config
    chances = list(picks or [min(1.0, cfg.experts_per_token / cfg.num_experts)] * cfg.num_experts)
    copies = [1] * len(chances)
    for _ in range(redundant):
        copies[max(range(len(chances)), key=lambda e: (chances[e] / copies[e], -e))] += 1
    return tuple(sorted((q / c for q, c in zip(chances, copies) for _ in range(c)), reverse=True))


def _held(ctx: ServingContext) -> int:
    """Tokens of cache a sequence holds: the workload's KV context, whole."""
    return max(1, math.ceil(ctx.workload.kv_context))


def _kernels_of(sc, degree: int, attention: str, redundant: int | None = None):
    """config, precision[, imbalance] -> a layer's kernels on a member of the stage's group
    (llm_planner.cost: tensor-parallel, or data-parallel attention, over whole servers too, with
    EPLB's `redundant` replicas)."""
    if is_dp(attention):
        span, link, all2all = sc.span(degree), sc.intra_link, DP_ALL2ALL[attention]
        return lambda cfg, p, imbalance=1.0, picks=None: dp_layer_kernels(
            cfg, p, sc.kind, degree, link, imbalance, span, all2all, picks, redundant if cfg.is_moe else None
        )
    return lambda cfg, p, imbalance=1.0, picks=None: layer_kernels(
        cfg, p, sc.kind, degree, sc.intra_link, imbalance, picks
    )


def derive(ctx: ServingContext, layout: Layout, layers: list[int], concurrency: int, m: int) -> Derived:
    """Every figure of one replica (module docstring)."""
    slots = build_slots(layout, ctx.cache, ctx.links)  # for their links only
    shape = {seg: (seg.class_name, seg.degree, seg.attention) for seg in layout}
    own = {key: _Costs(ctx, *key) for key in shape.values()}
    costs = [own[shape[seg]] for seg in layout for _ in range(seg.stages)]
    q, r = divmod(concurrency, m)  # r micro-batches of q + 1 sequences, m - r of q
    b = q + 1 if r else q
    p = len(slots)
    stage, busy, mem, usable = [], [], [], []
    for s, (c, n) in enumerate(zip(costs, layers)):
        first, last = s == 0, s == p - 1
        stage.append(c.iteration_s(b, n, first, last))
        busy.append(r * c.iteration_s(q + 1, n, first, last) + (m - r) * c.iteration_s(q, n, first, last))
        mem.append(c.memory(n, first, last, concurrency, b))
        usable.append(c.usable)
    tasks = ctx.tasks
    handoff = 0.0
    for s, slot in enumerate(slots):
        nbytes = b * (tasks.return_bytes_per_seq if s == p - 1 else tasks.handoff_bytes_per_seq)
        if slot.link_next is not None and nbytes > 0:
            handoff += slot.link_next.latency_s + nbytes / slot.link_next.bw_bytes_per_s
    trip = sum(stage) + handoff
    tpot = max(trip, max(busy))
    prompt = ctx.workload.mean_prompt_len
    ranks = max((seg.degree for seg in layout if is_dp(seg.attention)), default=1)  # a rank's own budget
    chunk = min(prompt, max(1, (ctx.options.max_batched_tokens - b) / ranks))
    chunk_trip = handoff + sum(
        c.iteration_s(b, n, s == 0, s == p - 1, prompt_tokens=chunk) for s, (c, n) in enumerate(zip(costs, layers))
    )
    visits = math.ceil(prompt / chunk)
    plain_trip = handoff + sum(
        c.iteration_s(b, n, s == 0, s == p - 1, prompt_tokens=0.0) for s, (c, n) in enumerate(zip(costs, layers))
    )
    service = next_visit_s(tpot, concurrency) + (visits - 1) * max(tpot, chunk_trip) + max(trip, chunk_trip)
    request = service + ctx.workload.mean_output_len * tpot
    ttft = service + prompt_wait_s(b - 1, visits * (chunk_trip - plain_trip), request)
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
