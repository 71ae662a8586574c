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
- Every plan device (so every rank, and every member of a group alike) runs its
  items, (step, stream, stage), in one fixed order, found by simulating the run
  with the plan's task times (`device_orders`): within one step of one batch, the
  plan's own order of the device's work (by the start times of the plan's
  schedule); across steps and batches, whichever item could start first (ties: the
  lower batch, then the earlier step), as a pipeline in steady state runs. The
  simulation is a valid schedule, so every dependency comes earlier in that order:
  no rank waits on another in a cycle, and a group's members make their collective
  calls in the same order.
- Latency plans run one batch. Throughput plans run the steady state: enough batches
  in flight that the busiest device never waits, ceil(one batch's makespan / the
  busiest device's load per batch), each batch as the plan cuts it. So every device
  makes one call per (stream, task) per step at the shard's size, which is what the
  plan's cost counted. (This is the decoders' schedule; a graph run streams its
  batches in a wavefront order of its own: llm_planner.runtime.graph_run.)
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_planner.core.plan import Plan
from llm_planner.core.tensor_groups import member_names


@dataclass(frozen=True, kw_only=True)
class Stage:
    device: str  # the plan's device: a device or a group name
    ranks: tuple[int, ...]  # the ranks that run it, the leader first
    tasks: tuple[str, ...]
    key: tuple  # where the stage's first task sits in the plan's schedule
    duration_s: float = 0.0  # the plan's time of its tasks
    gap_s: float = 0.0  # the plan's time between the previous stage's end and its start (the transfer)

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
    """1 for latency plans; for throughput plans the batches needed to keep the busiest device busy:
    the plan's own count (llm_planner.core.plan.batches_in_flight), the one its memory was checked for."""
    return plan.batches_in_flight


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
    stages, end = [], None
    for run in runs:
        start, finish = timing.get(run[0], (0.0, 0.0))[0], timing.get(run[-1], (0.0, 0.0))[1]
        busy = sum(max(0.0, timing[t][1] - timing[t][0]) for t in run if t in timing)
        stages.append(
            Stage(
                device=assignment[run[0]],
                ranks=ranks_of[assignment[run[0]]],
                tasks=tuple(run),
                key=(*timing.get(run[0], (0.0, 0.0)), shard, chain.index(run[0])),
                duration_s=busy,
                gap_s=0.0 if end is None else max(0.0, start - end),
            )
        )
        end = finish
    return stages


def streams_of(plan: Plan, batches: int) -> list[Stream]:
    """(batch, shard) streams; batch w's requests are w*Q .. w*Q + Q - 1, cut by the plan's shard sizes."""
    streams, first = [], 0
    for w in range(batches):
        for shard, size in enumerate(plan.shard_sizes):
            streams.append(Stream(index=len(streams), batch=w, shard=shard, requests=tuple(range(first, first + size))))
            first += size
    return streams


Item = tuple[int, int, int]  # (step, stream, stage)


def device_orders(streams: list[Stream], routes: list[list[Stage]], steps: int) -> dict[str, list[Item]]:
    """Each plan device's items in the order it runs them (module docstring): a list schedule of the
    run with the plan's stage times, each (batch, step)'s items on a device in the plan's order."""
    queues: dict[str, dict[tuple[int, int], list[Item]]] = {}
    for step in range(steps):
        for stream in streams:
            for k, stage in enumerate(routes[stream.shard]):
                queues.setdefault(stage.device, {}).setdefault((stream.batch, step), []).append((step, stream.index, k))
    for per_device in queues.values():
        for items in per_device.values():
            items.sort(key=lambda item: routes[streams[item[1]].shard][item[2]].key)
    return _list_schedule(queues, streams, routes)


def _list_schedule(
    queues: dict[str, dict[tuple[int, int], list[Item]]], streams: list[Stream], routes: list[list[Stage]]
) -> dict[str, list[Item]]:
    free = {device: 0.0 for device in queues}
    done: dict[Item, float] = {}
    orders: dict[str, list[Item]] = {device: [] for device in queues}
    heads = {device: {q: 0 for q in per} for device, per in queues.items()}
    remaining = sum(len(items) for per in queues.values() for items in per.values())
    while remaining:
        best = None
        for device, per in queues.items():
            for q, items in per.items():
                if heads[device][q] < len(items):
                    ready = _ready(items[heads[device][q]], done, streams, routes)
                    candidate = None if ready is None else (max(free[device], ready), q[0], q[1], device, q)
                    if candidate is not None and (best is None or candidate < best):
                        best = candidate
        assert best is not None, "the plan's order admits no next item"  # cannot happen: see device_orders
        start, _, _, device, q = best
        item = queues[device][q][heads[device][q]]
        heads[device][q] += 1
        stage = routes[streams[item[1]].shard][item[2]]
        done[item] = free[device] = start + stage.duration_s
        orders[device].append(item)
        remaining -= 1
    return orders


def _ready(item: Item, done: dict[Item, float], streams: list[Stream], routes: list[list[Stage]]) -> float | None:
    """When the item's input is there (None: its producer has not run yet)."""
    step, s, k = item
    route = routes[streams[s].shard]
    if k == 0 and step == 0:
        return 0.0
    before = (step, s, k - 1) if k > 0 else (step - 1, s, len(route) - 1)
    return None if before not in done else done[before] + route[k].gap_s


def calls_per_step(plan: Plan, batches: int) -> dict[tuple[str, str], list[int]]:
    """(plan device, task) -> the sample count of each call it makes per step."""
    calls: dict[tuple[str, str], list[int]] = {}
    for stream in streams_of(plan, batches):
        for task, device in plan.shard_assignments[stream.shard].items():
            calls.setdefault((device, task), []).append(len(stream.requests))
    return calls
