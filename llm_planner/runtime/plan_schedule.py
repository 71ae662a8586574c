"""The plan's schedule as the runtime runs it: the one source of truth for what each device
computes per step. Pure Python (no torch, no mpi4py): the launcher, the ranks and
`measure` all read it.

- A *batch* is the plan's batch of Q samples, cut into the plan's shards (sizes as in
  the plan: a shard that shares its devices with another is a pipelined micro-batch).
  Each (batch, shard) is a *stream* of requests that walks its shard's stages once
  per step (per generated token for decoders).
- A *stage* is a maximal run of consecutive tasks of a shard's chain on one plan
  device (a device or a tensor-parallel group; a group's stage runs on all its
  members' ranks, the first one leading: it sends the stage's output).
- Every rank runs its stages in one fixed order per step: by batch, then by the
  start time the plan's schedule gives the stage's first task (ties: finish time,
  shard, chain position). Every dependency goes from an earlier item to a later one
  in that order, so no rank waits on another in a cycle, and the members of a group
  make their collective calls in the same order.
- Latency plans run one batch. Throughput plans run the steady state: enough batches
  in flight that the busiest device never waits, ceil(one batch's makespan / the
  busiest device's load per batch), each batch as the plan cuts it. So every device
  makes one call per (stream, task) per step at the shard's size, which is what the
  plan's cost counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_planner.groups import member_names
from llm_planner.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Stage:
    device: str  # the plan's device: a device or a group name
    ranks: tuple[int, ...]  # the ranks that run it, the leader first
    tasks: tuple[str, ...]
    key: tuple  # where the stage's first task sits in the plan's schedule

    @property
    def leader(self) -> int:
        return self.ranks[0]


@dataclass(frozen=True, kw_only=True)
class Stream:
    index: int
    batch: int
    shard: int
    requests: tuple[int, ...]  # request indices in the whole run (batch-major)


def in_flight_batches(plan: Plan) -> int:
    """1 for latency plans; for throughput plans the batches needed to keep the busiest device busy."""
    if plan.objective != "throughput" or plan.max_load_s <= 0:
        return 1
    makespan = max((t.finish_s for t in plan.schedule), default=0.0)
    return max(1, math.ceil(makespan / plan.max_load_s - 1e-9))


def ranks_of_devices(plan: Plan, rank_of_device: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Plan device (device or group) -> the ranks of its members, in member order."""
    return {d: tuple(rank_of_device[m] for m in member_names(d)) for d in plan.devices_used()}


def shard_stages(plan: Plan, shard: int, chain: list[str], ranks_of: dict[str, tuple[int, ...]]) -> list[Stage]:
    """The shard's chain cut into stages (contiguous runs on one plan device)."""
    assignment = plan.shard_assignments[shard]
    timing = {t.task: (t.start_s, t.finish_s) for t in plan.schedule if t.shard == shard}
    runs: list[list[str]] = []
    for task in chain:
        if runs and assignment[runs[-1][0]] == assignment[task]:
            runs[-1].append(task)
        else:
            runs.append([task])
    return [Stage(device=assignment[run[0]], ranks=ranks_of[assignment[run[0]]], tasks=tuple(run),
                  key=(*timing.get(run[0], (0.0, 0.0)), shard, chain.index(run[0]))) for run in runs]


def streams_of(plan: Plan, batches: int) -> list[Stream]:
    """(batch, shard) streams; batch w's requests are w*Q .. w*Q + Q - 1, cut by the plan's shard sizes."""
    streams, first = [], 0
    for w in range(batches):
        for shard, size in enumerate(plan.shard_sizes):
            streams.append(Stream(index=len(streams), batch=w, shard=shard, requests=tuple(range(first, first + size))))
            first += size
    return streams


def rank_order(rank: int, streams: list[Stream], routes: list[list[Stage]]) -> list[tuple[int, int]]:
    """(stream, stage) items of one step that `rank` runs, in the order it runs them (module docstring)."""
    items = [(stream.batch, stage.key, stream.index, k) for stream in streams
             for k, stage in enumerate(routes[stream.shard]) if rank in stage.ranks]
    return [(s, k) for _, _, s, k in sorted(items)]


def calls_per_step(plan: Plan, batches: int) -> dict[tuple[str, str], list[int]]:
    """(plan device, task) -> the sample count of each call it makes per step."""
    calls: dict[tuple[str, str], list[int]] = {}
    for stream in streams_of(plan, batches):
        for task, device in plan.shard_assignments[stream.shard].items():
            calls.setdefault((device, task), []).append(len(stream.requests))
    return calls
