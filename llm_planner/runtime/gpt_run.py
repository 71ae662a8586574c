"""Greedy generation through the plan's decoder stages on MPI ranks, in the plan's schedule.

What runs where and in which order is llm_planner.runtime.plan_schedule: every
(batch, shard) is a stream of requests that walks its shard's stages once per
generated token; the leader of the stage holding lm_head sends the next token
ids back to the stage holding embed. A stage on a tensor-parallel group runs on
every member (llm_planner.runtime.tp_layers), and each member receives the
stage's input; the leader alone sends its output.

Each rank runs its items (step, stream, stage) in the fixed order of its plan
device (plan_schedule.device_orders). For each item it takes the input (held locally when it made
it, else received from the previous stage's leader: a receive of that exact
source and tag), runs the stage, and posts non-blocking sends of the output. A
message's tag encodes (stream, step, stage).

Every stage call goes through `run_step`, and every stream's state is made by
`new_state`: the profiler (llm_planner.runtime.profile_rank) times a decode step
through these same two functions, so what it measures for a task, a tensor-parallel
member's share included (same modules, same collectives, a KV cache grown by the
same prefill), is what the run executes.
"""

from __future__ import annotations

import logging
import time

import torch

from llm_planner.runtime import gpt
from llm_planner.runtime import plan_schedule as ps

log = logging.getLogger(__name__)


def new_state(shard: gpt.DecoderShard, prompts: list[list[int]], requests: list[int]) -> gpt.StreamState:
    """A stream's fresh state as the run makes it: the prompts left-padded, an empty KV cache."""
    eos, pad = gpt.special_tokens(shard.config)
    ids, mask = gpt.pad_prompts(prompts, gpt.prompt_pad_id(shard.config))
    return shard.new_stream(requests=list(requests), prompt_ids=ids, prompt_mask=mask, eos_ids=eos, pad_id=pad)


def run_step(
    shard: gpt.DecoderShard, tasks: list[str], value: torch.Tensor, state: gpt.StreamState, step: int, on_task=None
) -> torch.Tensor:
    """One stage (`tasks`) of one stream at generation step `step` (0: the prompt's prefill): token ids before
    embed, hidden states after; `on_task(name, seconds)` gets each task's time. The run's only stage call."""
    return shard.run_stage(list(tasks), value, state, step, on_task=on_task)


