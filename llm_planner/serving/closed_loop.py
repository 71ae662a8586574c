"""A closed-loop benchmark of one replica, iteration by iteration: what a load generator that keeps C
requests of one shape in flight measures (genai-perf's concurrency mode, `vllm bench serve
--max-concurrency C` on fixed lengths, SGLang's `bench_serving` with `--max-concurrency`).

The serving model (llm_planner.serving.replica) describes the steady state of requests that arrive
spread out: every iteration carries its even share of prompt work, so a prompt's cost lands in the
TPOT of every sequence beside it. A closed loop of identical requests that all start at once does
not reach that state. Its C prompts come in together, run in the first iterations, and the C
sequences then decode together and end together; the client sends the next C at once, and the
bursts persist. The prompts' time then lands in the TTFT (each request waits for the prompts
ahead of it in the burst) and barely in the TPOT. A figure such a benchmark prints is compared with
this simulation, not with the steady state; the two agree where prompts are short beside the
outputs or few sequences are in flight.

The engine is modelled as its scheduler runs (vLLM's and SGLang's continuous batching, TensorRT-LLM's
in-flight batching): each iteration carries one decode token of every sequence whose prompt is done,
and prompt tokens of the waiting requests in arrival order within the token budget, the decodes
counted in it (vLLM's `--max-num-batched-tokens`, SGLang's `--chunked-prefill-size`, TensorRT-LLM's
`max_num_tokens`). With chunked prefill a prompt takes whatever the budget leaves and continues in
the next iteration; without it a prompt goes whole or waits (one longer than the budget goes alone).
An iteration's time is the replica's on that load (`iteration_s(decodes, prompt_tokens)`: its stages'
times on it, the decode context at its mean). At its end each decoding sequence has one more
token, and a request whose prompt it finished has its first. A request ends at its last token and
the client sends the next at once.

The figures are those the load generators report, over every request of `rounds` x C:

    TTFT     mean of (first token - sent)
    TPOT     mean of (end - first token) / (output_len - 1)   (genai-perf's inter-token latency)
    tokens/s output tokens of the requests / the time the last one ended
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ROUNDS = 3  # requests simulated per slot of the concurrency, unless told


@dataclass(frozen=True, kw_only=True)
class ClosedLoopResult:
    """What a closed-loop benchmark of `requests` requests reports (module docstring)."""

    ttft_s: float
    tpot_s: float
    tokens_per_s: float
    requests: int
    iterations: int


@dataclass
class _Request:
    sent_s: float
    prompt_left: float
    tokens: int = 0
    first_s: float = 0.0


def closed_loop(
    iteration_s: Callable[[int, float], float],
    *,
    concurrency: int,
    prompt_len: int,
    output_len: int,
    token_budget: int,
    chunked_prefill: bool,
    rounds: int = ROUNDS,
) -> ClosedLoopResult:
    """Simulate `rounds` x `concurrency` requests of one shape kept `concurrency` in flight (module docstring)."""
    if min(concurrency, prompt_len, output_len, token_budget, rounds) < 1:
        raise ValueError(
            "a closed loop needs at least one sequence, prompt token, output token, budget token and round"
        )
    waiting = [_Request(0.0, prompt_len) for _ in range(concurrency)]  # in arrival order
    running: list[_Request] = []
    done: list[_Request] = []
    now, iterations, ends = 0.0, 0, []
    while len(done) < rounds * concurrency:
        prompts, finished = _admit(waiting, len(running), token_budget, chunked_prefill)
        now += iteration_s(len(running), prompts)
        iterations += 1
        for r in running:
            r.tokens += 1
        for r in finished:
            r.tokens, r.first_s = 1, now
        ended = [r for r in running + finished if r.tokens >= output_len]
        running = [r for r in running + finished if r.tokens < output_len]
        done += ended
        ends += [now] * len(ended)
        waiting += [_Request(now, prompt_len) for _ in ended]
    return _figures(done, ends, output_len, iterations)


def _admit(waiting: list[_Request], decodes: int, budget: int, chunked: bool) -> tuple[float, list[_Request]]:
    """The prompt tokens this iteration takes from `waiting` (in order) and the requests whose prompt
    it finishes (removed from `waiting`)."""
    left, taken, finished = budget - decodes, 0.0, []
    for r in waiting:
        if left <= 0:
            break
        if chunked:
            take = min(r.prompt_left, left)
        elif r.prompt_left <= left or (decodes == 0 and taken == 0):
            take = r.prompt_left
        else:
            break
        r.prompt_left -= take
        taken += take
        left -= take
        if r.prompt_left <= 0:
            finished.append(r)
    del waiting[: len(finished)]
    return taken, finished


def _figures(done: list[_Request], ends: list[float], output_len: int, iterations: int) -> ClosedLoopResult:
    n = len(done)
    ttft = sum(r.first_s - r.sent_s for r in done) / n
    gaps = max(output_len - 1, 1)
    tpot = sum((end - r.first_s) / gaps for r, end in zip(done, ends)) / n
    return ClosedLoopResult(
        ttft_s=ttft, tpot_s=tpot, tokens_per_s=n * output_len / max(ends), requests=n, iterations=iterations
    )
