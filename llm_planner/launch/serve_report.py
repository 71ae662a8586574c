"""The run report of a served plan: each replica measured beside the planner's prediction.

Written by `llm-planner launch SERVING_PLAN --report run.json` (docs/serve-runtime.md):

    {"format": "llm_planner.serving_run", "version": 1, "plan": <plan path as given>, "model": <name>,
     "dtype": <the element type served: the plan's, or launch --dtype>,
     "workload": {"prompt_len": P, "output_len": O, "seed": S, "request_rate": null | R},
     "replicas": [{"replica": i, "layout": <pattern>, "concurrency": C, "micro_batches": m,
                   "max_batched_tokens": B, "cuda_graphs": [per stage: "on" or why not],
                   "requests_completed": n, "output_tokens": n, "duration_s": t,
                   "measured": {"tokens_per_s", "tpot_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
                                "ttft_s", "ttft_p50_s", "ttft_p99_s", "ttft_steady_s", "steady_requests",
                                "decode_step_s"},
                   "predicted": {"concurrency", "tokens_per_s", "tpot_s", "ttft_s", "decode_step_s"}}, ...],
     "total": {"requests_completed", "output_tokens", "duration_s", "measured": {"tokens_per_s"},
               "predicted": {"tokens_per_s"}}}

Measured, from the first stage's clock of each replica (llm_planner.runtime.serve_run):
tokens/s = output tokens / duration (from the start to its last request's last token); a
request's TPOT = (last token - first token) / (output tokens - 1), requests of one output token
having none; its TTFT = first token - arrival (open loop: the Poisson arrival, queueing
included; closed loop: its admission); mean and percentiles (linear between order statistics)
over the completed requests; decode_step_s the median round trip of the iterations that carried
only decodes (from the first stage building one to its tokens back). ttft_steady_s: the mean TTFT
of the `steady_requests` admitted once the opening burst has drained, that is at or after the last
token of the last of the first C requests admitted (C the replica's concurrency): a closed loop
admits C requests at its start, whose prompts wait behind one another for the token budget, a
ramp the planner's steady-state TTFT does not describe and a short run's mean carries. A figure
with nothing to measure is null. Predicted: llm_planner.serving.score.score_replica at the plan's layers,
concurrency and micro-batches, the figures the plan states; at the request shape and dtype served
where `launch --prompt-len / --output-len / --dtype` change them; at fewer sequences in flight
(predicted.concurrency, with a note under "warnings") for a replica a closed loop cut short by
`--max-requests` (or its default) routes fewer requests than its concurrency, and none (concurrency 0,
tokens/s 0, the times null) for one it routes no request. With several request shapes,
prompt_len and output_len are the load's weighted means.
"""

from __future__ import annotations

import statistics
from typing import Any

