"""Measured tables of a serving profile (llm_planner.cost.serving_profile): a time against one size,
and a decode-attention time against batch and context.

A `LayerTable` is piecewise linear: linear between its points, its end segments extended before
the first point and past the last, floored at 0. Its `breakpoints` are its sizes and where an
extended end segment reaches 0: between two consecutive ones the time is linear.

An `AttnGrid` holds rows [batch, context, seconds] on a full grid (every context at the same
batches). At context c it is the LayerTable in batch whose value at each grid batch is the grid's
column there interpolated linearly in context between the two nearest grid contexts (the end pair
extended outside them), floored at 0: bilinear inside the grid, and for a fixed context a
piecewise-linear function of the batch with breakpoints at the grid's batches.
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass
from functools import lru_cache

from llm_planner.core.spec_fields import Reader, SpecError

log = logging.getLogger(__name__)


class ServingProfileError(SpecError):
    """A serving profile that cannot be used; the message names the file, the field and the problem."""


def _segment(xs: tuple, x: float) -> int:
    """Index i of the segment xs[i]..xs[i+1] that holds x, the end segments extended."""
    return min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)


@dataclass(frozen=True, kw_only=True)
class LayerTable:
    """Piecewise-linear time of one layer (or one kernel) against a size (sequences, tokens, bytes)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def at(self, size: float) -> float:
        """Seconds at `size`: linear between points, the end segments extended, never below 0."""
        i = _segment(self.sizes, size)
        (x0, x1), (y0, y1) = self.sizes[i : i + 2], self.seconds[i : i + 2]
        return max(0.0, y0 + (y1 - y0) * (size - x0) / (x1 - x0))

    def breakpoints(self) -> tuple[float, ...]:
        """Sizes where the slope may change: the points, and where an extended end reaches 0."""
        xs, ys, out = self.sizes, self.seconds, set(self.sizes)
        for i in (0, len(xs) - 2):
            if ys[i + 1] != ys[i]:
                out.add(xs[i] - ys[i] * (xs[i + 1] - xs[i]) / (ys[i + 1] - ys[i]))
        return tuple(sorted(out))


@dataclass(frozen=True, kw_only=True)
class AttnGrid:
    """Decode attention time of one layer by batch (sequences) and context (keys per sequence)."""

    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]  # seconds[j][i]: contexts[j], batches[i]

    def at_context(self, context: float) -> LayerTable:
        """The table in batch at `context` (module docstring)."""
        return _grid_at(self, float(context))

    def at(self, batch: float, context: float) -> float:
        return self.at_context(context).at(batch)


@lru_cache(maxsize=256)
def _grid_at(grid: AttnGrid, context: float) -> LayerTable:
    j = _segment(grid.contexts, context)
    (c0, c1), (row0, row1) = grid.contexts[j : j + 2], grid.seconds[j : j + 2]
    w = (context - c0) / (c1 - c0)
    return LayerTable(sizes=grid.batches, seconds=tuple(max(0.0, a + (b - a) * w) for a, b in zip(row0, row1)))


def read_table(r: Reader, key: str, required: bool) -> LayerTable | None:
    """The [[size, seconds], ...] table under `key`: at least two points, integer sizes >= 0 that
    increase, finite seconds >= 0."""
    raw = r.get(key, default=... if required else None)
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) < 2:
        r.fail("expected a list of at least two [size, seconds] pairs", key)
    sizes: list[int] = []
    seconds: list[float] = []
    for i, pair in enumerate(raw):
        where = f"{r.source}: {r.path}.{key}[{i}]"
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ServingProfileError(f"{where}: expected [size, seconds], got {pair!r}")
        size, t = pair
        _check_size(where, "size", size)
        t = _seconds(where, t)
        if sizes and size <= sizes[-1]:
            raise ServingProfileError(f"{where}: sizes must increase, got {size} after {sizes[-1]}")
        sizes.append(size)
        seconds.append(t)
    return LayerTable(sizes=tuple(sizes), seconds=_rising_said(seconds, f"{r.source}: {r.path}.{key}"))


def read_grid(r: Reader, key: str) -> AttnGrid | None:
    """The optional [[batch, context, seconds], ...] rows under `key`: a full grid of at least two
    batches and two contexts, each (batch, context) once."""
    raw = r.get(key, default=None)
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) < 4:
        r.fail("expected a list of at least four [batch, context, seconds] rows (two batches x two contexts)", key)
    cells: dict[tuple[int, int], float] = {}
    for i, row in enumerate(raw):
        where = f"{r.source}: {r.path}.{key}[{i}]"
        if not (isinstance(row, list) and len(row) == 3):
            raise ServingProfileError(f"{where}: expected [batch, context, seconds], got {row!r}")
        batch, context, t = row
        _check_size(where, "batch", batch)
        _check_size(where, "context", context)
        t = _seconds(where, t)
        if (batch, context) in cells:
            raise ServingProfileError(f"{where}: batch {batch} at context {context} given twice")
        cells[(batch, context)] = t
    batches, contexts = sorted({b for b, _ in cells}), sorted({c for _, c in cells})
    if len(batches) < 2 or len(contexts) < 2:
        r.fail("expected at least two batches and two contexts", key)
    missing = [(b, c) for c in contexts for b in batches if (b, c) not in cells]
    if missing:
        r.fail(f"not a full grid: no row for batch {missing[0][0]} at context {missing[0][1]}", key)
    seconds = tuple(tuple(cells[(b, c)] for b in batches) for c in contexts)
    return AttnGrid(batches=tuple(batches), contexts=tuple(contexts), seconds=seconds)


def _rising_said(seconds: list[float], where: str) -> tuple[float, ...]:
    """The times with each below the one before it raised to it, and a warning naming the table where
    any was: a measured time does not fall with more work, and a falling end segment, extended past
    the table, would make a layer free."""
    rows, raised = rising(list(enumerate(seconds)))
    if raised:
        log.warning(
            "%s: %d of %d times fall below the one before them (timing noise); raised to it", where, raised, len(rows)
        )
    return tuple(t for _, t in rows)


def rising(rows: list[tuple[int, float]]) -> tuple[list[tuple[int, float]], int]:
    """The [size, seconds] rows with each time below the one before it raised to it, and how many
    were: a measured time does not fall with more work."""
    out, raised = [], 0
    for size, t in rows:
        if out and t < out[-1][1]:
            t, raised = out[-1][1], raised + 1
        out.append((size, t))
    return out, raised


def _check_size(where: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ServingProfileError(f"{where}: {name} must be an integer >= 0, got {value!r}")


def _seconds(where: str, value) -> float:
    """The cell's seconds, finite and >= 0. A number with an exponent and no point (3e-04) is a string
    to YAML 1.1, which the reader parses; it is read as the number it spells."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ServingProfileError(f"{where}: seconds must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ServingProfileError(f"{where}: seconds must be a finite number >= 0, got {value!r}")
    return float(value)
