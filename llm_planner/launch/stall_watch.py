"""The launcher's side of the serving ranks' heartbeats (llm_planner.runtime.heartbeat): while mpiexec
runs, the new lines of `mpiexec.out` are read every POLL_S seconds and a run is stopped as soon as

- a rank that has sent heartbeats sends none for `stall_s` seconds: its process is stopped, or its
  host no longer reaches the launcher (a cut link stops its lines with everything else); or
- a rank with requests in flight (a replica's scheduler) has finished nothing for `stall_s`
  seconds: a rank of its pipeline, or a link between two of its hosts, is stuck (no error crosses
  a dead link: every rank just waits).

A rank is judged only after its first heartbeat (it may still be loading its weights), and the
clock is the launcher's own, so hosts' clocks never matter. Runs without heartbeats (placement
plans) are never judged: their run's timeout is what stops them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from llm_planner.runtime.heartbeat import parse_beats
from llm_planner.runtime.table import RankTable

POLL_S = 0.5


@dataclass
class StallWatch:
    """Heartbeats read so far and what they say (module docstring)."""

    table: RankTable
    stall_s: float
    seen: dict[int, float] = field(default_factory=dict)  # rank -> when its last line came
    moved: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (progress, when it last changed)
    inflight: dict[int, int] = field(default_factory=dict)
    _offset: int = 0
    _partial: str = ""

    def feed(self, text: str, now: float) -> None:
        """Take the heartbeat lines of `text` (the next bytes of mpiexec's output), as of `now`."""
        whole, _, self._partial = (self._partial + text).rpartition("\n")  # a line cut short waits
        for rank, progress, inflight in parse_beats(whole):
            self.seen[rank] = now
            self.inflight[rank] = inflight
            last = self.moved.get(rank)
            if last is None or last[0] != progress:
                self.moved[rank] = (progress, now)

    def read(self, path: Path, now: float) -> None:
        """Feed what was appended to `path` since the last read."""
        try:
            with open(path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        self._offset += len(data)
        self.feed(data.decode(errors="replace"), now)

    def stalled(self, now: float) -> tuple[str, int] | None:
        """(message, rank) of the first rank the heartbeats show stopped or stuck; None while all move."""
        for rank, at in sorted(self.seen.items()):
            if now - at > self.stall_s:
                return self._says(
                    rank,
                    f"has sent no heartbeat for {now - at:.0f} s",
                    "its process is stopped or its host no longer reaches the launcher",
                ), rank
        for rank, (_, at) in sorted(self.moved.items()):
            if self.inflight.get(rank, 0) > 0 and now - at > self.stall_s:
                what = f"has had {self.inflight[rank]} iteration(s) in flight and none back for {now - at:.0f} s"
                return self._says(rank, what, "a rank of its pipeline, or a link between its hosts, is stuck"), rank
        return None

    def _says(self, rank: int, what: str, why: str) -> str:
        entry = self.table.ranks[rank] if 0 <= rank < len(self.table.ranks) else None
        who = f"rank {rank} ({entry.device} on {entry.hostname})" if entry is not None else f"rank {rank}"
        return f"{who} {what} (--stall-timeout {self.stall_s:g} s): {why}; mpiexec and every rank were stopped"


def watch(proc, table: RankTable, out_path: Path, timeout_s: float, stall_s: float | None) -> tuple[bool, tuple | None]:
    """Wait for `proc` until it ends, `timeout_s` passes (True) or the heartbeats show a stall (its
    (message, rank)); (timed out, stall)."""
    deadline = time.monotonic() + timeout_s
    watcher = StallWatch(table, stall_s) if stall_s else None
    while proc.poll() is None:
        now = time.monotonic()
        if now >= deadline:
            return True, None
        if watcher is not None:
            watcher.read(out_path, now)
            stall = watcher.stalled(now)
            if stall is not None:
                return False, stall
        time.sleep(min(POLL_S, max(deadline - now, 0.0)))
    return False, None
