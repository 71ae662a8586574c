"""Tensor transfers between ranks, and what they cost (the one module that imports mpi4py).

Tensors travel as raw bytes with buffer-based MPI calls: the sender posts a
non-blocking `Isend` of the tensor's bytes (a contiguous CPU copy; CUDA
tensors are staged through host memory), so no rank ever blocks in a send and
two ranks that send to each other cannot deadlock. Two forms:

- known shape (decoder stages: both ends derive the shape from the step):
  `isend(t, dest, tag)` and `recv_into(buffer, source, tag)`;
- self-describing (fx stages): `isend_value` first sends a 16-integer header
  (kind, dtype, ndim, dims), then the bytes; values that are not tensors
  (ints, tuples, None) go pickled after a header that says so.

Every call is timed into `CommStats`: time spent transferring (posting sends,
receiving a message that has arrived) apart from time spent idle (waiting for
a message that has not arrived yet: pipeline bubbles, slower ranks).

How a rank waits (for a message, for its sends, in the barrier and gathers at
the end of a run) depends on whether its host has a core for every rank:

- yes (`spin=True`): it polls back to back, as MPI's own blocking calls do.
  A rank that slept instead woke with a cold core: on the 2-core development
  VM a GPT-2 decode step over two ranks measured +27% against its profile
  when waiting ranks slept and +8% when they spun (benchmarks/run_measure.sh,
  2026-11-22);
- no (more ranks than cores, `spin=False`): it polls, then sleeps between
  polls (longer as the wait goes on), so it does not take the core of a rank
  that computes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
)
HEADER_LEN = 16
SPIN_POLLS = 200  # Iprobe calls (tens of microseconds) before a waiting rank starts to sleep
SLEEP_S = 50e-6  # the first sleep between polls once waiting longer
SLEEP_FRACTION = 0.05  # then sleep this fraction of the time waited so far ...
MAX_SLEEP_S = 1e-3  # ... up to this
_TENSOR, _OBJECT = 1, 2


def spins_while_waiting(ranks_on_host: int, cores: int) -> bool:
    """Whether a rank should poll without sleeping: only when its host has a core for every rank on it."""
    return ranks_on_host <= cores


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks on this OS
        return os.cpu_count() or 1


def _poll(done: Callable[[], bool], spin: bool) -> None:
    """Call `done` until it is true; back to back when `spin`, else as `_poll_then_sleep`."""
    if spin:
        while not done():
            pass
    else:
        _poll_then_sleep(done)


def _poll_then_sleep(done: Callable[[], bool]) -> None:
    """Call `done` until it is true: SPIN_POLLS times back to back, then with sleeps that grow with the wait.

    Each wake-up costs a waiting rank some 20 us of CPU (the poll and the
    scheduler); at a fixed 50 us sleep three waiting ranks took a third of a
    core from the one computing, which on a host with more ranks than cores
    made the run's tasks measurably slower than their profile (taken with the
    other ranks asleep). A sleep of 5% of the time waited so far, from 50 us
    up to 1 ms, keeps a long wait's CPU cost near 2% and adds at most 5% of
    the wait (and at most 1 ms) to when the rank notices its message.
    """
    polls = 0
    start = time.perf_counter()
    while not done():
        polls += 1
        if polls > SPIN_POLLS:
            waited = time.perf_counter() - start
            time.sleep(min(MAX_SLEEP_S, max(SLEEP_S, SLEEP_FRACTION * waited)))


class CommError(RuntimeError):
    """A message that cannot be sent as the runtime needs (too many dims, tag out of range)."""


@dataclass
class CommStats:
    transfer_s: float = 0.0
    idle_s: float = 0.0
    by_peer: dict[tuple[int, str], list[float]] = field(
        default_factory=dict
    )  # (peer, "send"/"recv") -> [count, bytes, s]

    def add(self, peer: int, direction: str, nbytes: int, seconds: float) -> None:
        entry = self.by_peer.setdefault((peer, direction), [0, 0, 0.0])
        entry[0] += 1
        entry[1] += nbytes
        entry[2] += seconds
        self.transfer_s += seconds

    def transfers(self) -> list[dict[str, Any]]:
        return [
            {"peer": peer, "direction": d, "count": int(c), "bytes": int(b), "seconds": s}
            for (peer, d), (c, b, s) in sorted(self.by_peer.items())
        ]


def _as_bytes(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


class Comm:
    """COMM_WORLD with timed, buffer-based tensor transfers."""

    def __init__(self, world=None, *, spin: bool = False):
        self.world = world if world is not None else MPI.COMM_WORLD
        self.spin = spin  # wait by polling back to back (a core per rank) rather than polling and sleeping
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.tag_ub = int(self.world.Get_attr(MPI.TAG_UB))
        self.stats = CommStats()
        self._pending: list[tuple[Any, Any]] = []  # (request, buffer kept alive until complete)

    def check_tag(self, tag: int, what: str, remedy: str = "use fewer micro-batches or tokens") -> int:
        if not 0 <= tag <= self.tag_ub:
            raise CommError(f"{what}: message tag {tag} exceeds this MPI's limit {self.tag_ub}; {remedy}")
        return tag

    # -- known shapes -----------------------------------------------------------
    def isend(self, t: torch.Tensor, dest: int, tag: int) -> None:
        start = time.perf_counter()
        buf = _as_bytes(t)
        self._pending.append((self.world.Isend([buf, MPI.BYTE], dest=dest, tag=tag), buf))
        self.stats.add(dest, "send", buf.nbytes, time.perf_counter() - start)
        if len(self._pending) > 64:
            self._reap()

    def recv_into(self, out: torch.Tensor, source: int, tag: int) -> torch.Tensor:
        """Receive into the contiguous CPU tensor `out`."""
        start = time.perf_counter()
        self.world.Recv([out.view(-1).view(torch.uint8).numpy(), MPI.BYTE], source=source, tag=tag)
        self.stats.add(source, "recv", out.numel() * out.element_size(), time.perf_counter() - start)
        return out

    def probe_any(self) -> tuple[int, int]:
        """Wait for any message; returns its (source, tag). The wait counts as idle."""
        status = MPI.Status()
        self._wait(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        return status.Get_source(), status.Get_tag()

    def wait_for(self, source: int, tag: int) -> None:
        """Wait for the message (source, tag) to arrive; the wait counts as idle."""
        self._wait(source, tag)

    def _wait(self, source: int, tag: int, status=None) -> None:
        """Wait for a message, spinning or sleeping between polls (see the module docstring).

        MPI's blocking Probe always spins; with more ranks than cores (CI,
        laptops) the spinning ranks would slow down the ones computing.
        """
        start = time.perf_counter()
        _poll(lambda: self.world.Iprobe(source=source, tag=tag, status=status), self.spin)
        self.stats.idle_s += time.perf_counter() - start

    # -- self-describing values ----------------------------------------------------
    def isend_value(self, value: Any, dest: int, tag: int, *, synchronous: bool = False) -> list:
        """Post a value's header and bytes; the requests. Synchronous, they complete only once the reader has
        taken the value (MPI's synchronous mode), so a caller that waits on them bounds what it holds."""
        start = time.perf_counter()
        send, send_object = (
            (self.world.Issend, self.world.issend) if synchronous else (self.world.Isend, self.world.isend)
        )
        header = np.zeros(HEADER_LEN, dtype=np.int64)
        if isinstance(value, torch.Tensor) and value.dtype in DTYPES and value.dim() <= HEADER_LEN - 3:
            header[:3] = (_TENSOR, DTYPES.index(value.dtype), value.dim())
            header[3 : 3 + value.dim()] = value.shape
            buf = _as_bytes(value)
            posted = [
                (send([header, MPI.INT64_T], dest=dest, tag=tag), header),
                (send([buf, MPI.BYTE], dest=dest, tag=tag), buf),
            ]
            nbytes = buf.nbytes
        else:
            header[0] = _OBJECT
            posted = [
                (send([header, MPI.INT64_T], dest=dest, tag=tag), header),
                (send_object(value, dest=dest, tag=tag), None),
            ]
            nbytes = 0
        self._pending += posted
        self.stats.add(dest, "send", nbytes, time.perf_counter() - start)
        if len(self._pending) > 64:  # a completed send's buffer is freed here, not at the run's end
            self._reap()
        return [request for request, _ in posted]

    def recv_value(self, source: int, tag: int, device: torch.device | None = None) -> Any:
        self._wait(source, tag)
        start = time.perf_counter()
        header = np.zeros(HEADER_LEN, dtype=np.int64)
        self.world.Recv([header, MPI.INT64_T], source=source, tag=tag)
        if header[0] == _OBJECT:
            value = self.world.recv(source=source, tag=tag)
            self.stats.add(source, "recv", 0, time.perf_counter() - start)
            return value
        shape = tuple(int(d) for d in header[3 : 3 + int(header[2])])
        out = torch.empty(shape, dtype=DTYPES[int(header[1])])
        self.world.Recv([out.view(-1).view(torch.uint8).numpy(), MPI.BYTE], source=source, tag=tag)
        self.stats.add(source, "recv", out.numel() * out.element_size(), time.perf_counter() - start)
        return out.to(device) if device is not None else out

    # -- completion and collectives ------------------------------------------------
    def _reap(self) -> None:
        self._pending = [(req, buf) for req, buf in self._pending if not req.Test()]

    def wait_requests(self, requests: list) -> None:
        """Wait until these posted sends have completed; the wait counts as idle."""
        start = time.perf_counter()
        for request in requests:
            _poll(request.Test, self.spin)
        self.stats.idle_s += time.perf_counter() - start
        self._reap()  # their buffers are freed now, not at the next reap

    def wait_sends(self) -> None:
        """Wait until every posted send has completed (spinning or sleeping between polls, see the module docstring)."""
        start = time.perf_counter()
        for req, _ in self._pending:
            _poll(req.Test, self.spin)
        self._pending.clear()
        self.stats.idle_s += time.perf_counter() - start

    def barrier(self) -> None:
        """A barrier whose waiting ranks sleep between polls when the host has fewer cores than ranks.

        MPI's Barrier always spins: a rank that finished its part early would
        then take a core from the ranks still computing, and their tasks would
        run slower than they were profiled.
        """
        request = self.world.Ibarrier()
        _poll(request.Test, self.spin)

    def gather(self, obj: Any) -> list[Any] | None:
        self.barrier()  # wait quietly for the slowest rank; the gather itself then does not wait
        return self.world.gather(obj, root=0)

    def allgather(self, obj: Any) -> list[Any]:
        self.barrier()
        return self.world.allgather(obj)

    def abort(self, code: int) -> None:
        self.world.Abort(code)

    def group(self, members: tuple[int, ...] | None) -> "GroupComm | None":
        """The tensor-parallel group of this rank (`members`: its world ranks, leader first), or None.

        Collective over the world: every rank calls it, once, with its own group
        or None (a rank belongs to at most one group)."""
        color = MPI.UNDEFINED if not members or len(members) < 2 else min(members)
        sub = self.world.Split(color, self.rank)
        return None if sub == MPI.COMM_NULL else GroupComm(sub, spin=self.spin)


class GroupComm:
    """A group's collectives on CPU or CUDA tensors: all-reduce (sum) and all-gather (a tensor-parallel
    group), and all-gather and reduce-scatter of rows whose counts differ by member (the experts of a
    group with data-parallel attention, llm_planner.runtime.ep_moe).

    Tensors are reduced in float32 on the host (CUDA tensors staged through host
    memory, like point-to-point transfers); the non-blocking MPI calls are
    waited on as the rank waits for messages (spinning or sleeping between
    polls). Each call is counted and timed in `stats` (count, bytes, seconds per
    kind); the time is also inside the task that made the call, as the planner
    costs a group's collectives inside its task times."""

    def __init__(self, comm, *, spin: bool = False):
        self.comm, self.spin = comm, spin
        self.index, self.size = comm.Get_rank(), comm.Get_size()
        self.stats: dict[str, list[float]] = {}

    def _count(self, kind: str, nbytes: int, seconds: float) -> None:
        entry = self.stats.setdefault(kind, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += nbytes
        entry[2] += seconds

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the group, in place; returns `t`."""
        start = time.perf_counter()
        host = t.detach().to("cpu", torch.float32).contiguous()
        buf = host.numpy()
        request = self.comm.Iallreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM)
        _poll(request.Test, self.spin)
        if host is not t:  # a contiguous float32 CPU tensor was reduced in place
            t.copy_(host.to(t.device, t.dtype))
        self._count("all_reduce", t.numel() * t.element_size(), time.perf_counter() - start)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """[size, *t.shape]: every member's `t`, in member order (float32, on t's device)."""
        start = time.perf_counter()
        mine = t.detach().to("cpu", torch.float32).contiguous()
        every = torch.empty((self.size, *mine.shape), dtype=torch.float32)
        request = self.comm.Iallgather([mine.numpy(), MPI.FLOAT], [every.numpy(), MPI.FLOAT])
        _poll(request.Test, self.spin)
        self._count("all_gather", mine.numel() * 4, time.perf_counter() - start)
        return every.to(t.device)

    def all_gather_v(self, t: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """[sum(counts), *t.shape[1:]]: every member's rows, in member order, member i holding counts[i] of them
        (`t` this member's; float32, on t's device)."""
        start = time.perf_counter()
        mine = t.detach().to("cpu", torch.float32).contiguous()
        row = int(np.prod(t.shape[1:]))
        every = torch.empty((sum(counts), *t.shape[1:]), dtype=torch.float32)
        sizes = [c * row for c in counts]
        displacements = [sum(sizes[:i]) for i in range(len(sizes))]
        request = self.comm.Iallgatherv([mine.numpy(), MPI.FLOAT], [every.numpy(), (sizes, displacements), MPI.FLOAT])
        _poll(request.Test, self.spin)
        self._count("all_gather", mine.numel() * 4, time.perf_counter() - start)
        return every.to(t.device)

    def reduce_scatter_v(self, t: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """This member's rows of the sum of every member's `t` ([sum(counts), ...]): rows
        [sum(counts[:i]), sum(counts[:i + 1])) for member i (float32 sums, in t's dtype and device)."""
        start = time.perf_counter()
        whole = t.detach().to("cpu", torch.float32).contiguous()
        row = int(np.prod(t.shape[1:]))
        mine = torch.empty((counts[self.index], *t.shape[1:]), dtype=torch.float32)
        request = self.comm.Ireduce_scatter(
            [whole.numpy(), MPI.FLOAT], [mine.numpy(), MPI.FLOAT], [c * row for c in counts], op=MPI.SUM
        )
        _poll(request.Test, self.spin)
        self._count("reduce_scatter", whole.numel() * 4, time.perf_counter() - start)
        return mine.to(t.device, t.dtype)

    def collectives(self) -> dict[str, dict[str, float]]:
        return {
            kind: {"count": int(c), "bytes": int(b), "seconds": s} for kind, (c, b, s) in sorted(self.stats.items())
        }
