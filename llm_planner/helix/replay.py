"""Helix's offline engine replayed request by request: the decode tokens/s its simulator gives a
layout (docs/helix.md, "The engine, replayed").

The steady-state formula (llm_planner.helix.flow) takes every query to move through its machines
in one bunch per round. Helix's simulator does not: its machines start a batch as soon as they are
idle and something waits, so a round splits into many small batches (measured with
`benchmarks/helix_harness.py --batch-stats`). This module runs the simulator's mechanics on the
same max flow instead of a formula, with every rule read from Helix's code (docs/helix.md, "How
the simulator scores a layout"):

- queries: 20 started 0.1 s apart, then one more 0.1 s after a prompt or a query finishes while
  the fullest layer's expected KV use (prompt + 240 tokens per query on each layer of its
  machines, summed over the machines holding the layer) is at most 80% of their capacity; a
  query is a prompt request, then one decode request per output token, each issued when the
  previous one reaches the coordinator;
- routing: a prompt picks its route hop by hop by interleaved weighted round robin over the
  outgoing edges weighted by their flow (loads grow by the request's tokens, decodes included),
  skipping edges with less than 5% of the node's flow, machines whose prompt limit is below the
  prompt, and machines a new query would take past 85% of their expected KV; a query no route
  takes is dropped; decodes follow their prompt's route;
- a machine runs one batch at a time over its layers: what waits at its first layer when it
  starts, in FIFO order, up to its prompt limits (requests, 2,048 tokens each) and decode limits
  (requests, 1,000 tokens of context each); a layer takes prompt(P) + decode(D) (twice decode(1)
  for a lone decode), and the first layer adds the host's copy of the tokens received since the
  last first-layer batch;
- a link sends one request at a time: latency + bytes / bandwidth, the bandwidth Helix's
  scheduler gives the hop (the link's, capped by each end's NIC times the hop's share of that
  end's flow); the next send starts when the previous one's bytes are out.

Request lengths are Helix's own where its trace is given (llm_planner.helix.lengths: the same
pairs in the same order, drawn as Helix's feeder draws them); without it, from a seeded uniform
distribution with the means given. The window is Helix's (60 s of warm-up, then 600 s counted,
after the model is loaded, which is not simulated): its score includes the ramp from the opening
queries, whose outputs all run at once, to the steady mix of prompts and decodes, which takes
about the longest output to reach.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import deque
from dataclasses import dataclass

from llm_planner.cost.serving_profile import LayerTable
from llm_planner.helix.engine import BLOCK_TOKENS, EXPECTED_OUTPUT, FEED_HWM, EngineTables
from llm_planner.helix.flow import SINK, SOURCE
from llm_planner.helix.inputs import HelixError
from llm_planner.helix.lengths import Lengths

ROUTE_HWM = 0.85  # routing skips a machine a new query would take past this share of its expected KV
MIN_EDGE_SHARE = 0.05  # routing skips edges with less than this share of the node's flow
PROMPT_TOKENS = 2048  # Helix's MAX_INPUT_LEN: a prompt batch's tokens per prompt it may hold
CONTEXT_PER_DECODE = 1000  # Helix's DECODE_PER_TOKEN_MAX_CONTEXT
HOST_COPY_BYTES_PER_S, HOST_MOVE_BYTES_PER_S = 4e9, 5e9  # concatenation and host-to-device copy, first layer
START_QUERIES, START_GAP_S, FEED_DELAY_S = 20, 0.1, 0.1
SLOW_TOKEN_LINK, SLOW_ACTIVATION_LINK = 10, 200  # bytes/s: Helix's TOKEN_SLOW_LINK and ACT_SLOW_LINK
WARM_UP_S, WINDOW_S = 60.0, 600.0  # Helix's offline window (artifact_evaluation/*/step3_simulation.py)


@dataclass(frozen=True, kw_only=True)
class Hop:
    flow: float  # tokens/s the max flow sends over it (the round robin's weight)
    bw: float  # bytes/s one send uses
    latency_s: float
    token_bytes: float  # one token's bytes on it


@dataclass(frozen=True, kw_only=True)
class ReplayMachine:
    table: EngineTables
    prompt: LayerTable  # one layer's prompt seconds by tokens
    first: int  # its first layer
    layers: int

    @property
    def kv_capacity(self) -> int:  # token-layers
        return BLOCK_TOKENS * self.table.kv_blocks[self.layers] * self.layers


@dataclass(frozen=True, kw_only=True)
class ReplayGraph:
    machines: dict[str, ReplayMachine]
    hops: dict[str, dict[str, Hop]]  # from -> to -> hop, SOURCE and SINK included, in Helix's order
    activation_bytes: float


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    tokens_per_s: float  # decode tokens reaching the coordinator per second of the window
    queries: float  # in flight, mean over the window
    trip_s: float  # a decode request's time from the coordinator back to it, mean over the window
    dropped: int  # queries no route took
    busy: dict[str, float]  # per machine, its busy share of the window
    batches: dict[str, tuple[float, float]]  # per machine, (batches started per second, mean decodes in one)


class _Query:
    __slots__ = ("prompt", "output", "made", "path")

    def __init__(self, prompt: int, output: int):
        self.prompt, self.output, self.made, self.path = prompt, output, 0, []  # path: SOURCE, machines, SINK


class _Request:
    __slots__ = ("query", "tokens", "is_prompt", "at", "issued")

    def __init__(self, query: _Query, is_prompt: bool, issued: float):
        self.query, self.is_prompt, self.at, self.issued = query, is_prompt, 0, issued
        self.tokens = query.prompt if is_prompt else 1


class _Machine:
    __slots__ = ("spec", "queue", "busy", "host_tokens", "kv_free", "busy_s", "batches", "decodes")

    def __init__(self, spec: ReplayMachine):
        self.spec, self.queue, self.busy, self.host_tokens = spec, deque(), False, 0
        self.kv_free = spec.kv_capacity  # expected KV entries left (token-layers), as Helix's scheduler keeps them
        self.busy_s, self.batches, self.decodes = 0.0, 0, 0  # over the window


def replay(
    graph: ReplayGraph,
    lengths: Lengths | tuple[float, float],
    warm_up_s: float = WARM_UP_S,
    window_s: float = WINDOW_S,
    seed: int = 0,
) -> ReplayResult:
    """Decode tokens/s of the layout of `graph` under Helix's offline engine (module docstring);
    `lengths`: Helix's trace, or the mean prompt and output tokens."""
    if not window_s > 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    return _Run(graph, lengths, warm_up_s, warm_up_s + window_s, seed).result()


