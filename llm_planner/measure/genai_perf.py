"""genai-perf's and AIPerf's profile exports as serving measurements (`calibrate --serving`).

NVIDIA's genai-perf (`genai-perf profile`: profile_export_genai_perf.json) and AIPerf, its
successor (profile_export_aiperf.json), write one JSON object of metrics, each an object with its
`unit` and statistics. Read: `inter_token_latency` (a request's (end - first token) / (tokens -
1), its TPOT; a run without `--streaming` has none and is refused, saying so),
`time_to_first_token`, `output_token_throughput` (avg), `input_sequence_length` /
`output_sequence_length` (avg; older genai-perf: `num_input_token` / `num_output_token`), each
time in its stated unit (ns, us, ms, s), p50 where given, else avg. The sequences in flight: at a
request rate (`input_config.request_rate`, newer genai-perf's `perf_analyzer.stimulus.request_rate`,
AIPerf's `loadgen.request_rate`), the mean in flight by Little's law, `request_throughput` times
the mean `request_latency`, at most the concurrency the run also caps it at; else the concurrency
(`input_config.concurrency`, `perf_analyzer.stimulus.concurrency`, `loadgen.concurrency`). The
model: `input_config.model` (genai-perf), or AIPerf's `endpoint.model_names`.
"""

from __future__ import annotations

import json
from typing import Any

from llm_planner.measure.serving_observation import (
    MOST_TOKENS_PER_S,
    Measured,
    ServingObservation,
    ServingResultError,
    in_seconds,
    in_span,
    number,
    whole_number,
)
from llm_planner.serving.workload import MOST_SEQUENCES, MOST_TOKENS, RequestShape

TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}
GENAI_CONCURRENCY = (("concurrency",), ("perf_analyzer", "stimulus", "concurrency"), ("loadgen", "concurrency"))
GENAI_RATE = (("request_rate",), ("perf_analyzer", "stimulus", "request_rate"), ("loadgen", "request_rate"))
GENAI_MODEL = (("model",), ("endpoint", "model_names"))
TPOT_METRIC = "inter_token_latency"


def is_genai_perf(doc: dict) -> bool:
    """Whether a JSON object is a genai-perf or AIPerf profile export (metrics as objects with a unit)."""
    return any(isinstance(doc.get(k), dict) and "unit" in doc[k] for k in (TPOT_METRIC, "request_latency"))


def read_genai_perf(where: str, doc: dict) -> ServingObservation:
    """A genai-perf or AIPerf profile export (module docstring)."""
    if not isinstance(doc.get(TPOT_METRIC), dict):
        raise ServingResultError(
            f"{where}: no metric {TPOT_METRIC!r}: the run did not stream its tokens; rerun genai-perf or "
            "AIPerf with --streaming, which measures the time per output token"
        )
    config = doc.get("input_config") if isinstance(doc.get("input_config"), dict) else {}
    concurrency, note = _genai_concurrency(where, doc, config)
    model, _ = _nested(config, GENAI_MODEL)
    model = model[0] if isinstance(model, list) and model else model
    return ServingObservation(
        source=where,
        engine="genai-perf",
        measured=Measured(
            tpot_s=_genai_time(where, doc, TPOT_METRIC),
            tokens_per_s=in_span(
                where,
                "output_token_throughput",
                _genai_stat(where, doc, ("output_token_throughput",), ("avg",)),
                0,
                MOST_TOKENS_PER_S,
            ),
            ttft_s=_genai_time(where, doc, "time_to_first_token", required=False),
        ),
        requests=(
            RequestShape(
                prompt_len=_mean_tokens(where, doc, ("input_sequence_length", "num_input_token")),
                output_len=_mean_tokens(where, doc, ("output_sequence_length", "num_output_token")),
            ),
        ),
        concurrency=concurrency,
        concurrency_note=note,
        model=model if isinstance(model, str) else None,
    )


def _mean_tokens(where: str, doc: dict, names: tuple[str, ...]) -> int:
    value = _genai_stat(where, doc, names, ("avg",))
    name = next(n for n in names if isinstance(doc.get(n), dict))
    return max(1, round(in_span(where, name, value, 0, MOST_TOKENS)))


def _genai_metric(where: str, doc: dict, names: tuple[str, ...], required: bool = True) -> tuple[str, dict] | None:
    for name in names:
        if isinstance(doc.get(name), dict):
            return name, doc[name]
    if required:
        either = " or ".join(repr(n) for n in names)
        raise ServingResultError(f"{where}: missing metric {either} (an object with its unit and statistics)")
    return None


def _genai_stat(where: str, doc: dict, names: tuple[str, ...], stats: tuple[str, ...], required: bool = True):
    """The first of `stats` the first present metric of `names` has, as a positive number."""
    found = _genai_metric(where, doc, names, required)
    if found is None:
        return None
    name, metric = found
    for stat in stats:
        if metric.get(stat) is not None:
            return number(f"{where}: {name}", metric, stat)
    raise ServingResultError(f"{where}: {name}: missing {' or '.join(repr(s) for s in stats)}")


def _genai_time(
    where: str, doc: dict, name: str, required: bool = True, stats: tuple[str, ...] = ("p50", "avg")
) -> float | None:
    """A latency metric in seconds: p50 where given, else avg (or the first of `stats`), times its unit."""
    value = _genai_stat(where, doc, (name,), stats, required)
    if value is None:
        return None
    unit = doc[name].get("unit")
    if unit not in TIME_UNITS:
        known = ", ".join(TIME_UNITS)
        raise ServingResultError(f"{where}: {name}: unit: expected one of {known}, got {json.dumps(unit)[:40]}")
    return in_seconds(where, name, value * TIME_UNITS[unit], f"{value:g} {unit}")


def _nested(config: dict, paths: tuple[tuple[str, ...], ...]):
    for path in paths:
        node: Any = config
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return node, ".".join(path)
    return None, None


def _genai_concurrency(where: str, doc: dict, config: dict) -> tuple[int | None, str]:
    """The sequences in flight (module docstring): Little's law at a request rate, at most the
    concurrency the run also sets; else the concurrency."""
    value, key = _nested(config, GENAI_CONCURRENCY)
    cap = whole_number(f"{where}: input_config", {key: value}, key, most=MOST_SEQUENCES) if value is not None else None
    rate, rate_key = _nested(config, GENAI_RATE)
    if rate is None:
        if cap is None:
            return None, "input_config states neither a concurrency nor a request rate"
        return cap, f"input_config.{key} {cap}"
    number(f"{where}: input_config", {rate_key: rate}, rate_key)
    throughput = _genai_stat(where, doc, ("request_throughput",), ("avg",))
    mean = throughput * _genai_time(where, doc, "request_latency", stats=("avg",))
    if cap is not None:
        mean = min(mean, float(cap))
    in_span(f"{where}: the mean in flight", "request_throughput x request_latency", mean, 0, MOST_SEQUENCES)
    note = f"input_config.{rate_key} {rate}/s: {mean:.1f} in flight on average (requests/s x mean request latency"
    return max(1, round(mean)), note + (f", at most input_config.{key} {cap})" if cap is not None else ")")
