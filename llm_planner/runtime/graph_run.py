"""A CNN / any traced graph split over MPI ranks as the plan says.

The batch of `plan.batch_size` samples (seeded, shaped like the model's example
input) is cut into the plan's data-parallel shards; each shard's assignment
splits the GraphModule into stages (llm_planner.runtime.graph). A rank builds
the submodules of its stages only, then runs its (batch, shard, stage) units: it
receives the inputs it lacks from the ranks that made them, runs the stage node
by node (timed) and sends each output once to every other rank that reads it.
The rank holding a shard's output node assembles that shard's output, a unit one
level above the shard's last stage; rank 0 concatenates the first batch's shards
in order, writes the tensor to `output.pt` in the workdir and summarises it in
the report.

A latency plan runs one batch. A throughput plan streams batches through the
stages, as its steady state does: every rank runs its units in the wavefront
order (level + batch, the later batch first, plan start time, shard), so that in
a wavefront slot t the units of level l work on batch t - l, the lower levels
first (what a later stage waits for is made first in a slot). A batch spans
depth + 1 slots (depth: the output's level), and every slot from `depth` to the
last batch's first one runs every level: the batches ending in those slots end
one steady-state period apart. The run streams 2 depth + 2 batches (each the
same input), so that depth + 2 of them end in the steady state, and a rank
records when it finished its last unit of each batch (`batch_end_s`);
llm_planner.measure.observe.end_to_end reads the period from those ends. The
order is deadlock-free: whatever a rank waits for is a unit that comes earlier
in the one order every rank's order is a part of (a unit of its own batch and
shard at a lower level, whose value it receives, or, before it starts a unit, the
reader of a value it sent), and the inputs a rank holds of a batch are posted
before its first unit of that batch's slot or a later one. (An order by the
plan's start times plus a period a batch was tried: a plan's one-batch schedule
is not a periodic one, and on a pipeline whose two devices take turns the run
lost the stages' overlap, its period up to twice the busiest device's work.)

Memory. A value goes to each rank that reads it in MPI's synchronous mode, so
its send completes when the reader has taken it, and before each unit a rank
waits for the values it sent whose reader comes earlier in the order (a rank
that runs no unit, holding only inputs, waits so before sending each batch's).
So a rank holds a value it sent from its unit to its reader's turn: a value made
at level l and read at level l' over l' - l + 1 batches, at most depth + 1
however many batches the run streams (the report's `most_batches_held`, per
rank: the most batches whose sent values were not yet seen taken, counted after
each unit); and the values it made or received for a batch until its last unit
of that batch, also within depth + 1 batches. That can be more than the plan's
`batches_in_flight`, the count its memory was checked for. Rank 0 also
summarises the last batch's output (`last_batch_output`): every batch has the
same input, so it equals the first's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from llm_planner.runtime import graph as rg
from llm_planner.runtime.run_report import tensor_summary

log = logging.getLogger(__name__)


def _first_start(plan, shard: int) -> dict[str, float]:
    return {s.task: s.start_s for s in plan.schedule if s.shard == shard}


class GraphRun:
    def __init__(self, ctx):
        self.ctx, plan, run = ctx, ctx.plan, ctx.table.run
        gm, example = rg.build_graph_model(plan.inputs.model)
        rank_of = ctx.table.rank_of_device()
        self.splits = []
        for s, assignment in enumerate(plan.shard_assignments):
            rg.check_assignment(gm, assignment, source=f"{run.plan_path}: shards[{s}]")
            self.splits.append(rg.split_graph(gm, {t: rank_of[d] for t, d in assignment.items()}))
        self.node_index = {n.name: i for i, n in enumerate(gm.graph.nodes)}
        self.depth = max(_output_level(split) for split in self.splits)
        self.batches = streamed_batches(plan.objective, self.depth)
        last_tag = self._tag(self.batches - 1, len(self.splits) - 1, len(self.node_index) - 1)
        ctx.comm.check_tag(last_tag, "graph run", f"{self.batches} batches of this graph need more tags than it has")
        self.places = [_places(split, _first_start(plan, s)) for s, split in enumerate(self.splits)]
        self.keys, self.units = self._units()
        self.modules = {
            (s, stage.name): rg.stage_module(gm, stage).to(device=ctx.device, dtype=ctx.dtype).eval()
            for _, s, stage in self.units
            if stage is not None
        }
        batch = rg.make_batch(example, plan.batch_size, run.seed)
        offsets = [sum(plan.shard_sizes[:s]) for s in range(len(plan.shard_sizes))]
        self.inputs = [batch[o : o + b] for o, b in zip(offsets, plan.shard_sizes)]
        self.output_template = rg.output_template(gm)  # gm itself is dropped: a rank keeps only its stages
        self.sync = ctx.device.type == "cuda"
        self.sent: set = set()  # (batch, shard, value, reader rank) sent in this pass
        self.most_held = 0  # the most batches whose values this rank held at once in this pass

    def _units(self) -> tuple[list[tuple], list[tuple[int, int, rg.GraphStage | None]]]:
        """This rank's (batch, shard, stage) units in the wavefront order (module docstring), with their keys in
        that order; a stage of None is the assembly of the shard's output, one level above its last stage. Units
        of one slot are of different batches, so none reads another's values."""
        keyed = []
        for s, places in enumerate(self.places):
            mine = [(place, stage) for owner, place, stage in places if owner == self.ctx.rank]
            for b in range(self.batches):
                keyed += [(_key(place, b, s), (b, s, stage)) for place, stage in mine]
        keyed.sort(key=lambda k: k[0])
        return [key for key, _ in keyed], [unit for _, unit in keyed]

    def _reader_key(self, batch: int, shard: int, name: str, dest: int) -> tuple:
        """The key of the first unit on `dest` that reads `name` of (batch, shard): where it receives it."""
        place = min(
            place
            for owner, place, stage in self.places[shard]
            if owner == dest and name in (stage.inputs if stage is not None else self.splits[shard].output_inputs)
        )
        return _key(place, batch, shard)

    def _tag(self, batch: int, shard: int, node: int) -> int:
        return (batch * len(self.splits) + shard) * (len(self.node_index) + 1) + node

    def _send(self, batch: int, shard: int, name: str, value, held: list) -> None:
        """Send `value` to every other rank that reads it, once, in synchronous mode: the send completes when
        its reader has taken it, and until then it is held (`held`: reader's key, requests, batch)."""
        for dest in self.splits[shard].consumers(name):
            if dest != self.ctx.rank and (batch, shard, name, dest) not in self.sent:
                self.sent.add((batch, shard, name, dest))
                tag = self._tag(batch, shard, self.node_index[name])
                requests = self.ctx.comm.isend_value(value, dest, tag, synchronous=True)
                held.append((self._reader_key(batch, shard, name, dest), requests, batch))

    def _value(self, batch: int, shard: int, name: str, env: dict):
        if name not in env:
            producer = self.splits[shard].producer[name]
            tag = self._tag(batch, shard, self.node_index[name])
            env[name] = _cast(self.ctx.comm.recv_value(producer, tag, self.ctx.device), self.ctx.dtype)
        return env[name]

    def run(self) -> dict:
        """Warm-up passes (untimed), then the timed pass; the clock stops before the outputs are gathered and saved."""
        self.ctx.warm_up(self._forward)
        self.ctx.start()
        results = self._forward(timed=True)
        self.ctx.comm.wait_sends()
        self.ctx.stats.stop()
        return self._outputs(results)

    def _forward(self, timed: bool = False) -> dict[tuple[int, int], torch.Tensor]:
        """Every batch's pass over this rank's stages; the (batch, shard) outputs of the first and last batch
        this rank assembles. Before each unit, the rank sends the inputs it holds of the batches whose first
        slot has come, and waits until every value it sent whose reader comes earlier in the order has been
        taken (module docstring, "Memory").
        Timed, each batch's end here is recorded when this rank has run its last unit of it."""
        ctx = self.ctx
        envs: dict[tuple[int, int], dict] = {(b, s): {} for b in range(self.batches) for s in range(len(self.splits))}
        self.sent, self.most_held, held, inputs_sent = set(), 0, [], 0
        left = [sum(1 for b, _, _ in self.units if b == batch) for batch in range(self.batches)]
        results = {}
        for key, (b, s, stage) in zip(self.keys, self.units):
            while inputs_sent < self.batches and inputs_sent <= key[0]:
                self._send_inputs(inputs_sent, envs, held)
                inputs_sent += 1
            held = self._release(held, key)
            env = envs[(b, s)]
            if stage is None:
                output = rg.assemble_output(
                    self.output_template, {name: self._value(b, s, name, env) for name in self.splits[s].output_inputs}
                )
                results.update({(b, s): output} if b in (0, self.batches - 1) else {})
            else:
                self._run_stage(b, s, stage, env, held)
            held = self._settle(held)
            left[b] -= 1
            if left[b] == 0:
                envs.update({(b, k): {} for k in range(len(self.splits))})  # the batch is done here
                if timed:
                    ctx.stats.on_batch_end(b)
        for batch in range(inputs_sent, self.batches):  # a rank with no unit left: inputs only
            held = self._release(held, (batch,))  # the readers of earlier slots
            self._send_inputs(batch, envs, held)
            held = self._settle(held)
        if timed:
            ctx.stats.extra["most_batches_held"] = self.most_held
        return results

    def _release(self, held: list, key: tuple) -> list:
        """Wait for the sends whose reader runs before the unit of `key`; the sends still held."""
        due = [requests for reader, requests, _ in held if reader < key]
        if due:
            self.ctx.comm.wait_requests([r for requests in due for r in requests])
        return [entry for entry in held if not entry[0] < key]

    def _settle(self, held: list) -> list:
        """The sends not yet seen taken (completed ones dropped), and the most batches they have spanned."""
        held = [entry for entry in held if not all(request.Test() for request in entry[1])]
        self.most_held = max(self.most_held, len({b for _, _, b in held}))
        return held

    def _send_inputs(self, batch: int, envs: dict, held: list) -> None:
        """The inputs this rank holds, for one batch."""
        for s, split in enumerate(self.splits):
            for name, owner in split.placeholders.items():
                if owner == self.ctx.rank:
                    value = self.inputs[s].to(device=self.ctx.device, dtype=self.ctx.dtype)
                    envs[(batch, s)][name] = value
                    self._send(batch, s, name, value, held)

    def _run_stage(self, b: int, s: int, stage, env: dict, held: list) -> None:
        args = [self._value(b, s, name, env) for name in stage.inputs]
        times: dict[str, float] = {}
        outs = rg.TimedInterpreter(self.modules[(s, stage.name)], times, sync_cuda=self.sync).run(*args)
        for task, seconds in times.items():
            self.ctx.stats.on_task(task, seconds)
        for name, value in zip(stage.outputs, outs):
            env[name] = value
            self._send(b, s, name, value, held)

    def _outputs(self, results: dict[tuple[int, int], torch.Tensor]) -> dict:
        parts = self.ctx.comm.gather({key: _to_cpu(v) for key, v in results.items()})
        if self.ctx.rank != 0:
            return {}
        assert parts is not None
        by_key = {key: v for part in parts for key, v in part.items()}
        first, last = (
            torch.cat([by_key[(b, s)] for s in range(len(self.splits))], dim=0) for b in (0, self.batches - 1)
        )
        path = Path(self.ctx.table.run.workdir) / "output.pt"
        torch.save(first, path)
        return {
            "output": tensor_summary(first),
            "output_path": str(path),
            "input_seed": self.ctx.table.run.seed,
            "batches": self.batches,
            "pipeline_depth": self.depth,
            "plan_batches_in_flight": self.ctx.plan.batches_in_flight,
            **({"last_batch_output": tensor_summary(last)} if self.batches > 1 else {}),
        }


