"""Serving profile: the measured time of one decoder layer per device kind.

    # measured time of one decoder layer per device kind (llm_planner serving profile)
    format: serving-profile/1
    model: llama2-70b
    dtype: fp16
    source: <free text: where it came from>
    kinds:
      <device kind name as in the cluster spec>:
        decode_layer_s: [[batch, seconds], ...]    # one layer, one decode step of `batch` sequences
        prefill_layer_s: [[tokens, seconds], ...]  # one layer, a prompt chunk of `tokens` tokens (optional)

Sizes are integers >= 0, strictly increasing, at least two points per table; times are finite
and >= 0 (they need not increase: measured kernels have steps). Between two points the time is
interpolated linearly; past the last point (and before the first) the nearest segment is
extended, floored at 0. An engine iteration that mixes decode and prefill work on a layer costs
the sum (as in Helix's simulator, docs/helix.md):

    layer_time_s(kind, b, p) = decode(b) [b > 0] + prefill(p) [p > 0]

llm-planner import helix writes such files from Helix's profiles (llm_planner.helix.inputs).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_planner.core.fileio import read_document
from llm_planner.core.spec_fields import Reader, SpecError, as_str, as_text

FORMAT = "serving-profile/1"


class ServingProfileError(SpecError):
    """A serving profile that cannot be used; the message names the file, the field and the problem."""


@dataclass(frozen=True, kw_only=True)
class LayerTable:
    """Piecewise-linear time of one layer against a size (sequences or tokens)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def at(self, size: float) -> float:
        """Seconds at `size`: linear between points, the end segments extended, never below 0."""
        i = bisect.bisect_right(self.sizes, size) - 1
        i = min(max(i, 0), len(self.sizes) - 2)
        (x0, x1), (y0, y1) = self.sizes[i : i + 2], self.seconds[i : i + 2]
        return max(0.0, y0 + (y1 - y0) * (size - x0) / (x1 - x0))


@dataclass(frozen=True, kw_only=True)
class KindProfile:
    kind: str
    decode: LayerTable
    prefill: LayerTable | None


@dataclass(frozen=True, kw_only=True)
class ServingProfile:
    model: str
    dtype: str
    source: str
    kinds: tuple[KindProfile, ...]
    path: str = "<memory>"

    def kind(self, name: str) -> KindProfile:
        for entry in self.kinds:
            if entry.kind == name:
                return entry
        raise KeyError(name)

    def layer_time_s(self, kind: str, decode_batch: int, prefill_tokens: int = 0) -> float:
        """One decoder layer on `kind` for `decode_batch` decode sequences and a `prefill_tokens` prompt chunk."""
        if decode_batch < 0 or prefill_tokens < 0:
            raise ValueError(f"decode_batch and prefill_tokens must be >= 0, got {decode_batch}, {prefill_tokens}")
        try:
            entry = self.kind(kind)
        except KeyError:
            raise ValueError(
                f"{self.path}: kinds: no entry for device kind {kind!r} "
                f"(the profile has {', '.join(k.kind for k in self.kinds)})"
            ) from None
        total = entry.decode.at(decode_batch) if decode_batch else 0.0
        if prefill_tokens:
            if entry.prefill is None:
                raise ValueError(
                    f"{self.path}: kinds.{kind}: no prefill_layer_s, needed for {prefill_tokens} prompt tokens"
                )
            total += entry.prefill.at(prefill_tokens)
        return total


def _table(r: Reader, key: str, required: bool) -> LayerTable | None:
    raw = r.get(key, default=... if required else None)
    if raw is None:
        return None
    where = f"{r.path}.{key}"
    if not isinstance(raw, list) or len(raw) < 2:
        r.fail("expected a list of at least two [size, seconds] pairs", key)
    sizes: list[int] = []
    seconds: list[float] = []
    for i, pair in enumerate(raw):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ServingProfileError(f"{r.source}: {where}[{i}]: expected [size, seconds], got {pair!r}")
        size, t = pair
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ServingProfileError(f"{r.source}: {where}[{i}]: size must be an integer >= 0, got {size!r}")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ServingProfileError(f"{r.source}: {where}[{i}]: seconds must be a finite number >= 0, got {t!r}")
        if sizes and size <= sizes[-1]:
            raise ServingProfileError(f"{r.source}: {where}[{i}]: sizes must increase, got {size} after {sizes[-1]}")
        sizes.append(size)
        seconds.append(float(t))
    return LayerTable(sizes=tuple(sizes), seconds=tuple(seconds))


def parse_serving_profile(data: Any, source: str = "<memory>") -> ServingProfile:
    """Build a ServingProfile from a parsed document; ServingProfileError names `source`."""
    try:
        top = Reader(source, "", data)
        fmt = top.get("format", as_str)
        if fmt != FORMAT:
            top.fail(f"unknown format {fmt!r}; expected {FORMAT!r}", "format")
        kinds_raw = top.get("kinds")
        kinds_reader = top.child("kinds", kinds_raw)
        if not kinds_raw:
            top.fail("expected at least one device kind", "kinds")
        kinds = []
        for name in kinds_raw:
            kinds_reader.used.add(name)
            r = kinds_reader.child(str(name), kinds_raw[name])
            kinds.append(
                KindProfile(
                    kind=str(name),
                    decode=_table(r, "decode_layer_s", True),
                    prefill=_table(r, "prefill_layer_s", False),
                )
            )
            r.done()
        profile = ServingProfile(
            model=top.get("model", as_str),
            dtype=top.get("dtype", as_str),
            source=top.get("source", as_text, default=""),
            kinds=tuple(kinds),
            path=source,
        )
        top.done()
    except ServingProfileError:
        raise
    except SpecError as exc:  # the Reader's errors, under this file type's name
        raise ServingProfileError(str(exc)) from None
    return profile


def load_serving_profile(path: str | Path) -> ServingProfile:
    """Read a serving profile file (YAML or JSON). Raises ServingProfileError naming file and field."""
    return parse_serving_profile(read_document(path, ServingProfileError, finite=True), source=str(path))