class _Run:
    """One replay: the event queue and the state of every machine, link and query."""

    def __init__(self, graph: ReplayGraph, lengths: Lengths | tuple[float, float], start: float, end: float, seed: int):
        self.graph, self.start, self.end = graph, start, end
        self.rng = random.Random(seed)  # as Helix's feeder: random.seed(0), then randint per query
        self.lengths = lengths
        if not isinstance(lengths, Lengths):  # uniform draws: their bounds, checked before the first
            self.bounds = [_uniform_bounds(m, cap) for m, cap in zip(lengths, (PROMPT_TOKENS, 10**6))]
        self.machines = {name: _Machine(spec) for name, spec in graph.machines.items()}
        self.layer_total: dict[int, float] = {}  # each layer's KV entries over its machines, as Helix sums them
        for spec in graph.machines.values():
            for layer in range(spec.first, spec.first + spec.layers):
                self.layer_total[layer] = self.layer_total.get(layer, 0) + spec.kv_capacity / spec.layers
        self.loads = {node: dict.fromkeys(out, 0.0) for node, out in graph.hops.items()}
        self.free_at: dict[tuple[str, str], float] = {}  # when each link has sent what it was given
        self.events: list = []
        self.seq = 0
        self.now = 0.0
        self.tokens, self.dropped, self.in_flight, self.area, self.trip_sum = 0, 0, 0, 0.0, 0.0

    def result(self) -> ReplayResult:
        for i in range(START_QUERIES):  # Helix draws the opening queries' lengths before any other
            self._at(i * START_GAP_S, self._new_query, self._draw())
        while self.events and self.events[0][0] < self.end:  # Helix's simulate(until) stops before `until`
            when, _, action, args = heapq.heappop(self.events)
            self._advance(when)
            action(*args)
        self._advance(self.end)
        window = self.end - self.start
        trip = self.trip_sum / self.tokens if self.tokens else float("inf")
        return ReplayResult(
            tokens_per_s=self.tokens / window,
            queries=self.area / window,
            trip_s=trip,
            dropped=self.dropped,
            busy={name: m.busy_s / window for name, m in self.machines.items()},
            batches={name: (m.batches / window, m.decodes / max(1, m.batches)) for name, m in self.machines.items()},
        )

    def _advance(self, when: float) -> None:
        if when > self.start:
            self.area += self.in_flight * (when - max(self.now, self.start))
        self.now = when

    def _at(self, when: float, action, *args) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, action, args))

    # queries and the coordinator

    def _draw(self) -> tuple[int, int]:
        if isinstance(self.lengths, Lengths):
            pick = self.rng.randint(0, len(self.lengths.prompts) - 1)
            return self.lengths.prompts[pick], self.lengths.outputs[pick]
        (p_lo, p_hi), (o_lo, o_hi) = self.bounds
        return self.rng.randint(p_lo, p_hi), self.rng.randint(o_lo, o_hi)

    def _new_query(self, lengths: tuple[int, int] | None = None) -> None:
        query = _Query(*(lengths or self._draw()))
        if not self._route(query):
            self.dropped += 1
            return
        self.in_flight += 1
        self._issue(_Request(query, True, self.now))

    def _issue(self, request: _Request) -> None:
        path = request.query.path
        if not request.is_prompt:  # a decode adds its token to the round robin's loads on its route
            for a, b in zip(path, path[1:]):
                self.loads[a][b] += 1 / self.graph.hops[a][b].flow
        self._queue_send(SOURCE, request)

    def _at_sink(self, request: _Request) -> None:
        query = request.query
        if request.is_prompt:
            self._issue(_Request(query, False, self.now))
            self._feed()
            return
        query.made += 1
        if self.start <= self.now <= self.end:
            self.tokens += 1
            self.trip_sum += self.now - request.issued
        if query.made < query.output:
            self._issue(_Request(query, False, self.now))
        else:
            self._finish(query)

    def _finish(self, query: _Query) -> None:
        self.in_flight -= 1
        for node in query.path[1:-1]:
            machine = self.machines[node]
            machine.kv_free += _expected_kv(query.prompt) * machine.spec.layers
        self._feed()

    def _feed(self) -> None:
        """Helix's offline feeder: one more query while the fullest layer (its expected KV use summed
        over the machines holding it, against their capacity) is at most FEED_HWM full."""
        if self._fullest_layer() <= FEED_HWM:
            self._at(self.now + FEED_DELAY_S, self._new_query)

    def _fullest_layer(self) -> float:
        """Helix's bottleneck_usage, in its arithmetic: 1 - free / total of each layer, its machines'
        entries per layer summed."""
        free = {}
        for machine in self.machines.values():
            spec = machine.spec
            for layer in range(spec.first, spec.first + spec.layers):
                free[layer] = free.get(layer, 0) + machine.kv_free / spec.layers
        return max(1 - free[layer] / total for layer, total in self.layer_total.items())

    # routing

    def _route(self, query: _Query) -> bool:
        """The query's route by interleaved weighted round robin, or False (loads restored) when
        some node has no edge it may take."""
        node, chosen = SOURCE, []
        while node != SINK:
            nxt = self._choose(node, query)
            if nxt is None:
                for a, b in chosen:
                    self.loads[a][b] -= query.prompt / self.graph.hops[a][b].flow
                return False
            chosen.append((node, nxt))
            node = nxt
        query.path = [SOURCE, *(b for _, b in chosen)]
        for name in query.path[1:-1]:
            machine = self.machines[name]
            machine.kv_free -= _expected_kv(query.prompt) * machine.spec.layers
        return True

    def _choose(self, node: str, query: _Query) -> str | None:
        hops, loads = self.graph.hops[node], self.loads[node]
        total = sum(h.flow for h in hops.values())
        best, best_load = None, float("inf")
        for nxt, hop in hops.items():
            if hop.flow <= 0 or hop.flow < MIN_EDGE_SHARE * total or not self._may_take(nxt, query):
                continue
            after = loads[nxt] + query.prompt / hop.flow
            if after < best_load:
                best, best_load = nxt, after
        if best is not None:
            loads[best] = best_load
            slowest = SLOW_TOKEN_LINK if SOURCE == node or SINK == best else SLOW_ACTIVATION_LINK
            if hops[best].bw <= slowest:
                raise HelixError(
                    f"the hop {node} -> {best} gets {hops[best].bw:g} bytes/s (its link, or its ends' NICs times its "
                    f"share of their flow), at most the {slowest} that Helix's scheduler refuses"
                )
        return best

    def _may_take(self, node: str, query: _Query) -> bool:
        if node == SINK:
            return True
        machine = self.machines[node]
        limit = machine.spec.table.prompt_limit(machine.spec.layers)
        if query.prompt > limit * PROMPT_TOKENS:
            return False
        spec = machine.spec  # Helix's check_can_add, in its arithmetic
        return machine.kv_free - _expected_kv(query.prompt) * spec.layers >= (1 - ROUTE_HWM) * spec.kv_capacity

    # links

    def _queue_send(self, node: str, request: _Request) -> None:
        """Send on the hop to the request's next node: the link takes its requests one after another,
        each once the previous one's bytes are out; it arrives a latency after its own are. Times are
        computed in Helix's order of operations, so that requests meeting a machine's end of batch at
        the same instant are ordered as in its simulator (its events at one time run in the order they
        were made)."""
        nxt = request.query.path[request.at + 1]
        hop = self.graph.hops[node][nxt]
        start = max(self.now, self.free_at.get((node, nxt), 0.0))
        duration = hop.latency_s + request.tokens * hop.token_bytes / hop.bw
        sent = start + duration - hop.latency_s
        self.free_at[(node, nxt)] = sent
        self._at(sent + hop.latency_s, self._arrive, nxt, request)

    def _arrive(self, node: str, request: _Request) -> None:
        request.at += 1
        if node == SINK:
            self._at_sink(request)
            return
        machine = self.machines[node]
        machine.queue.append(request)
        machine.host_tokens += request.tokens
        if not machine.busy:  # as Helix, the machine starts in an event of its own at this time
            self._at(self.now, self._start, node)

    # machines

    def _start(self, node: str) -> None:
        machine = self.machines[node]
        if machine.busy or not machine.queue:
            return
        batch = _take_batch(machine)
        if not batch:  # one request alone is past the machine's limits: Helix's simulator stops here too
            spec = machine.spec
            raise HelixError(
                f"{spec.table.name} with {spec.layers} layers: a request waiting at {node} is past its batch limits "
                f"alone (prompt: {spec.table.prompt_limit(spec.layers)} x {PROMPT_TOKENS} tokens; decode: "
                f"{spec.table.decode_limit[spec.layers]} x {CONTEXT_PER_DECODE} tokens of context), where Helix's "
                "simulator stops too"
            )
        host = machine.host_tokens * self.graph.activation_bytes
        end = _batch_end(machine.spec, batch, self.now, host)
        machine.host_tokens, machine.busy = 0, True
        if self.start <= self.now < self.end:
            machine.busy_s += min(end - self.now, self.end - self.now)
            machine.batches += 1
            machine.decodes += sum(1 for r in batch if not r.is_prompt)
        self._at(end, self._done, node, batch)

    def _done(self, node: str, batch: list[_Request]) -> None:
        self.machines[node].busy = False
        for request in batch:
            self._queue_send(node, request)
        self._at(self.now, self._start, node)


