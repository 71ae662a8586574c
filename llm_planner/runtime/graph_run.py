"""A CNN / any traced graph split over MPI ranks as the plan says.

The batch of `plan.batch_size` samples (seeded, shaped like the model's example
input) is cut into the plan's data-parallel shards; each shard's assignment
splits the GraphModule into stages (llm_planner.runtime.graph). A rank builds
the submodules of its stages only, then runs its (shard, stage) units in
increasing level (then plan start time): it receives the inputs it lacks from
the ranks that made them, runs the stage node by node (timed) and sends each
output once to every other rank that reads it. The rank holding a shard's
output node assembles that shard's output; rank 0 concatenates the shards in
order, writes the tensor to `output.pt` in the workdir and summarises it in
the report.
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
        ctx.comm.check_tag(self._tag(len(self.splits) - 1, len(self.node_index) - 1), "graph run")
        units = []
        for s, split in enumerate(self.splits):
            starts = _first_start(plan, s)
            for stage in split.stages:
                if stage.owner == ctx.rank:
                    first = min((starts.get(n, 0.0) for n in stage.nodes), default=0.0)
                    units.append((stage.level, first, s, stage))
        self.units = [(s, stage) for _, _, s, stage in sorted(units, key=lambda u: u[:3])]
        self.modules = {
            (s, stage.name): rg.stage_module(gm, stage).to(device=ctx.device, dtype=ctx.dtype).eval()
            for s, stage in self.units
        }
        batch = rg.make_batch(example, plan.batch_size, run.seed)
        offsets = [sum(plan.shard_sizes[:s]) for s in range(len(plan.shard_sizes))]
        self.inputs = [batch[o : o + b] for o, b in zip(offsets, plan.shard_sizes)]
        self.output_template = rg.output_template(gm)  # gm itself is dropped: a rank keeps only its stages
        self.sync = ctx.device.type == "cuda"

    def _tag(self, shard: int, node: int) -> int:
        return shard * (len(self.node_index) + 1) + node

    def _send(self, shard: int, name: str, value, sent: set) -> None:
        for dest in self.splits[shard].consumers(name):
            if dest != self.ctx.rank and (shard, name, dest) not in sent:
                sent.add((shard, name, dest))
                self.ctx.comm.isend_value(value, dest, self._tag(shard, self.node_index[name]))

    def _value(self, shard: int, name: str, env: dict):
        if name not in env:
            producer = self.splits[shard].producer[name]
            value = self.ctx.comm.recv_value(producer, self._tag(shard, self.node_index[name]), self.ctx.device)
            env[name] = _cast(value, self.ctx.dtype)
        return env[name]

    def run(self) -> dict:
        """Warm-up passes (untimed), then the timed pass; the clock stops before the outputs are gathered and saved."""
        self.ctx.warm_up(self._forward)
        self.ctx.start()
        results = self._forward()
        self.ctx.comm.wait_sends()
        self.ctx.stats.stop()
        return self._outputs(results)

    def _forward(self) -> dict[int, torch.Tensor]:
        """One forward pass of this rank's stages; the shard outputs this rank assembles."""
        ctx, me = self.ctx, self.ctx.rank
        envs: list[dict] = [{} for _ in self.splits]
        sent: set = set()
        for s, split in enumerate(self.splits):  # placeholders first: nobody waits on a stage for them
            for name, owner in split.placeholders.items():
                if owner == me:
                    envs[s][name] = self.inputs[s].to(device=ctx.device, dtype=ctx.dtype)
                    self._send(s, name, envs[s][name], sent)
        for s, stage in self.units:
            args = [self._value(s, name, envs[s]) for name in stage.inputs]
            times: dict[str, float] = {}
            outs = rg.TimedInterpreter(self.modules[(s, stage.name)], times, sync_cuda=self.sync).run(*args)
            for task, seconds in times.items():
                ctx.stats.on_task(task, seconds)
            for name, value in zip(stage.outputs, outs):
                envs[s][name] = value
                self._send(s, name, value, sent)
        results = {}
        for s, split in enumerate(self.splits):
            if split.output_owner == me:
                env = {name: self._value(s, name, envs[s]) for name in split.output_inputs}
                results[s] = rg.assemble_output(self.output_template, env)
        return results

    def _outputs(self, results: dict[int, torch.Tensor]) -> dict:
        parts = self.ctx.comm.gather({s: _to_cpu(v) for s, v in results.items()})
        if self.ctx.rank != 0:
            return {}
        assert parts is not None
        by_shard = {s: v for part in parts for s, v in part.items()}
        output = torch.cat([by_shard[s] for s in sorted(by_shard)], dim=0)
        path = Path(self.ctx.table.run.workdir) / "output.pt"
        torch.save(output, path)
        return {"output": tensor_summary(output), "output_path": str(path), "input_seed": self.ctx.table.run.seed}


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
