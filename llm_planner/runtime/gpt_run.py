"""Greedy generation through a pipeline of decoder stages on MPI ranks.

Requests are spread over the plan's data-parallel shards in proportion to the
shard sizes, and each shard's requests are cut into micro-batches. A
micro-batch is a *stream*: it walks the chain of its shard's stages (contiguous
runs of tasks on one device) once per generated token; the rank holding
lm_head sends the next token ids back to the rank holding embed.

Every rank runs the same event loop: run a ready unit of work (stream, step,
stage) if it has one, else wait for the next message (MPI Probe on any source)
and receive it into a buffer of the shape both ends derive from (stream, step,
stage). Sends are non-blocking, so ranks never wait on each other in a cycle;
with several micro-batches, different stages work on different streams at the
same time (pipelining). A message's tag encodes (stream, step, stage).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

import torch

from llm_planner.runtime import gpt

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Stage:
    rank: int
    tasks: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Stream:
    index: int
    shard: int
    requests: tuple[int, ...]


def stages_of(assignment: dict[str, str], rank_of_device: dict[str, int], num_layers: int) -> list[Stage]:
    """The shard's chain cut into contiguous runs of tasks on one rank."""
    stages: list[Stage] = []
    for task in gpt.decoder_tasks(num_layers):
        rank = rank_of_device[assignment[task]]
        if stages and stages[-1].rank == rank:
            stages[-1] = Stage(rank=rank, tasks=(*stages[-1].tasks, task))
        else:
            stages.append(Stage(rank=rank, tasks=(task,)))
    return stages


def split_requests(num_requests: int, shard_sizes: list[int], micro_batches: list[int]) -> list[Stream]:
    """Requests per shard in proportion to its size (largest remainder), cut into contiguous micro-batches."""
    total = sum(shard_sizes)
    quotas = [num_requests * b / total for b in shard_sizes]
    counts = [int(q) for q in quotas]
    for s in sorted(range(len(quotas)), key=lambda s: (counts[s] - quotas[s], s))[: num_requests - sum(counts)]:
        counts[s] += 1
    streams, first = [], 0
    for shard, count in enumerate(counts):
        parts = max(1, min(micro_batches[shard], count))
        for m in range(parts):
            lo, hi = first + count * m // parts, first + count * (m + 1) // parts
            if hi > lo:
                streams.append(Stream(index=len(streams), shard=shard, requests=tuple(range(lo, hi))))
        first += count
    return streams


def default_micro_batches(plan, routes: list[list[Stage]], requested: int | None) -> list[int]:
    """Per shard: the requested count, else 1 for latency plans and the number of stages for throughput plans."""
    if requested is not None:
        return [requested] * len(routes)
    if plan.objective == "throughput":
        return [len(r) for r in routes]
    return [1] * len(routes)


