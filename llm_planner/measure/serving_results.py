"""Serving measurements read for calibration: engine benchmark results and our own run reports.

Each measurement becomes a `ServingObservation`: one replica at one concurrency, its measured TPOT,
output tokens/s and TTFT (and the pure decode step where the run measured it), the requests'
lengths, and whatever the file says of the replica (layout, concurrency, micro-batches, token
budget, model). What a file leaves out the user gives on the command line
(llm_planner.measure.serving_fit.resolve).

Four formats, told apart by their keys:

- `vllm bench serve --save-result` (vllm/benchmarks/serve.py: one JSON object; `--append-result`
  appends one per line). Keys read: `max_concurrency` (null when not set; then, for requests sent
  at a finite `request_rate`, the mean in flight by Little's law: `open_loop_concurrency`), `completed`,
  `total_input_tokens`, `total_output_tokens`, `output_throughput`, `median_tpot_ms` (else
  `mean_tpot_ms`; else, as older SGLang releases write neither, the mean time per output token
  after the first from the mean end-to-end latency: (mean end-to-end - TTFT) / (mean output - 1),
  never the inter-token latency, whose median leaves out the iterations a prefill stalls),
  `median_ttft_ms` (else `mean_ttft_ms`), `model_id`, and with `--save-detailed` the per-request
  `input_lens` and `output_lens`.
- `python -m sglang.bench_serving --output-file` (python/sglang/bench_serving.py: one JSON object
  per line, appended): the same keys (SGLang's script is adapted from vLLM's); with
  `--output-details` the lens. Older releases write no `request_throughput`: `completed` /
  `duration` stands for it. The engine that served the run is SGLang where `backend` names it
  (sglang, sglang-oai, ...); where it names another server (vllm, trt, lmdeploy: SGLang's client
  benchmarks those too), read as vLLM; where it names none (absent, or an OpenAI-compatible
  `openai`), SGLang where the keys are its client's (`random_input_len`,
  `total_output_tokens_retokenized`), else vLLM. It sets how the fit schedules prompts by default
  (llm_planner.measure.serving_cases.mixed_iterations).
- `genai-perf profile` (NVIDIA's client) and AIPerf, its successor: their profile export, told by
  its metrics being objects with a `unit` (llm_planner.measure.genai_perf).
- `llm-planner launch SERVING_PLAN --report run.json` (format `llm_planner.serving_run`,
  version 1): one observation per replica, its layout, concurrency, micro-batches and token budget
  from the report, its measured `tpot_p50_s` (else `tpot_s`), `tokens_per_s`, `ttft_steady_s` (the
  TTFT once the opening burst has drained; else `ttft_p50_s`, else `ttft_s`) and `decode_step_s`;
  a replica the run routed fewer requests than its concurrency at `predicted.concurrency` (what it
  had in flight), one routed none left out.

Medians are preferred to means: the model describes the steady state, and a run's first and last
requests (ramp-up and tail) pull the mean. The requests' lengths are the per-request lens where
the file has them, grouped into at most MAX_SHAPES shapes of equal count (sorted by prompt, then
output length; each shape the means of its group), else the totals over `completed`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from llm_planner.core.fileio import is_version, parse_document, read_text
from llm_planner.measure.genai_perf import is_genai_perf, read_genai_perf
from llm_planner.measure.serving_observation import (
    MOST_TOKENS_PER_S,
    Measured,
    ServingObservation,
    ServingResultError,
    in_seconds,
    in_span,
    number,
    seconds,
    whole_number,
)
from llm_planner.serving.workload import MOST_BUDGET, MOST_SEQUENCES, MOST_TOKENS, RequestShape

__all__ = ["Measured", "ServingObservation", "ServingResultError", "read_serving_results"]

SERVING_RUN_FORMAT = "llm_planner.serving_run"
SERVING_RUN_VERSION = 1
MAX_SHAPES = 16  # request shapes a measurement's lens are grouped into
ENGINE_TPOT = ("median_tpot_ms", "mean_tpot_ms")
ENGINE_TTFT = ("median_ttft_ms", "mean_ttft_ms")
ENGINE_E2E = ("mean_e2el_ms", "mean_e2e_latency_ms")
OTHER_SERVERS = ("vllm", "trt", "tensorrt", "lmdeploy", "tgi")  # a client's `backend` naming a server not SGLang
ENGINE_REQUIRED = ("completed", "total_input_tokens", "total_output_tokens", "output_throughput")


def read_serving_results(path: str | Path) -> list[ServingObservation]:
    """Every observation of the file (module docstring); ServingResultError naming the file and key."""
    out = []
    for where, doc in _documents(path):
        if not isinstance(doc, dict):
            raise ServingResultError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        if "format" in doc:
            out += _read_report(where, doc)
        elif is_genai_perf(doc):
            out.append(read_genai_perf(where, doc))
        else:
            out.append(_read_engine(where, doc))
    return out


def _documents(path: str | Path) -> list[tuple[str, Any]]:
    """The file's JSON documents: one, or one per line (JSON Lines, as the engines append them)."""
    text = read_text(path, ServingResultError)
    lines = [(n, line) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]
    if not lines:
        raise ServingResultError(f"{path}: empty file; expected a benchmark result (JSON) or a run report")
    first = lines[0][1].strip()
    if len(lines) > 1 and first.startswith("{") and first.endswith("}"):  # JSON Lines: each line one object
        return [
            (f"{path} line {n}", parse_document(line, f"{path}: line {n}", ServingResultError, as_json=True))
            for n, line in lines
        ]
    return [(str(path), parse_document(text, str(path), ServingResultError, as_json=True))]