def _key(place: tuple[int, float], batch: int, shard: int) -> tuple:
    """A unit's place in the wavefront order: its slot (level + batch), the later batch first, its stage's
    first start in the plan, its shard."""
    level, first = place
    return (level + batch, -batch, first, shard)


def _places(split: rg.GraphSplit, starts: dict[str, float]) -> list[tuple]:
    """A shard's units of one batch, (owner, (level, first start in the plan), stage), the output assembly
    (stage None) one level above the last stage."""
    places = [
        (stage.owner, (stage.level, min((starts.get(n, 0.0) for n in stage.nodes), default=0.0)), stage)
        for stage in split.stages
    ]
    return places + [(split.output_owner, (_output_level(split), float("inf")), None)]


def _output_level(split: rg.GraphSplit) -> int:
    """The level of a shard's output assembly: one above its last stage."""
    return max((stage.level for stage in split.stages), default=0) + 1


def streamed_batches(objective: str, depth: int) -> int:
    """The batches a graph run streams: 1 for a latency plan; for a throughput plan 2 depth + 2, so that
    depth + 2 of them end in the steady state (module docstring)."""
    return 2 * depth + 2 if objective == "throughput" else 1


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    return value


def _to_cpu(value):
    return value.detach().to("cpu") if isinstance(value, torch.Tensor) else value


def run_graph(ctx) -> dict:
    start = time.perf_counter()
    job = GraphRun(ctx)
    ctx.stats.build_s = time.perf_counter() - start
    log.info(
        "rank %d: built %d stage module(s) on %s in %.2f s", ctx.rank, len(job.modules), ctx.device, ctx.stats.build_s
    )
    return job.run()
