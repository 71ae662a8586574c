"""Which of this host's ranks died first, as the kernel tells it.

When one rank dies, mpiexec kills the others (SIGKILL) and then reports the first rank *in its own
order* that ended badly, which is often a rank it killed itself: its "PID p" cannot name the rank that
died. This watcher opens a pidfd (Linux 5.3+) for each rank of this host once its pid file exists
(`rank<N>.pid`, written by llm_planner.runtime.rank) and polls them: a pidfd turns readable the moment
its process ends, so the first wake names the rank that died before mpiexec's clean-up reached the
others. A wake that finds several ended at once names nobody (the caller falls back on mpiexec's word),
as does a host without pidfds or a rank that ended before its pidfd was opened.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterable
from pathlib import Path

POLL_MS = 50


class DeathOrder:
    """Watch `ranks` (this host's) of the run in `workdir` on a daemon thread until `close()`."""

    def __init__(self, workdir: Path, ranks: Iterable[int]) -> None:
        self._workdir = workdir
        self._waiting = set(ranks)
        self._fds: dict[int, int] = {}  # pidfd -> rank
        self._groups: list[set[int]] = []  # ranks seen ended, wake by wake
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if self._waiting and hasattr(os, "pidfd_open"):
            self._thread.start()

    def first(self) -> int | None:
        """The rank that ended alone before any other; None when unknown (module docstring)."""
        return next(iter(self._groups[0])) if self._groups and len(self._groups[0]) == 1 else None

    def watching_all(self) -> bool:
        """Whether every rank's pid file has been read."""
        return not self._waiting

    def wakes(self) -> int:
        """How many times ranks were seen ending so far."""
        return len(self._groups)

    def close(self) -> None:
        """Stop watching (waits for the thread) and close the pidfds."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    def _run(self) -> None:
        poller = select.poll()
        while not self._stop.is_set() and (self._waiting or self._fds):
            self._open_new(poller)
            ended = {self._fds[fd] for fd, _ in poller.poll(POLL_MS)}
            if ended:
                self._groups.append(ended)
                for fd in [fd for fd, rank in self._fds.items() if rank in ended]:
                    poller.unregister(fd)
                    os.close(fd)
                    del self._fds[fd]
            elif self._waiting and not self._fds:
                time.sleep(POLL_MS / 1000)

    def _open_new(self, poller: select.poll) -> None:
        """A pidfd for each rank whose pid file has appeared; a rank already gone spoils the order."""
        for rank in sorted(self._waiting):
            pid = _pid_of(self._workdir / f"rank{rank}.pid")
            if pid is None:
                continue
            self._waiting.discard(rank)
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # ended already (or no pidfds here): when, nobody can say
                self._groups.append({rank, -1})
                continue
            self._fds[fd] = rank
            poller.register(fd, select.POLLIN)


def _pid_of(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
