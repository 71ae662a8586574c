"""One serving measurement as the readers of llm_planner.measure.serving_results and
llm_planner.measure.genai_perf state it, and the checked numbers they read."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from llm_planner.measure.fits import CalibrateError
from llm_planner.serving.workload import RequestShape

# What a measurement may state: a request's prompt or output tokens, the sequences in flight, an
# engine's token budget or micro-batches, as the command line's flags allow them (MOST_TOKENS,
# MOST_SEQUENCES, MOST_BUDGET: llm_planner.serving.workload); and the span of a measured time and of
# a replica's output tokens/s. Past them a file is not a run of an engine.
SECONDS = (1e-6, 3600.0)  # a TPOT, TTFT or decode step from 1 us to an hour
MOST_TOKENS_PER_S = 1e9


class ServingResultError(CalibrateError):
    """A serving measurement that cannot be read; the message names the file and the key."""


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What a run measured, in seconds and output tokens per second (None: not measured)."""

    tpot_s: float
    tokens_per_s: float | None
    ttft_s: float | None
    decode_step_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class ServingObservation:
    """One replica at one operating point, as a file states it (None: the file does not say)."""

    source: str  # "run.json", "run.jsonl line 3", "run.json replicas[1]"
    engine: str  # "vllm", "sglang", "genai-perf" or "llm_planner"
    measured: Measured
    requests: tuple[RequestShape, ...]
    concurrency: int | None
    concurrency_note: str  # where the concurrency came from, or why the file gives none
    concurrency_inferred: bool = False  # read from an open loop's rate by Little's law, not stated
    micro_batches: int | None = None
    layout: str | None = None
    max_batched_tokens: int | None = None
    model: str | None = None
    dtype: str | None = None  # the element type the run served in, where the file says (our run reports)


def number(
    where: str, doc: dict, key: str, *, positive: bool = True, required: bool = True, span: tuple | None = None
) -> float | None:
    """doc[key] as a finite number (above 0 unless `positive` is False; within `span`, (least, most),
    where given); None when absent and not required."""
    if key not in doc or doc[key] is None:
        if required:
            raise ServingResultError(f"{where}: missing key {key!r}")
        return None
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ServingResultError(f"{where}: {key}: expected a finite number, got {json.dumps(value)[:40]}")
    if positive and value <= 0:
        raise ServingResultError(f"{where}: {key}: must be above 0, got {value}")
    if span is not None:
        in_span(where, key, float(value), *span)
    return float(value)


def in_span(where: str, key: str, value: float, least: float, most: float) -> float:
    """value when least <= value <= most; else ServingResultError naming `where` and `key`."""
    if not least <= value <= most:
        raise ServingResultError(f"{where}: {key}: expected {_plain(least)} to {_plain(most)}, got {_plain(value)}")
    return value


def _plain(x: float) -> str:
    """A whole number with its thousands marked, else the shortest float."""
    return f"{int(x):,}" if x == int(x) and abs(x) < 1e15 else f"{x:g}"


def seconds(where: str, doc: dict, key: str, scale: float = 1.0, *, required: bool = True) -> float | None:
    """doc[key] times `scale` (its unit in seconds) as a measured time, within SECONDS."""
    value = number(where, doc, key, required=required)
    return None if value is None else in_seconds(where, key, value * scale, f"{value:g} ({value * scale:g} s)")


def in_seconds(where: str, key: str, value_s: float, shown: str) -> float:
    """value_s when a measured time may be it (SECONDS); else ServingResultError naming `where` and
    `key` and showing the value as the file wrote it (`shown`)."""
    if not SECONDS[0] <= value_s <= SECONDS[1]:
        raise ServingResultError(f"{where}: {key}: expected a time from 1 us to an hour, got {shown}")
    return value_s


def whole_number(where: str, doc: dict, key: str, *, required: bool = True, most: int | None = None) -> int | None:
    """doc[key] as a positive whole number (at most `most` where given); None when absent and not required."""
    value = number(where, doc, key, required=required, span=None if most is None else (1, most))
    if value is not None and value != int(value):
        raise ServingResultError(f"{where}: {key}: expected a whole number, got {doc[key]}")
    return None if value is None else int(value)
