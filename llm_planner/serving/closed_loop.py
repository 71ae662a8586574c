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

Requests sent together need not reach the engine together: its front end (the HTTP server that
receives a request, tokenizes it and hands it to the scheduler) takes them one at a time, and with
`front_end_s` per request the i-th of a burst reaches the engine i x `front_end_s` after the front
end is free. Each iteration admits only the requests that have reached the engine by its start, so
a burst spreads over the iterations it arrives in; an idle engine waits for the next request. At
0 (the default) every request reaches the engine when it is sent.

An engine admits a request only while its KV cache has room for it: with `max_running` below C, at
most that many sequences run (prompt admitted, not yet ended) and the others wait in the engine's
queue, in arrival order, their wait counted in their TTFT. The planner's memory model holds every
sequence's cache at its full context, so `max_running` is the number of full contexts memory holds:
TensorRT-LLM's default admission (`GUARANTEED_NO_EVICT` reserves a request's whole length when it
starts it). vLLM and SGLang admit on the blocks in use and preempt a sequence when they run out: they
hold more at once (up to what memory holds at the sequences' mean context) and recompute the
preempted ones, which this simulation does not model. An iteration's decodes count in its budget,
so no more sequences than the budget's tokens run at once either (vLLM refuses a `--max-num-seqs`
above `--max-num-batched-tokens`): `max_running` is at most the budget.

