"""Where a command's time went: wall-clock parts measured with time.perf_counter where the work
happens, kept as plain data (records, not figures anyone checks) and printed by the CLI."""

from __future__ import annotations

import contextlib
import time

from llm_planner.core.fmt import significant, time_unit


class Stopwatch:
    """Named parts of one command's time, in the order they ran; a part run twice adds up."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.parts: dict[str, float] = {}

    @contextlib.contextmanager
    def part(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - start

    def total(self) -> float:
        """Seconds since the stopwatch was made (the parts, and whatever ran between them)."""
        return time.perf_counter() - self.started


def timing_text(total_s: float, parts: dict[str, float]) -> str:
    """The total and its parts as one phrase, e.g. `took 64.2 s: reading inputs 0.3 s, layout
    search 0.6 s, bounds 61.9 s` (underscores in the parts' names are printed as spaces)."""
    shown = ", ".join(f"{name.replace('_', ' ')} {fmt_elapsed(s)}" for name, s in parts.items())
    return f"took {fmt_elapsed(total_s)}" + (f": {shown}" if shown else "")


def fmt_elapsed(seconds: float) -> str:
    """Seconds to three significant digits in a readable unit (a record, not a figure)."""
    unit, scale = time_unit(seconds)
    return f"{significant(seconds / scale, 3)} {unit}"
