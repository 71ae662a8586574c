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
a message that has not arrived yet: pipeline bubbles, slower ranks). A waiting
rank polls, then sleeps between polls, so it does not take the core of a rank
that computes when there are more ranks than cores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
          torch.uint8, torch.bool, torch.complex64)
HEADER_LEN = 16
SPIN_POLLS = 200  # Iprobe calls (tens of microseconds) before a waiting rank starts to sleep
SLEEP_S = 50e-6  # sleep between polls once waiting longer
_TENSOR, _OBJECT = 1, 2


class CommError(RuntimeError):
    """A message that cannot be sent as the runtime needs (too many dims, tag out of range)."""


@dataclass
class CommStats:
    transfer_s: float = 0.0
    idle_s: float = 0.0
    by_peer: dict[tuple[int, str], list[float]] = field(default_factory=dict)  # (peer, "send"/"recv") -> [count, bytes, s]

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

    def __init__(self, world=None):
        self.world = world if world is not None else MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.tag_ub = int(self.world.Get_attr(MPI.TAG_UB))
        self.stats = CommStats()
        self._pending: list[tuple[Any, Any]] = []  # (request, buffer kept alive until complete)

    def check_tag(self, tag: int, what: str) -> int:
        if not 0 <= tag <= self.tag_ub:
            raise CommError(f"{what}: message tag {tag} exceeds this MPI's limit {self.tag_ub}; use fewer micro-batches or tokens")
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

    def _wait(self, source: int, tag: int, status=None) -> None:
        """Poll for a message, then sleep between polls: a waiting rank leaves its core to the others.

        MPI's blocking Probe spins at full speed; with more ranks than cores (CI,
        laptops) the spinning ranks would slow down the ones computing.
        """
        start = time.perf_counter()
        polls = 0
        while not self.world.Iprobe(source=source, tag=tag, status=status):
            polls += 1
            if polls > SPIN_POLLS:
                time.sleep(SLEEP_S)
        self.stats.idle_s += time.perf_counter() - start

    # -- self-describing values ----------------------------------------------------
    def isend_value(self, value: Any, dest: int, tag: int) -> None:
        start = time.perf_counter()
        header = np.zeros(HEADER_LEN, dtype=np.int64)
        if isinstance(value, torch.Tensor) and value.dtype in DTYPES and value.dim() <= HEADER_LEN - 3:
            header[:3] = (_TENSOR, DTYPES.index(value.dtype), value.dim())
            header[3:3 + value.dim()] = value.shape
            buf = _as_bytes(value)
            self._pending.append((self.world.Isend([header, MPI.INT64_T], dest=dest, tag=tag), header))
            self._pending.append((self.world.Isend([buf, MPI.BYTE], dest=dest, tag=tag), buf))
            nbytes = buf.nbytes
        else:
            header[0] = _OBJECT
            self._pending.append((self.world.Isend([header, MPI.INT64_T], dest=dest, tag=tag), header))
            self._pending.append((self.world.isend(value, dest=dest, tag=tag), None))
            nbytes = 0
        self.stats.add(dest, "send", nbytes, time.perf_counter() - start)

    def recv_value(self, source: int, tag: int, device: torch.device | None = None) -> Any:
        self._wait(source, tag)
        start = time.perf_counter()
        header = np.zeros(HEADER_LEN, dtype=np.int64)
        self.world.Recv([header, MPI.INT64_T], source=source, tag=tag)
        if header[0] == _OBJECT:
            value = self.world.recv(source=source, tag=tag)
            self.stats.add(source, "recv", 0, time.perf_counter() - start)
            return value
        shape = tuple(int(d) for d in header[3:3 + int(header[2])])
        out = torch.empty(shape, dtype=DTYPES[int(header[1])])
        self.world.Recv([out.view(-1).view(torch.uint8).numpy(), MPI.BYTE], source=source, tag=tag)
        self.stats.add(source, "recv", out.numel() * out.element_size(), time.perf_counter() - start)
        return out.to(device) if device is not None else out

    # -- completion and collectives ------------------------------------------------
    def _reap(self) -> None:
        self._pending = [(req, buf) for req, buf in self._pending if not req.Test()]

    def wait_sends(self) -> None:
        start = time.perf_counter()
        for req, _ in self._pending:
            req.wait()
        self._pending.clear()
        self.stats.idle_s += time.perf_counter() - start

    def barrier(self) -> None:
        self.world.Barrier()

    def gather(self, obj: Any) -> list[Any] | None:
        return self.world.gather(obj, root=0)

    def allgather(self, obj: Any) -> list[Any]:
        return self.world.allgather(obj)

    def abort(self, code: int) -> None:
        self.world.Abort(code)