def _take_batch(machine: _Machine) -> list[_Request]:
    """What waits at the machine's first layer, in FIFO order, within its prompt and decode limits."""
    spec = machine.spec
    prompt_limit, decode_limit = spec.table.prompt_limit(spec.layers), spec.table.decode_limit[spec.layers]
    prompts = prompt_tokens = decodes = context = 0
    batch, left = [], deque()
    for request in machine.queue:
        query = request.query
        if request.is_prompt:
            fits = prompts + 1 <= prompt_limit and prompt_tokens + request.tokens <= prompt_limit * PROMPT_TOKENS
            if fits:
                prompts, prompt_tokens = prompts + 1, prompt_tokens + request.tokens
        else:
            seen = query.prompt + query.made
            fits = decodes + 1 <= decode_limit and context + seen <= decode_limit * CONTEXT_PER_DECODE
            if fits:
                decodes, context = decodes + 1, context + seen
        (batch if fits else left).append(request)
    machine.queue = left
    return batch


def _batch_end(spec: ReplayMachine, batch: list[_Request], start: float, host_bytes: float) -> float:
    """When a batch started at `start` leaves the machine's last layer: layer after layer, each
    prompt(P) + decode(D) (Helix's ModelLayer: a lone decode twice), the first with the host's copy
    of `host_bytes`, added one layer at a time as Helix's simulator adds them."""
    prompt = sum(r.tokens for r in batch if r.is_prompt)
    decodes = len(batch) - sum(1 for r in batch if r.is_prompt)
    decode_s = _interpolate(spec.table.decode, decodes, f"{spec.table.name}: decode_bs2time.csv")
    if decodes == 1:
        decode_s = decode_s * 2
    layer_s = _interpolate(spec.prompt, prompt, f"{spec.table.name}: prompt_bs2time.csv") + decode_s
    first = layer_s + host_bytes / HOST_COPY_BYTES_PER_S + host_bytes / HOST_MOVE_BYTES_PER_S
    end = start + first
    for _ in range(spec.layers - 1):
        end = end + layer_s
    return end


