"""The serving workload: request lengths and latency targets, and what the steady state of
continuous batching needs from them.

Requests arrive with a prompt of P tokens and generate O output tokens. In the steady state
of continuous batching (Yu et al., "Orca", OSDI 2022; chunked prefill as in Agrawal et al.,
"Sarathi-Serve", OSDI 2024) every engine iteration advances each sequence in flight by one
output token and spends the rest of its token budget on prompt chunks. By Little's law the
sequences in flight are requests weighted by how long they stay, O iterations each, so for
a distribution of (P, O) with weights w:

    prefill tokens per output token   E[P] / E[O]
    mean context of a decode step     E[O (P + O / 2)] / E[O]     (KV read by attention)
    mean full context in flight       E[O (P + O)] / E[O]         (KV held: every sequence at
                                                                    its full context, no eviction)

With one (P, O) pair these are P / O, P + O / 2 and P + O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_planner.core import units

# The latency targets a plan may be asked for. A looser TPOT target lets more sequences share an
# iteration, and the search's work grows with them: past 10 s per token it ran for hours.
TPOT_SLO_RANGE_S = (1e-3, 10.0)
TTFT_SLO_RANGE_S = (1e-3, 3600.0)
TPOT_RANGE = f"from {units.time_text(TPOT_SLO_RANGE_S[0])} to {units.time_text(TPOT_SLO_RANGE_S[1])}"
TTFT_RANGE = f"from {units.time_text(TTFT_SLO_RANGE_S[0])} to {units.time_text(TTFT_SLO_RANGE_S[1])}"
# The most tokens a request's prompt, output or context may have, the most sequences in flight and
# the largest token budget of an engine iteration a command or a measurement file may state (the
# command line's flags, llm_planner.cli.arg_types, and a measured run, llm_planner.measure): past
# them the model's arithmetic would overflow or run for hours.
MOST_TOKENS = 2**24
MOST_SEQUENCES = 2**20
MOST_BUDGET = 2**20


class WorkloadError(ValueError):
    """A serving workload or target that cannot be used; the message names the flag or file."""


class NoKindRunsError(WorkloadError):
    """No device kind that may serve runs the precision asked: no plan exists in it (its bound is 0),
    where any other WorkloadError says nothing about what plans exist."""


@dataclass(frozen=True, kw_only=True)
class RequestShape:
    prompt_len: int
    output_len: int
    weight: float = 1.0


@dataclass(frozen=True, kw_only=True)
class ServingWorkload:
    """Request lengths (a distribution of (prompt, output) pairs) and the latency targets."""

    requests: tuple[RequestShape, ...]
    tpot_slo_s: float  # every request's time per output token must stay at or under this
    ttft_slo_s: float | None = None  # estimated time to first token, optional target
    source: str = "flags"

    def __post_init__(self) -> None:
        if not self.requests:
            raise WorkloadError(f"{self.source}: no request lengths")
        for r in self.requests:
            if r.prompt_len < 1 or r.output_len < 1 or not (math.isfinite(r.weight) and r.weight > 0):
                raise WorkloadError(f"{self.source}: prompt_len and output_len must be >= 1 and weight > 0, got {r}")
        # targets given as flags were checked as flags (workload_from_flags); others are a file's fields
        fields = (f"{self.source}.tpot_slo_s", f"{self.source}.ttft_slo_s")
        tpot, ttft = ("--tpot-slo", "--ttft-slo") if self.source == "flags" else fields
        duration_s(tpot, self.tpot_slo_s, TPOT_SLO_RANGE_S)
        if self.ttft_slo_s is not None:
            duration_s(ttft, self.ttft_slo_s, TTFT_SLO_RANGE_S)

    @property
    def shares(self) -> tuple[float, ...]:
        """Each shape's share of the requests, summing to 1: the weights are taken relative to the
        largest first, so that their sum stays finite however large they are (1e308 each)."""
        top = max(r.weight for r in self.requests)
        relative = [r.weight / top for r in self.requests]
        total = sum(relative)
        return tuple(w / total for w in relative)

    def _mean(self, f) -> float:
        return sum(w * f(r) for w, r in zip(self.shares, self.requests))

    @property
    def mean_prompt_len(self) -> float:
        return self._mean(lambda r: r.prompt_len)

    @property
    def mean_output_len(self) -> float:
        return self._mean(lambda r: r.output_len)

    @property
    def prefill_per_output(self) -> float:
        """Prompt tokens processed per output token, E[P] / E[O]."""
        return self.mean_prompt_len / self.mean_output_len

    @property
    def decode_context(self) -> float:
        """Mean context a decode step attends to, E[O (P + O/2)] / E[O]."""
        return self._mean(lambda r: r.output_len * (r.prompt_len + r.output_len / 2)) / self.mean_output_len

    @property
    def kv_context(self) -> float:
        """Mean full context of a sequence in flight, E[O (P + O)] / E[O]: KV tokens held per sequence."""
        return self._mean(lambda r: r.output_len * (r.prompt_len + r.output_len)) / self.mean_output_len

    @property
    def max_context(self) -> int:
        return max(r.prompt_len + r.output_len for r in self.requests)

    def to_dict(self) -> dict:
        return {
            "requests": [
                {"prompt_len": r.prompt_len, "output_len": r.output_len, "weight": r.weight} for r in self.requests
            ],
            "tpot_slo_s": self.tpot_slo_s,
            "ttft_slo_s": self.ttft_slo_s,
        }


def duration_s(flag: str, value: str | float, bounds: tuple[float, float]) -> float:
    """`value` read as a time in `bounds` (units.parse_duration: text needs its unit)."""
    try:
        return units.parse_duration(value, *bounds)
    except (units.UnitError, TypeError) as exc:
        raise WorkloadError(f"{flag}: {exc}") from None


def plan_workload(data: dict, source: str = "flags") -> ServingWorkload:
    """The workload a serving plan's data states (its `workload` section), checked as `source` names it."""
    wl = data["workload"]
    return ServingWorkload(
        requests=tuple(RequestShape(**r) for r in wl["requests"]),
        tpot_slo_s=wl["tpot_slo_s"],
        ttft_slo_s=wl.get("ttft_slo_s"),
        source=source,
    )