The figures are those the load generators report, over every request of `rounds` x C:

    TTFT     mean of (first token - sent)
    TPOT     mean of (end - first token) / (output_len - 1)   (genai-perf's inter-token latency)
    tokens/s output tokens of the requests / the time the last one ended
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

ROUNDS = 3  # requests simulated per slot of the concurrency, unless told
# The most sequences in flight a closed loop simulates: its time grows faster than the concurrency
# (seconds at this many, minutes at a few hundred thousand), and load generators keep a few thousand.
MOST_CONCURRENCY = 16384
_EPS_S = 1e-12  # arrival times are sums of floats: a request due at `now` within this is there


@dataclass(frozen=True, kw_only=True)
class ClosedLoopResult:
    """What a closed-loop benchmark of `requests` requests reports (module docstring)."""

    ttft_s: float
    tpot_s: float | None  # None with one output token a request: no time between tokens to measure
    tokens_per_s: float
    requests: int
    iterations: int
    max_running: int  # the most sequences running at once (C where memory and the budget hold them all)
    front_end_s: float  # the front end's time a request (0: the requests reach the engine as sent)


@dataclass
class _Cohort:
    """Requests that move together: `count` of them, their send times summed, and each's prompt
    tokens left (waiting) or tokens generated and first token's time (running). Waiting, the first
    reaches the engine at `arrive_s` and each next one `gap_s` later (the front end's time a request)."""

    count: int
    sent_sum_s: float
    prompt_left: float = 0.0
    tokens: int = 0
    first_s: float = 0.0
    arrive_s: float = 0.0
    gap_s: float = 0.0

    def split(self, n: int) -> _Cohort:
        """The first n of the requests as a cohort of their own, taken from this one (their mean send
        time kept)."""
        part = _Cohort(n, self.sent_sum_s * n / self.count, self.prompt_left, self.tokens, self.first_s)
        part.arrive_s, part.gap_s = self.arrive_s, self.gap_s
        self.count -= n
        self.sent_sum_s -= part.sent_sum_s
        self.arrive_s += n * self.gap_s
        return part

    def arrived(self, now: float) -> int:
        """How many of the requests the engine has by `now`."""
        if now < self.arrive_s - _EPS_S:
            return 0
        if self.gap_s == 0:
            return self.count
        return min(self.count, int((now - self.arrive_s + _EPS_S) / self.gap_s) + 1)

    def next_arrival_s(self, now: float) -> float:
        """When the next of the requests not yet at the engine by `now` reaches it (inf: all have)."""
        k = self.arrived(now)
        return self.arrive_s + k * self.gap_s if k < self.count else math.inf


@dataclass
class _Tally:
    requests: int = 0
    ttft_sum_s: float = 0.0
    tpot_sum_s: float = 0.0
    last_end_s: float = 0.0
    iterations: int = 0


@dataclass
class _FrontEnd:
    """The engine's front end, taking requests one at a time, `request_s` each."""

    request_s: float
    free_s: float = 0.0

    def send(self, waiting: list[_Cohort], n: int, now: float, prompt_len: int) -> None:
        """The clients of the n requests that ended send their next at once; they reach the engine
        one after another as the front end passes them on."""
        if n > 0:
            start = max(now, self.free_s)
            self.free_s = start + n * self.request_s
            waiting.append(_Cohort(n, n * now, prompt_len, arrive_s=start + self.request_s, gap_s=self.request_s))


def closed_loop(
    iteration_s: Callable[[int, float], float],
    *,
    concurrency: int,
    prompt_len: int,
    output_len: int,
    token_budget: int,
    chunked_prefill: bool,
    rounds: int = ROUNDS,
    max_running: int | None = None,
    front_end_s: float = 0.0,
) -> ClosedLoopResult:
    """Simulate `rounds` x `concurrency` requests of one shape kept `concurrency` in flight (module
    docstring). Requests in step are kept as cohorts, and a stretch of iterations that admits no
    prompt and ends no request is stepped over at once: the time grows with the events, not with
    the iterations."""
    running_cap = min(concurrency, token_budget, concurrency if max_running is None else max_running)
    if min(concurrency, prompt_len, output_len, token_budget, rounds, running_cap) < 1 or front_end_s < 0:
        raise ValueError(
            "a closed loop needs at least one sequence, prompt token, output token, budget token and round, "
            "room for one sequence, and a front end time of at least 0"
        )
    if concurrency > MOST_CONCURRENCY:
        raise ValueError(
            f"a closed loop simulates at most {MOST_CONCURRENCY:,} sequences in flight, not {concurrency:,}"
        )
    front, waiting, running, tally, now = _FrontEnd(front_end_s), [], [], _Tally(), 0.0
    front.send(waiting, concurrency, now, prompt_len)
    while tally.requests < rounds * concurrency:
        decodes = sum(c.count for c in running)
        room = running_cap - decodes  # a prompt part-done in chunks heads the queue and takes its room first
        prompts, started = _admit(waiting, decodes, token_budget, chunked_prefill, room, now)
        if not (started or prompts or running):  # the engine idles until the next request reaches it
            now = min(c.arrive_s for c in waiting)
            continue
        iteration = iteration_s(decodes, prompts)
        steps = 1 if started or prompts else _quiet_steps(running, waiting, output_len, now, iteration)
        now += steps * iteration
        tally.iterations += steps
        for c in running:
            c.tokens += steps
        for c in started:
            c.tokens, c.first_s = 1, now
        active = running + started
        running = [c for c in active if c.tokens < output_len]
        ended = [c for c in active if c.tokens >= output_len]
        for c in ended:
            _tally(c, output_len, now, tally)
        front.send(waiting, sum(c.count for c in ended), now, prompt_len)
    return ClosedLoopResult(
        ttft_s=tally.ttft_sum_s / tally.requests,
        tpot_s=tally.tpot_sum_s / tally.requests if output_len > 1 else None,
        tokens_per_s=tally.requests * output_len / tally.last_end_s,
        requests=tally.requests,
        iterations=tally.iterations,
        max_running=running_cap,
        front_end_s=front_end_s,
    )


def _quiet_steps(running: list[_Cohort], waiting: list[_Cohort], output_len: int, now: float, iteration: float) -> int:
    """Decode-only iterations until one ends a request or one starts after a request reaches the engine."""
    steps = min(output_len - c.tokens for c in running)
    arrival = _next_arrival_s(waiting, now)
    if arrival < math.inf:
        steps = min(steps, max(1, math.ceil((arrival - now) / iteration - 1e-9)))
    return steps


def _next_arrival_s(waiting: list[_Cohort], now: float) -> float:
    """When the next request not yet at the engine reaches it (inf: every waiting one has). The front
    end passes requests on in the order sent, so the cohorts reach the engine in list order: those not
    all there are a tail of the list, and its first holds the next arrival. The tail is walked from
    the end; a queue of requests that have all arrived (an engine that is full) costs one look."""
    first = len(waiting)
    while first > 0 and waiting[first - 1].next_arrival_s(now) < math.inf:
        first -= 1
    return waiting[first].next_arrival_s(now) if first < len(waiting) else math.inf


def _admit(
    waiting: list[_Cohort], decodes: int, budget: int, chunked: bool, room: int, now: float
) -> tuple[float, list[_Cohort]]:
    """The prompt tokens this iteration takes from `waiting` (in order, those that have reached the
    engine by `now`) and the cohorts whose prompts it finishes (removed from `waiting`; a cohort
    partly admitted is split)."""
    left, taken, started = budget - decodes, 0.0, []
    while waiting and left > 0 and room > 0:
        head = waiting[0]
        here = head.arrived(now)
        whole = min(here, int(left // head.prompt_left), room)
        if here and whole == 0 and not chunked and decodes == 0 and taken == 0:
            whole = 1  # a prompt over the budget goes alone
        if whole:
            started.append(head.split(whole) if whole < head.count else waiting.pop(0))
            taken += whole * head.prompt_left
            left -= whole * head.prompt_left
            room -= whole
            continue
        if chunked and here:  # one request takes what is left of the budget and goes on next iteration
            part = head.split(1) if head.count > 1 else waiting.pop(0)
            part.prompt_left -= left
            taken += left
            waiting.insert(0, part)
        break
    return taken, started


def _tally(c: _Cohort, output_len: int, now: float, tally: _Tally) -> None:
    """A cohort that has its last token: its figures go into the tally."""
    tally.requests += c.count
    tally.ttft_sum_s += c.first_s * c.count - c.sent_sum_s
    tally.tpot_sum_s += c.count * (now - c.first_s) / max(output_len - 1, 1)
    tally.last_end_s = now
