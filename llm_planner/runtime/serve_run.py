"""A served plan under MPI: every rank's part in its replica's pipeline (run.workload "serving").

Roles (llm_planner.runtime.serve_spec says which rank is where):

- the first stage's leader runs the replica's scheduler (llm_planner.runtime.serve_scheduler):
  it keeps every micro-batch in flight (an iteration each), runs the first stage on it and sends
  it on; when the oldest iteration's tokens come back from the last stage (iterations leave the
  pipeline in the order they entered it: every stage takes them first in, first out), it hands
  them to the scheduler and builds that micro-batch's next iteration;
- every other rank of a stage waits for iterations from the previous stage's leader (the first
  stage's other members from the scheduler), runs its share of the stage on each, and, if it
  leads the stage, sends the result to every rank of the next stage, or the sampled tokens back
  to the scheduler from the last stage;
- when its requests are served, the scheduler sends a stop down the pipeline and every rank ends.
- a replica of one stage with data-parallel attention has no leader: each member schedules its own
  sequences, in lockstep with the others (llm_planner.runtime.serve_dp).

Each message is an iteration's entries ([n, 4] int64: slot, start, tokens, sample; a stop is
[1, 4] of -1) followed by its value (the first stage's token ids, hidden states after), sent
with llm_planner.runtime.comm's self-describing transfers; MPI keeps the order of messages
between two ranks, so one tag per direction suffices. The first stage's leader measures the
replica: when each request was admitted, when each of its tokens came back, and each
iteration's round trip; rank 0 gathers them into the raw run record the launcher turns into the
run report (llm_planner.launch.serve_report). As it goes, it also keeps its record so far on disk
(llm_planner.runtime.serve_progress), for the report of a run that fails. Every rank prints a
heartbeat line each second (llm_planner.runtime.heartbeat: what it finished, and the scheduler
what it waits for), so the launcher stops a run whose rank or link stalls within seconds.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import torch

from llm_planner.runtime import gpt
from llm_planner.runtime.heartbeat import Heartbeat
from llm_planner.runtime.serve_dp import MAX_IDLE_SLEEP_S, member_slots, serve_member
from llm_planner.runtime.serve_graphs import Pieces, capture_refusal
from llm_planner.runtime.serve_progress import Progress
from llm_planner.runtime.serve_record import merge_records, replica_record, request_record
from llm_planner.runtime.serve_requests import ReplicaQueue, RequestStream
from llm_planner.runtime.serve_scheduler import Entry, Iteration, Scheduler
from llm_planner.runtime.serve_spec import ServeSpec
from llm_planner.runtime.serve_stage import ServeStage

log = logging.getLogger(__name__)

TAG_FORWARD, TAG_BACK = 7, 8
RAW_FORMAT = "llm_planner.serving_raw"


def _entries_tensor(entries) -> torch.Tensor:
    return torch.tensor([[e.slot, e.start, e.tokens, int(e.sample)] for e in entries], dtype=torch.long)


def _stop_tensor() -> torch.Tensor:
    return torch.full((1, 4), -1, dtype=torch.long)


def _entries_of(t: torch.Tensor) -> tuple[Entry, ...] | None:
    rows = t.tolist()
    if rows and rows[0][0] < 0:
        return None
    return tuple(Entry(int(s), int(a), int(n), bool(k)) for s, a, n, k in rows)


class ServeRank:
    def __init__(self, ctx):
        self.ctx, run = ctx, ctx.table.run
        self.spec = ServeSpec.from_dict(run.serving)
        self.role = self.spec.role(ctx.rank)
        self.replica = self.spec.replicas[self.role.replica]
        self.stages = self.replica.stages
        here = self.stages[self.role.stage]
        config = gpt.prepare_config(gpt.load_hf_config({"name": self.spec.model}, run.checkpoint))
        source = gpt.weight_source(config, checkpoint=run.checkpoint, seed=run.seed)
        self.data_parallel = here.attention == "dp"
        k = len(here.ranks)
        self.stage = ServeStage(
            config,
            first_layer=here.first_layer,
            num_layers=here.layers,
            slots=member_slots(self.replica.concurrency, k, ctx.group.index)
            if self.data_parallel
            else self.replica.concurrency,
            context_len=self.spec.context_len,
            device=ctx.device,
            dtype=ctx.dtype,
            source=source,
            ops=None if self.data_parallel else ctx.group,
            experts=ctx.group if self.data_parallel else None,
        )
        self.runner = self._runner()
        self.beat = Heartbeat(ctx.rank)  # started once the stage is built (llm_planner.runtime.heartbeat)
        ctx.stats.extra["weights"] = source.summary()
        ctx.stats.extra.update(replica=self.role.replica, stage=self.role.stage, member=self.role.member)

    def _runner(self) -> ServeStage | Pieces:
        """The stage, or its piecewise CUDA graphs where it can take them (llm_planner.runtime.serve_graphs)."""
        why = capture_refusal(self.stage) if self.spec.cuda_graphs else "off (launch --enforce-eager)"
        if self.data_parallel and self.ctx.device.type == "cuda" and self.spec.cuda_graphs:
            why = "data-parallel attention: the experts' collectives move a different number of rows each iteration"
        self.ctx.stats.extra["cuda_graphs"] = why or "on"
        if why is not None:
            return self.stage
        max_tokens = max(self.spec.max_batched_tokens, -(-self.replica.concurrency // self.replica.micro_batches))
        started = time.perf_counter()
        try:
            pieces = Pieces(self.stage, max_tokens, capture=True)
            sizes = pieces.capture_all()
        except RuntimeError as exc:  # a kernel that cannot be captured (a host sync in the model's code)
            self.ctx.stats.extra["cuda_graphs"] = f"capture failed, ran eagerly: {str(exc).splitlines()[0]}"
            log.warning("rank %d: CUDA graph capture failed, running eagerly: %s", self.ctx.rank, exc)
            torch.cuda.synchronize(self.stage.device)
            return self.stage
        took = self.ctx.stats.extra["cuda_graphs_capture_s"] = time.perf_counter() - started
        log.info("rank %d: captured %d iteration sizes in %.1f s", self.ctx.rank, sizes, took)
        return pieces

    @property
    def is_scheduler(self) -> bool:
        """Whether this rank schedules requests: the first stage's leader, or every data-parallel member."""
        return self.role.stage == 0 and (self.role.member == 0 or self.data_parallel)

    def serve(self) -> dict:
        """The scheduler's loop (a data-parallel member's: llm_planner.runtime.serve_dp); its raw record."""
        return serve_member(self) if self.data_parallel else self.schedule()

    def _send_on(self, entries_t: torch.Tensor, value: torch.Tensor | None, k: int) -> None:
        """Stage k's output to every rank of stage k + 1 (nothing after the last stage)."""
        if k + 1 >= len(self.stages):
            return
        for rank in self.stages[k + 1].ranks:
            self.ctx.comm.isend_value(entries_t, rank, TAG_FORWARD)
            if value is not None:
                self.ctx.comm.isend_value(value, rank, TAG_FORWARD)

    def run_stage(self, entries, value: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        out = self.runner.run(entries, value)
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        self.ctx.stats.on_task(f"stage.{self.role.stage}", time.perf_counter() - start)
        return out

    # -- the ranks that follow ---------------------------------------------------------------
    def follow(self) -> None:
        """Run the stage on every iteration the previous stage (or the scheduler) sends, until the stop."""
        k, comm = self.role.stage, self.ctx.comm
        source = self.stages[k - 1].leader if k > 0 else self.stages[0].leader
        leads = self.role.member == 0
        while True:
            entries_t = comm.recv_value(source, TAG_FORWARD)
            entries = _entries_of(entries_t)
            if entries is None:
                if leads:
                    self._send_on(entries_t, None, k)
                return
            out = self.run_stage(entries, comm.recv_value(source, TAG_FORWARD, self.ctx.device))
            self.beat.progress += 1
            if not leads:
                continue
            if k + 1 == len(self.stages):
                comm.isend_value(out, self.stages[0].leader, TAG_BACK)
            else:
                self._send_on(entries_t, out, k)

    # -- the scheduler ---------------------------------------------------------------------------
    def schedule(self) -> dict:
        spec, replica = self.spec, self.replica
        queue = ReplicaQueue(RequestStream(spec.load), spec.shares, self.role.replica, spec.max_requests)
        sched = Scheduler(
            concurrency=replica.concurrency,
            micro_batches=replica.micro_batches,
            max_batched_tokens=spec.max_batched_tokens,
            context_len=spec.context_len,
            queue=queue,
        )
        start = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - start

        # in flight: (iteration, when sent, its tokens and when they were ready if this stage is also the last)
        inflight: deque[tuple[Iteration, float, torch.Tensor | None, float]] = deque()
        iterations: list[list] = []
        progress = Progress(self.ctx.table.run.workdir, self.role.replica)  # what was served, should the run fail
        while True:
            if spec.duration_s is not None and clock() >= spec.duration_s:
                sched.closing = True
            busy = {it.micro_batch for it, *_ in inflight}
            for j in range(replica.micro_batches):
                it = None if j in busy else sched.next_iteration(j, clock())
                if it is not None:
                    sent = clock()
                    tokens = self._dispatch(it)
                    inflight.append((it, sent, tokens, clock()))
            if not inflight:
                if sched.done:
                    break
                arrival = sched.waiting_for_arrival(clock())
                time.sleep(min(MAX_IDLE_SLEEP_S, max(0.0, (arrival or 0.0) - clock())))
                continue
            self.beat.inflight = len(inflight)  # what the replica waits for, should nothing come back
            it, sent, tokens, back = inflight.popleft()
            if tokens is None:
                tokens = self.ctx.comm.recv_value(self.stages[-1].leader, TAG_BACK)
                back = clock()
            sched.apply_tokens(it, tokens.tolist(), back)
            self.beat.progress += 1
            self.beat.inflight = len(inflight)
            iterations.append([sent, back, it.decode_only, it.num_tokens, len(it.entries)])
            progress.update(back, sched.finished, iterations, request_record)
        end = clock()
        stop = _stop_tensor()
        for rank in self.stages[0].ranks[1:]:
            self.ctx.comm.isend_value(stop, rank, TAG_FORWARD)
        self._send_on(stop, None, 0)
        return replica_record(self.role.replica, sched.finished, iterations, end)

    def _dispatch(self, it: Iteration) -> torch.Tensor | None:
        """Run the first stage on the iteration (its other members get it first); the tokens when this
        stage is also the last, else None (they come back from the last stage)."""
        entries_t, ids = _entries_tensor(it.entries), torch.tensor(it.token_ids, dtype=torch.long)
        for rank in self.stages[0].ranks[1:]:
            self.ctx.comm.isend_value(entries_t, rank, TAG_FORWARD)
            self.ctx.comm.isend_value(ids, rank, TAG_FORWARD)
        out = self.run_stage(it.entries, ids)
        if len(self.stages) == 1:
            return out
        self._send_on(entries_t, out, 0)
        return None


def run_serving(ctx) -> None:
    """Build this rank's stage, serve until the scheduler stops, and gather the measurements at rank 0."""
    from llm_planner.runtime.run_report import write_report

    started = time.perf_counter()
    job = ServeRank(ctx)
    ctx.stats.build_s = time.perf_counter() - started
    log.info(
        "rank %d: built replica %d stage %d on %s in %.2f s",
        ctx.rank,
        job.role.replica,
        job.role.stage,
        ctx.device,
        ctx.stats.build_s,
    )
    ctx.start()
    job.beat.start()
    record = job.serve() if job.is_scheduler else None
    if not job.is_scheduler:
        job.follow()
    ctx.comm.wait_sends()
    ctx.stats.stop()
    if ctx.group is not None:
        ctx.stats.extra["collectives"] = ctx.group.collectives()
    gathered = ctx.comm.gather({"rank": ctx.stats.to_dict(ctx.comm.stats), "replica": record})
    if ctx.rank == 0:
        assert gathered is not None
        replicas = merge_records([g["replica"] for g in gathered if g["replica"] is not None])
        write_report(
            ctx.table.run.report_path,
            {"format": RAW_FORMAT, "replicas": replicas, "ranks": [g["rank"] for g in gathered]},
        )
    ctx.comm.barrier()
    job.beat.stop()