class DecoderRun:
    def __init__(self, ctx):
        self.ctx, run = ctx, ctx.table.run
        self.config = gpt.prepare_config(gpt.load_hf_config(ctx.plan.inputs.model, run.checkpoint), run.attn_implementation)
        num_layers = gpt.num_layers_of(self.config)
        for s, assignment in enumerate(ctx.plan.shard_assignments):
            gpt.check_decoder_tasks(list(assignment), num_layers, source=f"{run.plan_path}: shards[{s}]")
        rank_of = ctx.table.rank_of_device()
        self.routes = [stages_of(a, rank_of, num_layers) for a in ctx.plan.shard_assignments]
        micro = default_micro_batches(ctx.plan, self.routes, run.micro_batches)
        self.streams = split_requests(len(run.prompt_ids), list(ctx.plan.shard_sizes), micro)
        self.steps = run.max_new_tokens
        self.slots = max(len(r) for r in self.routes)
        ctx.comm.check_tag(self._tag(len(self.streams) - 1, self.steps - 1, self.slots - 1), "decoder pipeline")
        me = ctx.rank
        mine = {t for route in self.routes for st in route if st.rank == me for t in st.tasks}
        source = gpt.weight_source(self.config, checkpoint=run.checkpoint, seed=run.seed)
        self.shard = gpt.DecoderShard(self.config, mine, device=ctx.device, dtype=ctx.dtype, source=source)
        ctx.stats.extra["weights"] = source.summary()
        self.states = self._new_states()

    def _new_states(self) -> dict[int, gpt.StreamState]:
        """Fresh state (empty KV cache, no tokens) for each stream that passes through this rank."""
        me, prompt_ids = self.ctx.rank, self.ctx.table.run.prompt_ids
        eos, pad = gpt.special_tokens(self.config)
        states: dict[int, gpt.StreamState] = {}
        for stream in self.streams:
            if any(st.rank == me for st in self.routes[stream.shard]):
                ids, mask = gpt.pad_prompts([prompt_ids[i] for i in stream.requests], gpt.prompt_pad_id(self.config))
                states[stream.index] = self.shard.new_stream(requests=list(stream.requests), prompt_ids=ids, prompt_mask=mask, eos_ids=eos, pad_id=pad)
        return states

    def _tag(self, stream: int, step: int, stage: int) -> int:
        return (stream * self.steps + step) * self.slots + stage

    def _untag(self, tag: int) -> tuple[int, int, int]:
        rest, stage = divmod(tag, self.slots)
        stream, step = divmod(rest, self.steps)
        return stream, step, stage

    def _expected_units(self) -> int:
        me = self.ctx.rank
        return sum(self.steps for s in self.streams for st in self.routes[s.shard] if st.rank == me)

    def _receive(self, ready: deque) -> None:
        comm = self.ctx.comm
        source, tag = comm.probe_any()
        stream, step, k = self._untag(tag)
        route = self.routes[self.streams[stream].shard]
        before = route[k - 1].tasks[-1] if k > 0 else "lm_head"
        state = self.states[stream]
        shape, kind = gpt.value_shape(before, state, step, int(self.config.hidden_size))
        buf = torch.empty(shape, dtype=torch.long if kind == "ids" else self.ctx.dtype)
        comm.recv_into(buf, source, tag)
        ready.append((stream, step, k, buf.to(self.ctx.device)))

    def run(self) -> dict:
        """Warm-up generations (untimed, each from fresh stream states), then the timed one."""
        self.ctx.warm_up(self._warm_pass)
        self.states = self._new_states()
        self.ctx.start()
        self._generate()
        return self._outputs()

    def _warm_pass(self) -> None:
        self.states = self._new_states()
        self._generate()

    def _generate(self) -> None:
        """Every step of every stream through this rank's stages (the event loop)."""
        ctx, me = self.ctx, self.ctx.rank
        ready: deque = deque()
        for stream in self.streams:
            if self.routes[stream.shard][0].rank == me:
                ready.append((stream.index, 0, 0, self.states[stream.index].prompt_ids))
        done, expected = 0, self._expected_units()
        while done < expected:
            if not ready:
                self._receive(ready)
                continue
            stream, step, k, value = ready.popleft()
            route = self.routes[self.streams[stream].shard]
            on_task = ctx.stats.on_prefill_task if step == 0 else ctx.stats.on_task
            out = self.shard.run_stage(list(route[k].tasks), value, self.states[stream], step, on_task=on_task)
            done += 1
            if k + 1 == len(route):
                ctx.stats.on_step_end(step)
            k, step = (k + 1, step) if k + 1 < len(route) else (0, step + 1)
            if step == self.steps:
                continue
            if route[k].rank == me:
                ready.append((stream, step, k, out))
            else:
                ctx.comm.isend(out, route[k].rank, self._tag(stream, step, k))

    def _outputs(self) -> dict:
        me, tokens = self.ctx.rank, {}
        for stream in self.streams:
            if self.routes[stream.shard][-1].rank == me:
                for request, row in zip(stream.requests, self.states[stream.index].tokens()):
                    tokens[request] = row
        out = {"tokens_by_request": tokens}
        if me == 0:
            out["max_new_tokens"] = self.steps
            out["streams"] = [{"shard": s.shard, "requests": list(s.requests)} for s in self.streams]
            out["model"] = gpt.config_summary(self.config)
        return out


def run_decoder(ctx) -> dict:
    start = time.perf_counter()
    job = DecoderRun(ctx)
    ctx.stats.build_s = time.perf_counter() - start
    log.info("rank %d: built %d modules on %s in %.2f s", ctx.rank, len(job.shard.modules), ctx.device, ctx.stats.build_s)
    return job.run()