def _first(where: str, doc: dict, keys: tuple[str, ...], scale: float) -> float:
    """The first of `keys` the document has (times `scale`); missing: an error naming the first."""
    for key in keys:
        if doc.get(key) is not None:
            return seconds(where, doc, key, scale)
    alternatives = " or ".join(repr(k) for k in keys[1:])
    raise ServingResultError(f"{where}: missing key {keys[0]!r}" + (f" (or {alternatives})" if alternatives else ""))


def _engine_of(doc: dict) -> str:
    """The engine that served the run: SGLang where the result's `backend` names it (sglang,
    sglang-oai, ...), another engine where it names one (SGLang's client benchmarks vLLM and others
    too); where it names none (no `backend`, or an OpenAI-compatible one), SGLang where the keys are
    its client's, else vLLM."""
    backend = doc.get("backend").strip().lower() if isinstance(doc.get("backend"), str) else ""
    if backend.startswith("sglang"):
        return "sglang"
    if backend.startswith(OTHER_SERVERS):
        return "vllm"
    return "sglang" if "random_input_len" in doc or "total_output_tokens_retokenized" in doc else "vllm"


def _read_engine(where: str, doc: dict) -> ServingObservation:
    """A vLLM or SGLang benchmark result (module docstring)."""
    engine = _engine_of(doc)
    for key in ENGINE_REQUIRED:
        number(where, doc, key)
    if "max_concurrency" not in doc:
        raise ServingResultError(f"{where}: missing key 'max_concurrency' ({engine} writes it, null when not set)")
    completed = whole_number(where, doc, "completed")
    limit = whole_number(where, doc, "max_concurrency", required=False, most=MOST_SEQUENCES)
    if limit is None:
        concurrency, note = open_loop_concurrency(where, doc, completed)
    else:
        concurrency = min(limit, completed)
        note = f"max_concurrency {limit}" + (f", {completed} requests completed" if completed < limit else "")
    model = doc.get("model_id")
    return ServingObservation(
        source=where,
        engine=engine,
        measured=Measured(
            tpot_s=_engine_tpot(where, doc, completed),
            tokens_per_s=number(where, doc, "output_throughput", span=(0, MOST_TOKENS_PER_S)),
            ttft_s=_first(where, doc, ENGINE_TTFT, 1e-3),
        ),
        requests=_engine_requests(where, doc, completed),
        concurrency=concurrency,
        concurrency_note=note,
        concurrency_inferred=limit is None and concurrency is not None,
        model=model if isinstance(model, str) else None,
    )


