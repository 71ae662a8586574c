"""How an engine's iterations carry prompt tokens: in whole chunks, not spread thin.

With continuous batching and chunked prefill (vLLM; SGLang with --enable-mixed-chunk), an iteration
of b running sequences admits a waiting prompt up to the token budget B left beside the b decodes: a prompt of P tokens
enters in chunks of min(P, B - b) tokens, and an iteration carries such a chunk or none. Over
many iterations the prompt tokens per iteration average b r (r = E[P]/E[O], each sequence's share
of its prompt per output token), but they come in lumps. The expected iteration time is the mean
over the lumps, E[t(x)], not t(E[x]); since an iteration's time is convex in the prompt tokens it
carries (a sum of rooflines, llm_planner.cost.iteration), E[t(x)] >= t(b r) (Jensen): the spread
load, whose time the serving bounds read as pieces, stays below every iteration the engine runs.

`prompt_lumps` gives the two-point law the model takes for x: multiples of the chunk u next to the
mean (n u and (n + 1) u, the upper one cut at the room B - b), weighted so the mean is b r. Past
the room (b r > B - b) no engine keeps b sequences in flight: prompts back up, and the decodes thin
out until their prompt share fits. No plan runs there (serving.replica.within_budget); a point
scored there (`llm-planner score`, which warns) is priced at its whole prompt share, b r tokens an
iteration, as at the least budget that holds it (B = b (1 + r)): what keeping b sequences in
flight costs, and the spread load, whose time the bounds' pieces take, so they stay below every
iteration here too.

An engine without chunked prefill (or SGLang without --enable-mixed-chunk, its default, which cuts
a prompt at its chunk size but runs the chunks alone) runs each prompt in an iteration with no decodes
(`prefill_batch_tokens`): a decode iteration is then followed, on average, by b r / s prefill
iterations of s prompt tokens, each reading the weights again and paying the step overhead.
Such an engine is scored (`llm-planner score --no-chunked-prefill`), not planned for: the engines
the plans export to run chunked prefill.
"""

from __future__ import annotations

import bisect
import math


def engine_mixes_prompts(
    engine: str | None, mixed_chunk: bool | None = None, chunked_prefill: bool | None = None
) -> bool:
    """Whether an engine carries prompt chunks in the decodes' iterations (the model's chunked
    prefill) as run: SGLang only with --enable-mixed-chunk (`mixed_chunk`; off by default, its prompt
    chunks then run in prefill iterations of their own); any other engine unless its chunked prefill
    is stated off (`chunked_prefill` False: vLLM before V1 with it off, TensorRT-LLM without chunked
    context)."""
    if engine == "sglang":
        return mixed_chunk is True
    return chunked_prefill is not False


def prompt_lumps(mean_tokens: float, prompt_len: float, room: float) -> tuple[tuple[float, float], ...]:
    """((weight, prompt tokens), ...) of one iteration: chunks of min(prompt_len, room) tokens,
    their mean `mean_tokens` where the room allows it (module docstring)."""
    if mean_tokens <= 0:
        return ((1.0, 0.0),)
    room = max(room, 1.0)
    if mean_tokens >= room:
        return ((1.0, mean_tokens),)  # past the budget: the whole share, as at the least budget holding it
    chunk = max(min(prompt_len, room), 1.0)
    lo = math.floor(mean_tokens / chunk) * chunk
    hi = min(lo + chunk, room)
    share = (mean_tokens - lo) / (hi - lo)
    return ((1.0 - share, lo), (share, hi)) if share > 0 else ((1.0, lo),)


def prefill_batch_tokens(mean_tokens: float, prompt_len: float, budget: float) -> float:
    """An engine that runs prompts whole, in iterations of their own (no chunked prefill:
    TensorRT-LLM without chunked context, vLLM before V1 with it off): the prompt tokens one such
    iteration carries when `mean_tokens` prompt tokens arrive per decode iteration. The prompts
    that arrive in one decode iteration go together, at least one and no more than the budget
    holds (one at least: a prompt over the budget still runs whole). The decode iterations then
    pay mean_tokens / (these tokens) prefill iterations each."""
    if mean_tokens <= 0:
        return 0.0
    prompt = max(prompt_len, 1.0)
    arriving = max(1, math.floor(mean_tokens / prompt))
    fit = max(1, math.floor(budget / prompt))
    return min(arriving, fit) * prompt


def next_visit_s(cycle_s: float, concurrency: int) -> float:
    """How long a new request waits, on average, for its micro-batch's next visit: half a cycle
    with other sequences in flight (the engine is mid-cycle when it arrives, at a point uniform over
    the cycle), none with none (the engine is idle)."""
    return cycle_s / 2.0 if concurrency > 1 else 0.0


def prompt_wait_s(others: int, occupancy_s: float, request_s: float) -> float:
    """How long a prompt waits, on average, for the prompts ahead of it in its micro-batch: each of
    the `others` sequences beside it starts a new request every `request_s` (its TTFT plus its
    output's decode time: a closed loop), and each prompt holds the engine `occupancy_s` (the time
    its chunks add to the iterations that carry them). Arrivals at rate others / request_s on a
    server of deterministic service time: the M/D/1 wait (Pollaczek-Khinchine),
    rho S / (2 (1 - rho)) with rho = rate S, cut at others S (no more than the others can queue)."""
    if others <= 0 or occupancy_s <= 0 or request_s <= 0:
        return 0.0
    rho = others * occupancy_s / request_s
    most = others * occupancy_s
    return most if rho >= 1.0 else min(rho * occupancy_s / (2.0 * (1.0 - rho)), most)


def pieces_below(
    xs: list[float], ys: list[float], at: tuple[float, ...] | None = None
) -> tuple[tuple[float, float], ...]:
    """Lines (intercept, slope) of the lower convex hull of the points (xs increasing): each lies
    at or below every point, so their maximum is a convex function below the points. With `at`,
    only the hull's lines over those x (one each; fewer lines keep the bounds' programs small).
    Only lines with intercept and slope >= 0 are kept (the bounds read pieces of that form)."""
    hull: list[tuple[float, float]] = []
    for p in zip(xs, ys):
        while len(hull) >= 2 and _turns_left(hull[-2], hull[-1], p) <= 0:
            hull.pop()
        hull.append(p)
    segments = list(zip(hull, hull[1:]))
    if at is not None:
        ends = [b[0] for _, b in segments]
        segments = [segments[min(bisect.bisect_left(ends, x), len(segments) - 1)] for x in at] if segments else []
    lines = []
    for (x0, y0), (x1, y1) in dict.fromkeys(segments):
        slope = (y1 - y0) / (x1 - x0)
        lines.append((y0 - slope * x0, slope))
    return tuple((f, s) for f, s in lines if f >= 0 and s >= 0)


def _turns_left(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
