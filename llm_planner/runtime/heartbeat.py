"""A serving rank's heartbeat: a line on its standard output every INTERVAL_S seconds, which mpiexec
forwards to the launcher's `mpiexec.out` from every host, so the launcher sees within seconds a rank
that stopped (its process frozen, or its host cut off from the launcher: its lines stop coming) or a
replica that stopped moving (its scheduler has requests in flight and no iteration comes back: a
rank of the pipeline, or a link between two of its hosts, is stuck), instead of waiting out the
run's timeout (llm_planner.launch.stall_watch reads the lines).

    llm_planner.heartbeat rank=3 progress=1207 inflight=2

`progress` counts what the rank finished (the scheduler: iterations back from the last stage; the
other ranks: iterations their stage ran); `inflight` is what the scheduler is waiting for (0 on the
other ranks, which never know whether work is coming). A daemon thread writes the lines; the
serving loop only sets the two numbers.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import TextIO

PREFIX = "llm_planner.heartbeat"
INTERVAL_S = 1.0
LINE = re.compile(rf"^{re.escape(PREFIX)} rank=(\d+) progress=(\d+) inflight=(\d+)$", re.M)
ANY_LINE = re.compile(rf"^{re.escape(PREFIX)} .*\n?", re.M)  # a line cut short too


class Heartbeat:
    """The rank's line every interval_s seconds until `stop` (module docstring)."""

    def __init__(self, rank: int, interval_s: float = INTERVAL_S, out: TextIO | None = None):
        self.rank, self.interval_s, self.out = rank, interval_s, out or sys.stdout
        self.progress, self.inflight = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{rank}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def line(self) -> str:
        return f"{PREFIX} rank={self.rank} progress={self.progress} inflight={self.inflight}"

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                print(self.line(), file=self.out, flush=True)
            except (OSError, ValueError):  # the launcher's end is gone: nothing left to tell
                return


def parse_beats(text: str) -> list[tuple[int, int, int]]:
    """(rank, progress, inflight) of every whole heartbeat line in `text`, in order."""
    return [(int(r), int(p), int(i)) for r, p, i in LINE.findall(text)]


def without_beats(text: str) -> str:
    """`text` less its heartbeat lines (what an error message quotes of a rank's output)."""
    return ANY_LINE.sub("", text)
