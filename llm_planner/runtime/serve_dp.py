"""A replica of one stage with data-parallel attention under MPI: each member its own scheduler.

Each of the k members of a `dpaK` stage (experts split over the group: llm_planner.runtime.ep_moe)
serves its own share of the replica, as vLLM's data-parallel ranks and SGLang's DP-attention
workers do, and as the planner charges it (llm_planner.cost.dp_attention):

- slots: C // k of the replica's C (the first C mod k members one more: `member_slots`);
- the token budget: a k-th of the plan's, rounded up (what the export gives each vLLM rank);
- requests: every k-th of those the front end routes to the replica (member j the replica's
  requests j, j + k, ...: llm_planner.runtime.serve_requests.ReplicaQueue).

The members run their iterations in lockstep, since each MoE layer's experts need every member's
tokens. Before each iteration they exchange (tokens, done) in one all-gather: when every member
is done, all stop; when none has tokens but some are not done (an open loop waiting for arrivals),
each sleeps until its next arrival (at most MAX_IDLE_SLEEP_S) and they exchange again; otherwise
every member runs, one with no tokens an empty iteration (its part in the layers' expert
collectives: ServeStage.idle). The members start their clocks after one exchange, so their
records share an origin; rank 0 merges them into the replica's (serve_record.merge_records).
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
    spec, replica, role = job.spec, job.replica, job.role
    k = len(replica.stages[0].ranks)
    queue = ReplicaQueue(
        RequestStream(spec.load), spec.shares, role.replica, spec.max_requests, member=role.member, members=k
    )
    return Scheduler(
        concurrency=member_slots(replica.concurrency, k, role.member),
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
    progress = Progress(job.ctx.table.run.workdir, role.replica, member=role.member)
    while True:
        if job.spec.duration_s is not None and clock() >= job.spec.duration_s:
            sched.closing = True
        it = sched.next_iteration(0, clock())
        mine = [float(it.num_tokens if it is not None else 0), float(it is None and sched.done)]
        state = group.all_gather(torch.tensor(mine))
        if bool(state[:, 1].all()):
            break
        if not bool(state[:, 0].any()):
            arrival = sched.waiting_for_arrival(clock())
            time.sleep(min(MAX_IDLE_SLEEP_S, max(0.0, (arrival or 0.0) - clock())))
            continue
        job.beat.progress += 1
        if it is None:
            job.stage.idle()
            continue
        sent = clock()
        tokens = job.run_stage(it.entries, torch.tensor(it.token_ids, dtype=torch.long))
        sched.apply_tokens(it, tokens.tolist(), clock())
        iterations.append([sent, clock(), it.decode_only, it.num_tokens, len(it.entries)])
        progress.update(clock(), sched.finished, iterations, request_record)
    return replica_record(role.replica, sched.finished, iterations, clock())
