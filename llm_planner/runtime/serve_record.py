"""What a replica's scheduler measured, as the raw run record holds it (plain data, no torch).

A replica's record: `{"replica": i, "duration_s": D, "requests": [...], "iterations": [...]}`, times
in seconds since the replica's start; a request `{"index", "prompt_len", "output_len", "arrival_s",
"admitted_s", "token_s": [when each token reached the scheduler], "tokens"}`; an iteration
`[sent, back, decode_only, tokens, entries]`. A replica with data-parallel attention has one
scheduler per member (llm_planner.runtime.serve_dp), whose records `merge_records` joins into the
replica's: their requests and iterations together (iterations in the order they were sent), the
longest duration.
"""

from __future__ import annotations

from typing import Any


def request_record(s) -> dict:
    """A finished sequence (llm_planner.runtime.serve_scheduler.Sequence) as the raw record holds it."""
    return {
        "index": s.request.index,
        "prompt_len": s.prompt_len,
        "output_len": s.request.output_len,
        "arrival_s": s.request.arrival_s if s.request.arrival_s is not None else s.admitted_s,
        "admitted_s": s.admitted_s,
        "token_s": s.token_s,
        "tokens": s.generated,
    }


def replica_record(replica: int, finished, iterations: list[list], end_s: float) -> dict:
    """What a scheduler measured: its finished sequences, its iterations, and when it ended."""
    return {
        "replica": replica,
        "duration_s": end_s,
        "requests": [request_record(s) for s in finished],
        "iterations": iterations,
    }


def merge_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per replica (module docstring), by replica."""
    merged: dict[int, dict[str, Any]] = {}
    for r in records:
        into = merged.setdefault(
            r["replica"], {"replica": r["replica"], "duration_s": 0.0, "requests": [], "iterations": []}
        )
        into["duration_s"] = max(into["duration_s"], r["duration_s"])
        into["requests"] += r["requests"]
        into["iterations"] += r["iterations"]
    for r in merged.values():
        r["iterations"].sort(key=lambda it: it[0])
    return [merged[i] for i in sorted(merged)]