class DecoderRun:
    def __init__(self, ctx):
        self.ctx, run = ctx, ctx.table.run
        self.config = gpt.prepare_config(
            gpt.load_hf_config(ctx.plan.inputs.model, run.checkpoint), run.attn_implementation
        )
        chain = gpt.decoder_tasks(gpt.num_layers_of(self.config))
        for s, assignment in enumerate(ctx.plan.shard_assignments):
            gpt.check_decoder_tasks(list(assignment), len(chain) - 3, source=f"{run.plan_path}: shards[{s}]")
        ranks_of = ps.ranks_of_devices(ctx.plan, ctx.table.rank_of_device())
        self.routes = [
            ps.shard_stages(ctx.plan, s, chain, ranks_of) if size > 0 else []
            for s, size in enumerate(ctx.plan.shard_sizes)
        ]
        self.streams = [s for s in ps.streams_of(ctx.plan, run.batches) if s.requests]
        self.steps = run.max_new_tokens
        device = ctx.entry.plan_device or ctx.entry.device
        self.order = ps.device_orders(self.streams, self.routes, self.steps).get(device, [])
        self.slots = max(len(r) for r in self.routes)
        ctx.comm.check_tag(self._tag(len(self.streams) - 1, self.steps - 1, self.slots - 1), "decoder pipeline")
        mine = {t for route in self.routes for st in route if ctx.rank in st.ranks for t in st.tasks}
        source = gpt.weight_source(self.config, checkpoint=run.checkpoint, seed=run.seed)
        self.shard = gpt.DecoderShard(
            self.config, mine, device=ctx.device, dtype=ctx.dtype, source=source, group=ctx.group
        )
        ctx.stats.extra["weights"] = source.summary()
        self.states = self._new_states()
        self.held: dict[tuple[int, int, int], torch.Tensor] = {}

    def _new_states(self) -> dict[int, gpt.StreamState]:
        """Fresh state (empty KV cache, no tokens) for each stream that passes through this rank."""
        me, prompt_ids = self.ctx.rank, self.ctx.table.run.prompt_ids
        states: dict[int, gpt.StreamState] = {}
        for stream in self.streams:
            if any(me in st.ranks for st in self.routes[stream.shard]):
                prompts = [list(prompt_ids[i]) for i in stream.requests]
                states[stream.index] = new_state(self.shard, prompts, list(stream.requests))
        return states

    def _tag(self, stream: int, step: int, stage: int) -> int:
        return (stream * self.steps + step) * self.slots + stage

    def _input(self, stream: int, step: int, k: int) -> torch.Tensor:
        """The stage's input: the prompt, a value this rank made, or the previous stage leader's message."""
        if step == 0 and k == 0:
            return self.states[stream].prompt_ids
        if (stream, step, k) in self.held:
            return self.held.pop((stream, step, k))
        route = self.routes[self.streams[stream].shard]
        before = route[k - 1] if k > 0 else route[-1]
        state = self.states[stream]
        shape, kind = gpt.value_shape(before.tasks[-1], state, step, int(self.config.hidden_size))
        buf = torch.empty(shape, dtype=torch.long if kind == "ids" else self.ctx.dtype)
        self.ctx.comm.wait_for(before.leader, self._tag(stream, step, k))
        self.ctx.comm.recv_into(buf, before.leader, self._tag(stream, step, k))
        return buf.to(self.ctx.device)

    def _output(self, out: torch.Tensor, stream: int, step: int, k: int) -> None:
        """The leader sends the output to every rank of the next stage (this step's, or the next step's first)."""
        route = self.routes[self.streams[stream].shard]
        if route[k].leader != self.ctx.rank:
            return
        k, step = (k + 1, step) if k + 1 < len(route) else (0, step + 1)
        if step == self.steps:
            return
        for rank in route[k].ranks:
            if rank == self.ctx.rank:
                self.held[(stream, step, k)] = out
            else:
                self.ctx.comm.isend(out, rank, self._tag(stream, step, k))

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
        """This rank's items in its plan device's order; a step ends here when its last final stage has run."""
        ctx = self.ctx
        finals: dict[int, int] = {}  # step -> final stages of it this rank still runs
        for step, s, k in self.order:
            if k + 1 == len(self.routes[self.streams[s].shard]):
                finals[step] = finals.get(step, 0) + 1
        for step, stream, k in self.order:
            value = self._input(stream, step, k)
            route = self.routes[self.streams[stream].shard]
            on_task = ctx.stats.on_prefill_task if step == 0 else ctx.stats.on_task
            out = run_step(self.shard, list(route[k].tasks), value, self.states[stream], step, on_task=on_task)
            self._output(out, stream, step, k)
            if k + 1 == len(route):
                finals[step] -= 1
                if finals[step] == 0:
                    ctx.stats.on_step_end(step)

    def _outputs(self) -> dict:
        me, tokens = self.ctx.rank, {}
        for stream in self.streams:
            if self.routes[stream.shard][-1].leader == me:
                for request, row in zip(stream.requests, self.states[stream.index].tokens()):
                    tokens[request] = row
        out = {"tokens_by_request": tokens}
        if me == 0:
            out["max_new_tokens"] = self.steps
            out["batches"] = self.ctx.table.run.batches
            out["streams"] = [{"batch": s.batch, "shard": s.shard, "requests": list(s.requests)} for s in self.streams]
            out["model"] = gpt.config_summary(self.config)
        return out


def run_decoder(ctx) -> dict:
    start = time.perf_counter()
    job = DecoderRun(ctx)
    ctx.stats.build_s = time.perf_counter() - start
    log.info(
        "rank %d: built %d tasks on %s in %.2f s",
        ctx.rank,
        len(job.shard.modules) + len(job.shard.parts),
        ctx.device,
        ctx.stats.build_s,
    )
    return job.run()
