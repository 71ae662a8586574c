"""A replica of one stage with data-parallel attention under MPI: each member its own scheduler.

Each of the k members of a `dpaK` stage (experts split over the group: llm_planner.runtime.ep_moe)
serves its own share of the replica, as vLLM's data-parallel ranks and SGLang's DP-attention
workers do, and as the planner charges it (llm_planner.cost.dp_attention):

- slots: C // k of the replica's C (the first C mod k members one more: `member_slots`);
- the token budget: a k-th of the plan's, rounded up (what the export gives each vLLM rank);
- requests: those the front end routes to the replica, spread over the members by smooth
  weighted round-robin on their slots (llm_planner.runtime.serve_requests.ReplicaQueue), so a
  member with one slot more takes its share more.

A member is its index in the group's communicator (`ctx.group.index`), the order of the experts
it holds and of the rows it gathers (llm_planner.runtime.ep_moe).

The members run their iterations in lockstep, since each MoE layer's experts need every member's
tokens. Before each iteration they exchange (tokens, done, decodes only) in one all-gather: when
every member is done, all stop; when none has tokens but some are not done (an open loop waiting
for arrivals), each sleeps until its next arrival (at most MAX_IDLE_SLEEP_S) and they exchange
again; otherwise every member runs, one with no tokens an empty iteration (its part in the layers'
expert collectives: ServeStage.idle). An iteration is recorded as decode-only when no member's
carries a prompt chunk (a member's step waits for the others' chunks in the collectives). The
members start their clocks after one exchange, so their records share an origin; rank 0 merges
them into the replica's (serve_record.merge_records). Each member keeps its record on disk on
every pass (serve_progress), and its heartbeat says it waits on the group from each exchange
until its iteration ends, so a stalled member or link stops the run within the stall timeout.
"""

from __future__ import annotations

import time

import torch

from llm_planner.runtime.serve_progress import Progress
from llm_planner.runtime.serve_record import replica_record, request_record
from llm_planner.runtime.serve_requests import ReplicaQueue, RequestStream
from llm_planner.runtime.serve_scheduler import Scheduler

MAX_IDLE_SLEEP_S = 0.01  # a replica with nothing in flight in an open loop sleeps at most this long between checks


def member_slots(concurrency: int, k: int, member: int) -> int:
    """The sequences member `member` of k holds (module docstring)."""
    return concurrency // k + (member < concurrency % k)


def member_budget(max_batched_tokens: int, k: int) -> int:
    """A member's tokens per iteration: a k-th of the plan's budget, rounded up."""
    return -(-max_batched_tokens // k)


def _scheduler(job) -> Scheduler:
    spec, replica, member = job.spec, job.replica, job.ctx.group.index
    k = len(replica.stages[0].ranks)
    slots = tuple(member_slots(replica.concurrency, k, j) for j in range(k))
    queue = ReplicaQueue(
        RequestStream(spec.load), spec.shares, job.role.replica, spec.max_requests, member=member, member_weights=slots
    )
    return Scheduler(
        concurrency=slots[member],
        micro_batches=1,
        max_batched_tokens=member_budget(spec.max_batched_tokens, k),
        context_len=spec.context_len,
        queue=queue,
    )


def serve_member(job) -> dict:
    """Serve this member's requests in lockstep with the group (module docstring); its raw record.
    `job`: the rank's llm_planner.runtime.serve_run.ServeRank."""
    sched, group, role = _scheduler(job), job.ctx.group, job.role
    group.all_gather(torch.zeros(1))  # the members start their clocks together
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    iterations: list[list] = []
    progress = Progress(job.ctx.table.run.workdir, role.replica, member=group.index)
    while True:
        if job.spec.duration_s is not None and clock() >= job.spec.duration_s:
            sched.closing = True
        it = sched.next_iteration(0, clock())
        job.beat.inflight = 1  # waiting on the group from here to the iteration's end
        state = group.all_gather(torch.tensor(_state(it, sched)))
        if bool(state[:, 1].all()):
            break
        busy = bool(state[:, 0].any())  # some member has tokens: every member runs an iteration
        if busy:
            _iterate(job, it, sched, clock, bool(state[:, 2].all()), iterations)
        job.beat.inflight = 0
        progress.update(clock(), sched.finished, iterations, request_record)
        if not busy:
            arrival = sched.waiting_for_arrival(clock())
            time.sleep(min(MAX_IDLE_SLEEP_S, max(0.0, (arrival or 0.0) - clock())))
    job.beat.inflight = 0
    return replica_record(role.replica, sched.finished, iterations, clock())


def _state(it, sched: Scheduler) -> list[float]:
    """What a member tells the group before an iteration: its tokens, whether it is done, and
    whether its iteration carries decodes only (an empty one does)."""
    return [float(it.num_tokens if it else 0), float(it is None and sched.done), float(it is None or it.decode_only)]


def _iterate(job, it, sched: Scheduler, clock, decode_only: bool, iterations: list[list]) -> None:
    """Run this member's iteration (an empty one when it has none) and record it; `decode_only`: the group's."""
    job.beat.progress += 1
    if it is None:
        job.stage.idle()
        return
    sent = clock()
    tokens = job.run_stage(it.entries, torch.tensor(it.token_ids, dtype=torch.long))
    sched.apply_tokens(it, tokens.tolist(), clock())
    iterations.append([sent, clock(), decode_only, it.num_tokens, len(it.entries)])
