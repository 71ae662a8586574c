"""What each replica has served so far, kept on disk as the run goes, so that a run that fails still says it.

The scheduler of replica i (its first stage's leader, llm_planner.runtime.serve_run) appends to
`served.replica<i>.jsonl` in the run's workdir (each member j of a data-parallel stage, a scheduler
of its own, to `served.replica<i>.member<j>.jsonl`; read back, a replica's files are merged), at most
every INTERVAL_S seconds and only when something is new, one line: `{"replica": i, "at_s": t,
"requests": [the requests finished since the last line], "iterations": [the iterations since]}` (t
on the replica's clock; requests and iterations as in its raw
record). Appending only what is new took 0.3 ms a line (4 requests of 128 tokens) on a shared 2-core
machine, where rewriting a record of 200 such requests atomically (core.atomic, with its fsync) took 33 to
104 ms; a line cut short by a killed rank is dropped when read. A run that fails thus loses at most the
last INTERVAL_S seconds of what it served. The launcher clears the files before a run, reads them into the
failure report's `served` when the run fails (llm_planner.launch.serve_failure), and removes them when it
succeeds (the ranks' gathered raw record has it all). A write that fails is logged once and not tried
again: the run goes on, only this record stops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llm_planner.runtime.serve_record import merge_records

log = logging.getLogger(__name__)

INTERVAL_S = 0.5
PATTERN = "served.replica*.jsonl"


def progress_path(workdir: str | Path, replica: int, member: int | None = None) -> Path:
    tail = "" if member is None else f".member{member}"
    return Path(workdir) / f"served.replica{replica}{tail}.jsonl"


class Progress:
    """One replica's record on disk (or one data-parallel member's: `member`), appended to at most every
    interval_s seconds (module docstring)."""

    def __init__(self, workdir: str | Path, replica: int, interval_s: float = INTERVAL_S, *, member: int | None = None):
        self.path, self.replica, self.interval_s = progress_path(workdir, replica, member), replica, interval_s
        self._requests, self._iterations, self._at, self._broken = 0, 0, 0.0, False
        self._write("w", "")  # a stale record of an earlier run in this workdir goes

    def update(self, now_s: float, finished: Sequence, iterations: Sequence, request: Callable[[Any], dict]) -> bool:
        """Append what is new in `finished` (each turned into its record by `request`) and `iterations`, if
        interval_s has passed since the last line; whether a line was written."""
        if self._broken or now_s - self._at < self.interval_s:
            return False
        if len(finished) == self._requests and len(iterations) == self._iterations:
            return False
        line = {
            "replica": self.replica,
            "at_s": now_s,
            "requests": [request(s) for s in finished[self._requests :]],
            "iterations": list(iterations[self._iterations :]),
        }
        if not self._write("a", json.dumps(line) + "\n"):
            return False
        self._requests, self._iterations, self._at = len(finished), len(iterations), now_s
        return True

    def _write(self, mode: str, text: str) -> bool:
        try:
            with open(self.path, mode) as f:
                f.write(text)
        except OSError as exc:
            self._broken = True
            log.warning("%s: the record of what replica %d served stops here: %s", self.path, self.replica, exc)
            return False
        return True


def read_progress(workdir: str | Path) -> list[dict[str, Any]]:
    """Each replica's record in the workdir, `{"replica", "duration_s", "requests", "iterations"}` as the raw
    record has it (duration_s: the time of its last line), by replica; a line cut short ends its file."""
    records = []
    for path in Path(workdir).glob(PATTERN):
        record: dict[str, Any] | None = None
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            log.warning("%s: cannot read what the replica served: %s", path, exc)
            continue
        for text in lines:
            try:
                line = json.loads(text)
                replica, at_s = int(line["replica"]), float(line["at_s"])
                requests, iterations = list(line["requests"]), list(line["iterations"])
            except (ValueError, KeyError, TypeError):
                break
            record = record or {"replica": replica, "requests": [], "iterations": []}
            record["requests"] += requests
            record["iterations"] += iterations
            record["duration_s"] = at_s
        if record is not None:
            records.append(record)
    return merge_records(records)


def clear_progress(workdir: str | Path) -> None:
    for path in Path(workdir).glob(PATTERN):
        path.unlink(missing_ok=True)
