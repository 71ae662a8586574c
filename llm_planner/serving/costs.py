"""What one engine iteration costs a pipeline stage, and what the stage holds in memory.

An iteration carries, per sequence in flight, the tasks of llm_planner.serving.tasks (a decode
token and its share of prompt work under the engine's token budget). For a micro-batch of b
sequences a stage with l decoder layers runs

    t(b) = step_overhead + l * layer(b) + [first stage] (embed(b) + d * dense(b)) + [last stage] (norm(b) + head(b))

layer(b) is the sum of the kernels one decoder layer runs on that load (linear layers on all tokens
reading the weights once, decode attention over each sequence's cache, prompt attention,
elementwise ops, the group's all-reduces: llm_planner.cost.iteration), a convex piecewise affine
function of b given by its pieces; the end parts are the decoder tasks' rooflines
(llm_planner.cost.roofline, collectives included), and head(b) is the LM head's roofline plus the
engine's own work per sequence, `sequence_overhead_s` b (scheduling each sequence, sampling,
detokenizing and streaming its token: 0 unless the kind sets it; docs/cluster-spec.md), an affine
term carried by the head's pieces, so every reader of them (the search, the bounds that count the
head) has it. A measured serving profile replaces layer(b) where it covers the stage's kind and
degree (llm_planner.cost.serving_profile: version 1 on single devices; version 2 per tensor-
parallel degree and per part of the layer, the kernel model timing the parts it lacks;
llm_planner.serving.layer_time): `stage_costs` decides which, once, and every caller reads the
layer's time as `StageCosts.layer_time` (steady load) or `StageCosts.layer_load_s` (any mix of
decode and prompt tokens: TTFT).

A model whose first d layers have a dense MLP where the rest have experts (DeepSeek-V3's
first_k_dense_replace: d = 3 of 61) is split over the stages by its MoE layers (`num_layers` is
theirs); the first stage holds the d dense layers besides its share, timed by their own kernels
(dense(b)) and holding their weights and KV cache. A split that would put fewer than d + 1 layers
on the first stage is not one this model of it can state.

Memory per device of the stage (each member of a group) is llm_planner.cost.memory's formula:

    l * (W + C * KV) + the end parts' weights (and the dense layers' with their KV cache) + the
    largest task workspace at b sequences

with W and KV one layer's weights and KV cache per sequence at full context (each member's
share on a group of k), the workspace with its prompt chunk included, and C the sequences in
flight through the replica: every one of them holds its KV cache on every stage at once,
whichever micro-batch it is in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_planner.cost.iteration import LayerKernels, Load, layer_kernels
from llm_planner.cost.layer_pieces import layer_pieces
from llm_planner.cost.memory import concurrency_held, layer_bytes, stage_bytes
from llm_planner.cost.roofline import evaluate_pieces, group_task_time_pieces, shard_of
from llm_planner.serving.classes import ServerClass, is_dp
from llm_planner.serving.layer_time import (
    KernelLayerTime,
    MeasuredLayerTime,
    PartsLayerTime,
    RooflineLayerTime,
    measured_layer_time,
)
from llm_planner.serving.tasks import ServingTasks


@dataclass(frozen=True, kw_only=True)
class StageCosts:
    """Iteration time pieces and per-device memory of the parts on one (class, degree)."""

    server_class: ServerClass
    degree: int
    pieces: dict  # part -> tuple of (fixed_s, per_sequence_s) pieces
    weight_bytes: dict  # part -> bytes per device
    kv_bytes_per_seq: float  # one layer, one sequence in flight, per device
    workspace_bytes_per_seq: dict  # part -> bytes per device per sequence of the micro-batch
    layer_time: RooflineLayerTime | MeasuredLayerTime | PartsLayerTime  # the block's time, b -> seconds (stage_costs)
    kernels: LayerKernels  # the block's kernels, for loads other than the steady one
    tasks: ServingTasks
    dense_time: RooflineLayerTime | None = None  # one dense first layer's time (None: the model has none)
    dense_kernels: LayerKernels | None = None
    attention: str = "tp"  # or one of classes.DP_ATTENTIONS: data-parallel attention (cost.dp_attention)

    @property
    def step_s(self) -> float:
        return self.server_class.kind.serving_step_s

    @property
    def usable_bytes(self) -> float:
        return self.server_class.kind.usable_mem_bytes

    def part_s(self, part: str, b: int) -> float:
        if part == "block":
            return float(self.layer_time(b)) if b > 0 else 0.0
        return evaluate_pieces(self.pieces[part], b)

    def layer_load_s(self, decodes: float, prompt_tokens: float) -> float:
        """One decoder layer's time on an iteration of `decodes` sequences at the mean decode context
        and `prompt_tokens` tokens of prompt chunks (their queries seeing half the mean prompt's
        keys on average): the measured time where the stage has one (stage_costs), else the kernels' sum."""
        load = self._load(decodes, prompt_tokens)
        return self.layer_time.load_s(load) if self.layer_time.measured else self.kernels.time_s(load)

    def _load(self, decodes: float, prompt_tokens: float) -> Load:
        keys = self.tasks.per_sequence.decode_keys
        prompt_keys = prompt_tokens * (self.tasks.mean_prompt_len + 1) / 2
        return Load(decodes=decodes, decode_keys=decodes * keys, prompt_tokens=prompt_tokens, prompt_keys=prompt_keys)

    def first_s(self, b: int) -> float:
        """The first stage's own parts on b sequences: the embedding and the dense first layers."""
        dense = self.tasks.dense_layers * float(self.dense_time(b)) if self.dense_time is not None and b > 0 else 0.0
        return self.part_s("embed", b) + dense

    def first_least_s(self, b: int) -> float:
        """first_s read from the dense layers' pieces, below their time at every b (what the bounds take)."""
        dense = self.tasks.dense_layers * self.part_s("dense", b) if "dense" in self.pieces else 0.0
        return self.part_s("embed", b) + dense

    @property
    def first_bytes(self) -> float:
        """The weights of the first stage's own parts per device: the embedding's, the dense layers'."""
        return self.weight_bytes["embed"] + self.tasks.dense_layers * self.weight_bytes.get("dense", 0.0)

    def stage_load_s(self, decodes: int, prompt_tokens: float, layers: int, first: bool, last: bool) -> float:
        """Time of one iteration of `decodes` sequences and `prompt_tokens` prompt tokens (the end
        parts at the sequences' steady share)."""
        if decodes <= 0 and prompt_tokens <= 0:
            return 0.0
        b = max(decodes, 1)
        t = self.step_s + layers * self.layer_load_s(decodes, prompt_tokens)
        if first:
            t += self.part_s("embed", b)
            if self.dense_kernels is not None:
                t += self.tasks.dense_layers * self.dense_kernels.time_s(self._load(decodes, prompt_tokens))
        if last:
            t += self.part_s("final_norm", b) + self.part_s("lm_head", b)
        return t

    def stage_s(self, b: int, layers: int, first: bool, last: bool) -> float:
        """Time of one iteration of a micro-batch of b sequences (module docstring)."""
        if b <= 0:
            return 0.0
        t = self.step_s * (1.0 + self.layer_time.prefill_iterations(b)) + layers * self.part_s("block", b)
        if first:
            t += self.first_s(b)
        if last:
            t += self.part_s("final_norm", b) + self.part_s("lm_head", b)
        return t

    def fixed_bytes(self, first: bool, last: bool) -> float:
        return first * self.first_bytes + last * (self.weight_bytes["final_norm"] + self.weight_bytes["lm_head"])

    def layer_bytes(self, concurrency: float) -> float:
        """One decoder layer's bytes per device with `concurrency` sequences in flight (llm_planner.cost.memory)."""
        return layer_bytes(self.weight_bytes["block"], self.kv_bytes_per_seq, concurrency)

    def concurrency_held(self, layers: float, room_bytes: float | None = None) -> float:
        """The most sequences in flight whose KV cache `layers` layers hold in `room_bytes` (default: the
        device's usable memory) beside their weights (llm_planner.cost.memory.concurrency_held)."""
        room = self.usable_bytes if room_bytes is None else room_bytes
        return concurrency_held(room, layers, self.weight_bytes["block"], self.kv_bytes_per_seq)

    def held(self, sequences: float) -> float:
        """The sequences whose cache and workspace the busiest member holds, in the units of
        kv_bytes_per_seq: on a group with data-parallel attention each rank has its own, ceil(C/k)
        of C, which is k ceil(C/k) k-ths; `sequences` on any other group."""
        k = self.degree if is_dp(self.attention) else 1
        return k * math.ceil(sequences / k) if k > 1 else sequences

    def mem_bytes(self, *, layers: int, first: bool, last: bool, concurrency: int, micro_batch: int) -> float:
        concurrency, micro_batch = self.held(concurrency), self.held(micro_batch)
        parts = ["block"] * (layers > 0) + ["embed"] * first + ["final_norm", "lm_head"] * last
        parts += ["dense"] * (first and "dense" in self.workspace_bytes_per_seq)
        workspace = max((self.workspace_bytes_per_seq[p] for p in parts), default=0.0) * micro_batch
        return stage_bytes(
            layers=layers,
            weight_bytes=self.weight_bytes["block"],
            kv_bytes_per_seq=self.kv_bytes_per_seq,
            concurrency=concurrency,
            fixed_bytes=self.fixed_bytes(first, last) + self.dense_kv_bytes(first, concurrency),
            workspace_bytes=workspace,
        )

    def dense_kv_bytes(self, first: bool, concurrency: float) -> float:
        """The dense first layers' KV cache on the first stage (the same attention as the others')."""
        return first * self.tasks.dense_layers * self.kv_bytes_per_seq * concurrency

    def max_layers(self, *, first: bool, last: bool, concurrency: int, micro_batch: int) -> int:
        """The most decoder layers the stage holds with `concurrency` sequences in flight."""
        concurrency, micro_batch = self.held(concurrency), self.held(micro_batch)
        room = self.usable_bytes - self.mem_bytes(
            layers=0, first=first, last=last, concurrency=0, micro_batch=micro_batch
        )
        room -= self.dense_kv_bytes(first, concurrency)
        room -= self.workspace_bytes_per_seq["block"] * micro_batch
        per_layer = self.layer_bytes(concurrency)
        if room < 0:
            return 0
        return int(room // per_layer) if per_layer > 0 else 10**9


def with_sequence_work(pieces: tuple, per_sequence_s: float) -> tuple:
    """A part's (fixed_s, per_sequence_s) pieces with the engine's time per sequence added to each slope."""
    return tuple((fixed, slope + per_sequence_s) for fixed, slope in pieces)


def stage_costs(tasks: ServingTasks, server_class: ServerClass, degree: int, profile=None) -> StageCosts:
    """The parts' costs on a tensor-parallel group of `degree` devices of the class (1: a single
    device); a group with data-parallel attention: llm_planner.serving.dp_costs.

    Where a decoder layer's time comes from is decided here, once, by
    llm_planner.serving.layer_time.measured_layer_time: the measured serving `profile` (either
    version, or None) where it covers the class's kind at this degree, the kernel model otherwise;
    every caller reads it as `StageCosts.layer_time`."""
    link = server_class.intra_link
    pieces, weights, workspace = {}, {}, {}
    for part, task in tasks.tasks.items():
        if part not in ("block", "dense"):  # those two are timed by their kernels (below)
            pieces[part] = group_task_time_pieces(task, server_class.kind, degree, link, tasks.dtype)
        member = shard_of(task, degree) if degree > 1 else task
        weights[part] = member.weight_bytes
        workspace[part] = member.workspace_bytes_per_sample
    pieces["lm_head"] = with_sequence_work(pieces["lm_head"], server_class.kind.serving_sequence_s)
    kv = (shard_of(tasks.tasks["block"], degree) if degree > 1 else tasks.tasks["block"]).mem_bytes_per_sample
    kernels = layer_kernels(
        tasks.config.moe_layer(),
        tasks.precision,
        server_class.kind,
        degree,
        link,
        tasks.expert_imbalance,
        tasks.expert_picks,
    )
    roofline = kernel_time(kernels, tasks)
    pieces["block"] = roofline.pieces
    dense_kernels = dense_time = None
    if tasks.dense_layers:
        dense_kernels = layer_kernels(tasks.config.dense_layer(), tasks.precision, server_class.kind, degree, link)
        dense_time = kernel_time(dense_kernels, tasks)
        pieces["dense"] = dense_time.pieces
    measured = measured_layer_time(
        profile, server_class.kind, degree, kernels, tasks.per_sequence, tasks.hidden_bytes_per_token
    )
    if measured is not None:  # the measured time's own pieces; else the bounds read the roofline's
        pieces["block"] = layer_pieces(kernels, tasks.per_sequence)
    return StageCosts(
        server_class=server_class,
        degree=degree,
        pieces=pieces,
        weight_bytes=weights,
        kv_bytes_per_seq=kv,
        workspace_bytes_per_seq=workspace,
        layer_time=measured if measured is not None else roofline,
        kernels=kernels,
        tasks=tasks,
        dense_time=dense_time,
        dense_kernels=dense_kernels,
    )


def kernel_time(kernels: LayerKernels, tasks: ServingTasks, ranks: int = 1) -> RooflineLayerTime | KernelLayerTime:
    """A layer's time from its kernels on the steady load (exact pieces where it has no routed experts),
    the load split over `ranks` data-parallel schedulers each admitting its own prompt chunks; its
    `pieces` are below the time at every b a plan can have (the bounds read them)."""
    separate = None if tasks.chunked_prefill else (tasks.mean_prompt_len, tasks.token_budget)
    pieces = layer_pieces(kernels, tasks.per_sequence, most=tasks.most_sequences)
    kind = RooflineLayerTime if kernels.exact else KernelLayerTime
    return kind(pieces, kernels, tasks.per_sequence, tasks.mean_prompt_len, tasks.token_budget, separate, ranks)