SERVING_RUN_FORMAT = "llm_planner.serving_run"
SERVING_RUN_VERSION = 1


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between order statistics; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100.0
    lo = int(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _admitted(request: dict[str, Any]) -> float:
    return request.get("admitted_s", request["arrival_s"])


def steady_requests(requests: list[dict[str, Any]], concurrency: int) -> list[dict[str, Any]]:
    """The completed requests admitted once the opening burst (the first `concurrency` admitted)
    has drained: at or after the last token of the last of them (module docstring)."""
    opening = sorted((r for r in requests if r["token_s"]), key=_admitted)[:concurrency]
    if len(opening) < concurrency:
        return []
    drained = max(r["token_s"][-1] for r in opening)
    return [r for r in requests if r["token_s"] and _admitted(r) >= drained]


def measured(record: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """The measured figures of one replica's raw record (module docstring)."""
    requests = record["requests"]
    tokens = sum(len(r["token_s"]) for r in requests)
    duration = float(record["duration_s"])
    tpots = [(r["token_s"][-1] - r["token_s"][0]) / (len(r["token_s"]) - 1) for r in requests if len(r["token_s"]) > 1]
    ttfts = [r["token_s"][0] - r["arrival_s"] for r in requests if r["token_s"]]
    decode_steps = [back - sent for sent, back, decode_only, *_ in record["iterations"] if decode_only]
    steady = steady_requests(requests, concurrency)
    return {
        "tokens_per_s": tokens / duration if duration > 0 else None,
        "tpot_s": _mean(tpots),
        "tpot_p50_s": percentile(tpots, 50),
        "tpot_p90_s": percentile(tpots, 90),
        "tpot_p99_s": percentile(tpots, 99),
        "ttft_s": _mean(ttfts),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "ttft_steady_s": _mean([r["token_s"][0] - r["arrival_s"] for r in steady]),
        "steady_requests": len(steady),
        "decode_step_s": statistics.median(decode_steps) if decode_steps else None,
    }


def _workload(spec) -> dict[str, Any]:
    shapes = spec.load.shapes
    if len(shapes) == 1:
        prompt, output = shapes[0][0], shapes[0][1]
    else:
        total = sum(w for _, _, w in shapes)
        prompt = sum(p * w for p, _, w in shapes) / total
        output = sum(o * w for _, o, w in shapes) / total
    return {"prompt_len": prompt, "output_len": output, "seed": spec.load.seed, "request_rate": spec.load.request_rate}


def _cuda_graphs(raw: dict[str, Any], replica: int) -> list[str | None]:
    """Each stage's CUDA graphs as its leader ran them: "on" or why not (llm_planner.runtime.serve_graphs)."""
    leaders = [r for r in raw.get("ranks", []) if r.get("replica") == replica and r.get("member") == 0]
    return [r.get("cuda_graphs") for r in sorted(leaders, key=lambda r: r["stage"])]


def _predicted(score) -> dict[str, Any]:
    """A replica's predicted figures; with no score (the run routes it no request), nothing."""
    if score is None:
        return {"concurrency": 0, "tokens_per_s": 0.0, "tpot_s": None, "ttft_s": None, "decode_step_s": None}
    return {
        "concurrency": score.ev.concurrency,  # below the plan's when the run routes it fewer requests
        "tokens_per_s": score.ev.tokens_per_s,
        "tpot_s": score.ev.tpot_s,
        "ttft_s": score.ev.ttft_s,
        "decode_step_s": score.decode_step_s,
    }


def serving_report(plan_path: str, prepared, raw: dict[str, Any]) -> dict[str, Any]:
    """The run report (module docstring) from the ranks' raw record and the launch's predictions."""
    spec = prepared.spec
    records = {r["replica"]: r for r in raw["replicas"]}
    replicas = []
    for i, (replica, score) in enumerate(zip(spec.replicas, prepared.scores)):
        record = records.get(i, {"requests": [], "iterations": [], "duration_s": 0.0})
        replicas.append(
            {
                "replica": i,
                "layout": replica.pattern,
                "concurrency": replica.concurrency,
                "micro_batches": replica.micro_batches,
                "max_batched_tokens": spec.max_batched_tokens,
                "cuda_graphs": _cuda_graphs(raw, i),
                "requests_completed": len(record["requests"]),
                "output_tokens": sum(len(r["token_s"]) for r in record["requests"]),
                "duration_s": float(record["duration_s"]),
                "measured": measured(record, replica.concurrency),
                "predicted": _predicted(score),
            }
        )
    tokens = sum(r["output_tokens"] for r in replicas)
    duration = max((r["duration_s"] for r in replicas), default=0.0)
    return {
        "format": SERVING_RUN_FORMAT,
        "version": SERVING_RUN_VERSION,
        "plan": plan_path,
        "model": spec.model,
        "dtype": prepared.table.run.dtype,  # the element type served (the plan's, or launch --dtype)
        "workload": _workload(spec),
        "replicas": replicas,
        "total": {
            "requests_completed": sum(r["requests_completed"] for r in replicas),
            "output_tokens": tokens,
            "duration_s": duration,
            "measured": {"tokens_per_s": tokens / duration if duration > 0 else None},
            "predicted": {"tokens_per_s": sum(r["predicted"]["tokens_per_s"] for r in replicas)},
        },
    }
