"""One serving measurement as the readers of llm_planner.measure.serving_results and
llm_planner.measure.genai_perf state it, and the checked numbers they read."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from llm_planner.measure.fits import CalibrateError
from llm_planner.serving.workload import RequestShape


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
    micro_batches: int | None = None
    layout: str | None = None
    max_batched_tokens: int | None = None
    model: str | None = None


def number(where: str, doc: dict, key: str, *, positive: bool = True, required: bool = True) -> float | None:
    """doc[key] as a finite number (above 0 unless `positive` is False); None when absent and not required."""
    if key not in doc or doc[key] is None:
        if required:
            raise ServingResultError(f"{where}: missing key {key!r}")
        return None
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ServingResultError(f"{where}: {key}: expected a finite number, got {json.dumps(value)[:40]}")
    if positive and value <= 0:
        raise ServingResultError(f"{where}: {key}: must be above 0, got {value}")
    return float(value)


def whole_number(where: str, doc: dict, key: str, *, required: bool = True) -> int | None:
    """doc[key] as a positive whole number; None when absent and not required."""
    value = number(where, doc, key, required=required)
    if value is not None and value != int(value):
        raise ServingResultError(f"{where}: {key}: expected a whole number, got {doc[key]}")
    return None if value is None else int(value)