def open_loop_concurrency(where: str, doc: dict, completed: int) -> tuple[int | None, str]:
    """A run without --max-concurrency: with requests sent at a finite `request_rate`, the mean
    number in flight by Little's law, the measured requests/s times the mean end-to-end latency
    (SGLang's own `concurrency` where it wrote one, which is that; else `mean_e2el_ms` /
    `mean_e2e_latency_ms`; else the mean TTFT plus the mean output less one times the mean TPOT);
    with every request sent at once, None (the engine's limit decides, which the file does not
    say)."""
    rate = doc.get("request_rate")
    if isinstance(rate, str) and rate.strip().lower() not in ("inf", "infinity"):
        raise ServingResultError(f"{where}: request_rate: expected requests per second or 'inf', got {rate!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate):
        return None, "max_concurrency is null (the benchmark ran without --max-concurrency)"
    if rate <= 0:
        raise ServingResultError(f"{where}: request_rate: expected requests per second above 0, got {rate:g}")
    if doc.get("concurrency") is not None:
        mean, how = number(where, doc, "concurrency"), "the benchmark's own mean in flight"
    else:
        throughput = _request_throughput(where, doc, completed)
        mean, how = throughput * _mean_e2e_s(where, doc, completed), "requests/s x mean end-to-end latency"
    concurrency = max(1, round(in_span(where, "the mean in flight", mean, 0, MOST_SEQUENCES)))
    return concurrency, f"request rate {rate:g}/s without a concurrency cap: {mean:.1f} in flight on average ({how})"


def _engine_tpot(where: str, doc: dict, completed: int) -> float:
    """The median TPOT, else the mean, else the mean from the mean end-to-end latency (module docstring)."""
    if any(doc.get(key) is not None for key in ENGINE_TPOT) or not any(doc.get(k) is not None for k in ENGINE_E2E):
        return _first(where, doc, ENGINE_TPOT, 1e-3)
    output = number(where, doc, "total_output_tokens") / completed
    if output <= 1:
        raise ServingResultError(
            f"{where}: missing key 'median_tpot_ms' (or 'mean_tpot_ms'), and with {output:g} output tokens a request "
            "on average the mean end-to-end latency does not give one"
        )
    gap = (_mean_e2e_s(where, doc, completed) - _first(where, doc, ENGINE_TTFT[::-1], 1e-3)) / (output - 1)
    return in_seconds(where, "mean time per output token (from the mean end-to-end latency)", gap, f"{gap:g} s")


def _request_throughput(where: str, doc: dict, completed: int) -> float:
    if doc.get("request_throughput") is None and doc.get("duration") is not None:
        return completed / number(where, doc, "duration")
    return number(where, doc, "request_throughput")


def _mean_e2e_s(where: str, doc: dict, completed: int) -> float:
    for key in ENGINE_E2E:
        if doc.get(key) is not None:
            return number(where, doc, key) * 1e-3
    if doc.get("mean_ttft_ms") is None or doc.get("mean_tpot_ms") is None:
        raise ServingResultError(
            f"{where}: missing key 'mean_e2el_ms' (or 'mean_e2e_latency_ms', or both 'mean_ttft_ms' and "
            "'mean_tpot_ms'): an open loop's mean in flight is its requests/s times its mean end-to-end latency"
        )
    output = number(where, doc, "total_output_tokens") / completed
    return seconds(where, doc, "mean_ttft_ms", 1e-3) + max(output - 1, 0) * seconds(where, doc, "mean_tpot_ms", 1e-3)


def _engine_requests(where: str, doc: dict, completed: int) -> tuple[RequestShape, ...]:
    """Request shapes from the per-request lens when saved, else the means of the totals."""
    ins, outs = doc.get("input_lens"), doc.get("output_lens")
    if isinstance(ins, list) and isinstance(outs, list) and ins:
        if len(ins) != len(outs):
            raise ServingResultError(
                f"{where}: input_lens has {len(ins)} entries and output_lens {len(outs)}; one per request expected"
            )
        pairs = []
        for i, (p, o) in enumerate(zip(ins, outs)):
            if any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MOST_TOKENS for v in (p, o)):
                raise ServingResultError(
                    f"{where}: input_lens[{i}], output_lens[{i}]: expected token counts from 0 to {MOST_TOKENS:,}"
                )
            if p >= 1 and o >= 1:  # a failed request has no output
                pairs.append((p, o))
        if pairs:
            return group_shapes(pairs)
    prompt = in_span(
        where, "total_input_tokens / completed", number(where, doc, "total_input_tokens") / completed, 0, MOST_TOKENS
    )
    output = in_span(
        where, "total_output_tokens / completed", number(where, doc, "total_output_tokens") / completed, 0, MOST_TOKENS
    )
    return (RequestShape(prompt_len=max(1, round(prompt)), output_len=max(1, round(output))),)


