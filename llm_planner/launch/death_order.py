"""Which rank of a run on this host alone died first, as the kernel tells it.

When one rank dies, mpiexec kills the others (SIGKILL) and then reports the first rank *in its own
order* that ended badly, which is often a rank it killed itself: its "PID p" cannot name the rank that
died. This watcher opens a pidfd (Linux 5.3+) for each rank once its pid file exists (`rank<N>.pid`,
written by llm_planner.runtime.rank) and polls them: a pidfd turns readable the moment its process
ends, so the first wake names the rank that died before mpiexec's clean-up reached the others. A rank
that ended its run cleanly writes `rank<N>.done` first and is no death (a crash in a later teardown is
mpiexec's to name). The order is unknown, and `first()` names nobody (the caller keeps mpiexec's
word), when the first wake finds several ranks ended at once, when it comes before every rank's pid
file was read, when a rank ended before its pidfd was opened, or on a host without pidfds.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from llm_planner.runtime.rank import done_path, pid_path

POLL_MS = 50
CLOSE_WAIT_S = 2.0  # close() waits this long for the thread (a workdir on a hung file system may block it)


class DeathOrder:
    """Watch `ranks` of the run in `workdir` on a daemon thread until `close()`."""

    def __init__(self, workdir: Path, ranks: Iterable[int]) -> None:
        self._workdir = workdir
        self._waiting = set(ranks)
        self._fds: dict[int, int] = {}  # pidfd -> rank
        self._first: int | None = None
        self._seen = False  # whether a death (or an unknown order) has been seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if self._waiting and hasattr(os, "pidfd_open"):
            self._thread.start()

    def first(self) -> int | None:
        """The rank that died alone before any other; None when unknown (module docstring)."""
        return self._first

    def watching_all(self) -> bool:
        """Whether every rank's pid file has been read."""
        return not self._waiting

    def seen(self) -> bool:
        """Whether a rank's death (or an end that leaves the order unknown) has been seen."""
        return self._seen

    def close(self) -> None:
        """Stop watching: wait for the thread (at most CLOSE_WAIT_S; it closes its own pidfds)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(CLOSE_WAIT_S)

    def _run(self) -> None:
        poller = select.poll()
        try:
            while not self._stop.is_set() and (self._waiting or self._fds):
                self._open_new(poller)
                ended = {self._fds[fd] for fd, _ in poller.poll(POLL_MS)}
                if ended:
                    self._note(ended - self._clean(ended), complete=not self._waiting)
                    self._forget(poller, ended)
                elif self._waiting and not self._fds:
                    time.sleep(POLL_MS / 1000)
        finally:
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()

    def _note(self, died: set[int], complete: bool) -> None:
        """The first wake with a death decides: one rank, every rank watched, or the order is unknown."""
        if died and not self._seen:
            self._seen = True
            self._first = next(iter(died)) if len(died) == 1 and complete else None

    def _clean(self, ranks: set[int]) -> set[int]:
        return {r for r in ranks if done_path(self._workdir, r).exists()}

    def _forget(self, poller: select.poll, ranks: set[int]) -> None:
        for fd in [fd for fd, rank in self._fds.items() if rank in ranks]:
            poller.unregister(fd)
            os.close(fd)
            del self._fds[fd]

    def _open_new(self, poller: select.poll) -> None:
        """A pidfd for each rank whose pid file has appeared; a rank already gone leaves the order unknown."""
        for rank in sorted(self._waiting):
            pid = _pid_of(pid_path(self._workdir, rank))
            if pid is None:
                continue
            self._waiting.discard(rank)
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # ended already (or no pidfds here): when, nobody can say
                if not done_path(self._workdir, rank).exists():
                    self._note({rank, -1}, complete=False)
                continue
            self._fds[fd] = rank
            poller.register(fd, select.POLLIN)


def _pid_of(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