def _interpolate(table: LayerTable, size: int, what: str) -> float:
    """Helix's linear interpolation between the table's points (an exact point returns its value);
    a size outside them stops the replay, as it stops Helix's simulator."""
    i = bisect.bisect_left(table.sizes, size)
    if i < len(table.sizes) and table.sizes[i] == size:
        return table.seconds[i]
    if i == 0 or i == len(table.sizes):
        raise HelixError(
            f"{what}: a batch of {size} tokens is outside its rows {table.sizes[0]}..{table.sizes[-1]}, "
            "where Helix's simulator stops too (a shorter --prompt-len, or a profile with more rows)"
        )
    (x0, x1), (y0, y1) = table.sizes[i - 1 : i + 1], table.seconds[i - 1 : i + 1]
    return y0 + (y1 - y0) * (size - x0) / (x1 - x0)


def _expected_kv(prompt: int) -> int:
    """Token entries per layer Helix's scheduler expects a query to hold (its prompt + AVG_OUTPUT_LEN)."""
    return int(prompt + EXPECTED_OUTPUT)


def _uniform_bounds(mean: float, cap: int) -> tuple[int, int]:
    """Integer bounds of a uniform draw with this mean, within 1..cap."""
    if not 1 <= mean <= cap:
        raise HelixError(f"a mean of {mean:g} tokens cannot be drawn within 1..{cap:,} (Helix's longest prompt)")
    hi = min(cap, max(1, round(2 * mean - 1)))
    lo = max(1, round(2 * mean) - hi)
    return lo, hi