def group_shapes(pairs: list[tuple[int, int]], limit: int = MAX_SHAPES) -> tuple[RequestShape, ...]:
    """(prompt, output) pairs as at most `limit` shapes of near-equal count (module docstring)."""
    pairs = sorted(pairs)
    groups = min(limit, len(pairs))
    out = []
    for g in range(groups):
        part = pairs[g * len(pairs) // groups : (g + 1) * len(pairs) // groups]
        prompt = round(sum(p for p, _ in part) / len(part))
        output = round(sum(o for _, o in part) / len(part))
        out.append(RequestShape(prompt_len=prompt, output_len=output, weight=float(len(part))))
    return tuple(out)


def _read_report(where: str, doc: dict) -> list[ServingObservation]:
    """Our own serving run report (module docstring): one observation per replica."""
    if doc.get("format") != SERVING_RUN_FORMAT:
        raise ServingResultError(
            f"{where}: format: expected {SERVING_RUN_FORMAT!r} (a serving run report of `llm-planner launch`), "
            f"got {json.dumps(doc.get('format'))[:60]}"
        )
    if not is_version(doc.get("version"), SERVING_RUN_VERSION):
        raise ServingResultError(f"{where}: version: expected {SERVING_RUN_VERSION}, got {doc.get('version')!r}")
    for key in ("model", "workload", "replicas"):
        if key not in doc:
            raise ServingResultError(f"{where}: missing key {key!r}")
    workload = doc["workload"]
    if not isinstance(workload, dict):
        raise ServingResultError(f"{where}: workload: expected an object")
    shape = RequestShape(
        prompt_len=whole_number(f"{where}: workload", workload, "prompt_len", most=MOST_TOKENS),
        output_len=whole_number(f"{where}: workload", workload, "output_len", most=MOST_TOKENS),
    )
    replicas = doc["replicas"]
    if not isinstance(replicas, list) or not replicas:
        raise ServingResultError(f"{where}: replicas: expected a list of at least one replica")
    model = doc["model"] if isinstance(doc["model"], str) else None
    dtype = doc.get("dtype") if isinstance(doc.get("dtype"), str) else None  # reports before it have none
    if not any(_served(r) for r in replicas):
        raise ServingResultError(f"{where}: replicas: the run routed no replica a request; nothing to calibrate on")
    return [
        dataclasses.replace(_report_replica(f"{where} replicas[{i}]", r, shape, model), dtype=dtype)
        for i, r in enumerate(replicas)
        if _served(r)
    ]


def _report_replica(where: str, r: Any, shape: RequestShape, model: str | None) -> ServingObservation:
    if not isinstance(r, dict):
        raise ServingResultError(f"{where}: expected an object")
    if not isinstance(r.get("layout"), str):
        raise ServingResultError(f"{where}: missing key 'layout' (the replica's layout notation)")
    measured = r.get("measured")
    if not isinstance(measured, dict):
        raise ServingResultError(f"{where}: missing key 'measured'")
    m = f"{where}.measured"
    tpot = "tpot_p50_s" if measured.get("tpot_p50_s") is not None else "tpot_s"
    ttft = next((k for k in ("ttft_steady_s", "ttft_p50_s") if measured.get(k) is not None), "ttft_s")
    concurrency, note = _reached(where, r)
    return ServingObservation(
        source=where,
        engine="llm_planner",
        measured=Measured(
            tpot_s=seconds(m, measured, tpot),
            tokens_per_s=number(m, measured, "tokens_per_s", span=(0, MOST_TOKENS_PER_S)),
            ttft_s=seconds(m, measured, ttft, required=False),
            decode_step_s=seconds(m, measured, "decode_step_s", required=False),
        ),
        requests=(shape,),
        concurrency=concurrency,
        concurrency_note=note,
        micro_batches=min(concurrency, whole_number(where, r, "micro_batches", most=MOST_SEQUENCES)),
        layout=r["layout"],
        max_batched_tokens=whole_number(where, r, "max_batched_tokens", most=MOST_BUDGET),
        model=model,
    )


def _reached(where: str, r: dict) -> tuple[int, str]:
    """The sequences the replica had in flight: its planned concurrency, or fewer where the run routed
    it fewer requests (`predicted.concurrency`, llm_planner.launch.serve_report)."""
    planned = whole_number(where, r, "concurrency", most=MOST_SEQUENCES)
    predicted = r.get("predicted")
    reached = predicted.get("concurrency") if isinstance(predicted, dict) else None
    if isinstance(reached, int) and not isinstance(reached, bool) and 0 < reached < planned:
        return reached, f"concurrency {reached} (the run routed it {reached} requests; the plan's is {planned})"
    return planned, f"concurrency {planned} of the report"


def _served(r: Any) -> bool:
    """Whether the report's replica was routed any request (a run cut short may route one none)."""
    predicted = r.get("predicted") if isinstance(r, dict) else None
    return not (isinstance(predicted, dict) and predicted.get("concurrency") == 0)
