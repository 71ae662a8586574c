"""One replica: a pipeline of stages, its layer split, concurrency and micro-batches in flight.

A replica of p stages holds C sequences in flight, cut into m micro-batches (sizes differ by
at most one). Every iteration each micro-batch passes once through every stage and each of
its sequences gains one output token, so a sequence's time per output token (TPOT) is the
replica's cycle:

    round trip   R = sum_s t_s(b_max) + sum of hand-offs s -> s+1 (b_max) + return p -> 1 (b_max)
    busy period  B_s = sum_j t_s(b_j)                     (stage s runs every micro-batch once)
    TPOT = cycle = max(R, max_s B_s),        tokens/s = C / cycle

(the GPipe/1F1B steady state: a micro-batch cannot come back sooner than its round trip, and
no stage can serve its m micro-batches in less than their sum). t_s is the stage's iteration
time (llm_planner.serving.costs), hand-offs are latency + bytes / bandwidth of the link between
the two stages (llm_planner.cost.roofline.transfer_s; inside a server: the class's link, which
ClusterSpec.link chose; otherwise the link between the two servers' regions,
llm_planner.serving.links),
and the sampled token goes back from the last stage to the first every iteration. Memory on
each stage holds the KV cache of all C sequences at their full context.

The engine's per-iteration token budget B (ServingTasks.token_budget) must hold a micro-batch's
decodes and their steady prompt share, b (1 + E[P]/E[O]) <= B. A new request's prompt of E[P]
tokens goes in chunks of c = min(E[P], B - b) tokens, one per visit of its micro-batch, each visit
a round trip R_c with the chunk in the iteration (llm_planner.serving.costs.StageCosts.stage_load_s):

    TTFT = (ceil(E[P] / c) - 1) * max(cycle, R_c) + R_c

An engine without chunked prefill (scored by `llm-planner score --no-chunked-prefill`, never
planned for) runs the prompt whole, c = E[P], in an iteration with no decodes beside it.

For fixed stages, tokens/s = C / cycle(C) grows with C (cycle is a maximum of affine functions
with non-negative intercepts) and feasibility (memory, TPOT) only shrinks as C grows, so the
best concurrency is the largest feasible one, found by bisection; the layer split is chosen
for each C by `split_layers`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_planner.core.spec import LinkSpec
from llm_planner.cost.chunks import next_visit_s, prompt_wait_s
from llm_planner.cost.dp_attention import DEEPEP_MAX_RANK_DECODES
from llm_planner.cost.roofline import transfer_s
from llm_planner.serving.classes import is_dp
from llm_planner.serving.costs import StageCosts
from llm_planner.serving.tasks import ServingTasks

MAX_CONCURRENCY = 1 << 20
GRID_RATIO = 1.25  # concurrencies tried for their split: m, 1.25 m, ... up to the largest feasible


@dataclass(frozen=True, kw_only=True)
class StageSlot:
    """A stage before its layers are chosen: where it runs and what links follow it."""

    costs: StageCosts
    link_next: LinkSpec | None  # to the next stage (the last: back to the first; None: same device)


@dataclass(frozen=True, kw_only=True)
class ReplicaEval:
    """A replica's chosen operating point and everything the plan file reports about it."""

    layers: tuple[int, ...]
    concurrency: int
    micro_batches: int
    tpot_s: float
    round_trip_s: float
    tokens_per_s: float
    ttft_s: float
    stage_s: tuple[float, ...]  # one iteration of the largest micro-batch
    mem_bytes: tuple[float, ...]  # per device of each stage


def micro_batch_sizes(concurrency: int, m: int) -> list[int]:
    q, r = divmod(concurrency, m)
    return [q + (j < r) for j in range(m)]


class ReplicaModel:
    """Evaluates one replica layout (stage slots in pipeline order) at any C, m and split."""

    def __init__(
        self,
        tasks: ServingTasks,
        slots: list[StageSlot],
        tpot_slo_s: float,
        ttft_slo_s: float | None,
        mean_output_len: float,
        sequences_within_budget: bool = False,
    ):
        self.tasks, self.slots, self.tpot_slo_s, self.ttft_slo_s = tasks, slots, tpot_slo_s, ttft_slo_s
        self.mean_output_len = mean_output_len
        # the engine takes no more sequences than its token budget (vLLM: --max-num-seqs at most
        # --max-num-batched-tokens, each per rank with data-parallel attention): the whole
        # concurrency within it, not only a micro-batch's (plan --exportable vllm)
        self.sequences_within_budget = sequences_within_budget
        self.p = len(slots)
        self.ends = [(s == 0, s == self.p - 1) for s in range(self.p)]
        self._times: dict[tuple[int, int, int, bool, bool], float] = {}
        self._handoffs: dict[int, float] = {}
        self._chunk_times: dict[tuple, float] = {}
        self._iterations: dict[tuple, float] = {}
        self._alike = [(id(slot.costs), *ends) for slot, ends in zip(slots, self.ends)]  # stages timed alike

    def _stage_s(self, s: int, b: int, layers: int) -> float:
        """slot s's iteration time (memoised: the searches ask for the same few values often)."""
        first, last = self.ends[s]
        costs = self.slots[s].costs
        key = (id(costs), b, layers, first, last)
        value = self._times.get(key)
        if value is None:
            value = self._times[key] = costs.stage_s(b, layers, first, last)
        return value

    def _block_s(self, s: int, b: int) -> float:
        return self._stage_s(s, b, 1) - self._stage_s(s, b, 0) if b > 0 else 0.0

    # -- timing -------------------------------------------------------------------
    def handoffs_s(self, b: int) -> float:
        total = self._handoffs.get(b)
        if total is None:
            total = 0.0
            for s, slot in enumerate(self.slots):
                last = s == self.p - 1
                per_seq = self.tasks.return_bytes_per_seq if last else self.tasks.handoff_bytes_per_seq
                total += transfer_s(slot.link_next, b * per_seq)
            self._handoffs[b] = total
        return total

    def _busy_s(self, s: int, layers: int, concurrency: int, m: int) -> float:
        """Stage s's busy period: each of the m micro-batches (sizes q + 1 and q) once."""
        q, big = divmod(concurrency, m)
        return big * self._stage_s(s, q + 1, layers) + (m - big) * self._stage_s(s, q, layers)

    def cycle_s(self, layers: tuple[int, ...], concurrency: int, m: int) -> float:
        """The replica's TPOT (module docstring), without the rest of `evaluate`; stages alike
        (same costs, ends and layers) are timed once."""
        b = -(-concurrency // m)
        trip, busy, seen = self.handoffs_s(b), 0.0, {}
        for s, n in enumerate(layers):
            key = (self._alike[s], n)
            got = seen.get(key)
            if got is None:
                got = seen[key] = (self._stage_s(s, b, n), self._busy_s(s, n, concurrency, m))
            trip += got[0]
            busy = max(busy, got[1])
        return max(trip, busy)

    def evaluate(self, layers: tuple[int, ...], concurrency: int, m: int) -> ReplicaEval:
        b = -(-concurrency // m)
        stage = [self._stage_s(s, b, n) for s, n in enumerate(layers)]
        busy = [self._busy_s(s, n, concurrency, m) for s, n in enumerate(layers)]
        round_trip = sum(stage) + self.handoffs_s(b)
        cycle = max(round_trip, max(busy))
        mem = tuple(
            slot.costs.mem_bytes(
                layers=n, first=self.ends[s][0], last=self.ends[s][1], concurrency=concurrency, micro_batch=b
            )
            for s, (slot, n) in enumerate(zip(self.slots, layers))
        )
        ttft = self.ttft_s(layers, b, (cycle, round_trip), concurrency)
        return ReplicaEval(
            layers=tuple(layers),
            concurrency=concurrency,
            micro_batches=m,
            tpot_s=cycle,
            round_trip_s=round_trip,
            tokens_per_s=concurrency / cycle,
            ttft_s=ttft,
            stage_s=tuple(stage),
            mem_bytes=mem,
        )

    def ttft_s(self, layers: tuple[int, ...], b: int, times: tuple[float, float], concurrency: int) -> float:
        """Time to first token of a mean prompt joining a micro-batch of b sequences (module
        docstring), `times` the steady state's (cycle, round trip): its prompt goes in chunks of what
        the token budget leaves beside the b decodes, one chunk per visit of its micro-batch; each
        visit's iterations last at least the steady state's (which carry the other sequences' prompt
        chunks too), the last one's round trip yields the token; before that it waits for the prompts
        of the b - 1 others ahead of it (cost.chunks.prompt_wait_s) and, with other sequences in
        flight, for its micro-batch's next visit (half a cycle on average: the engine is mid-cycle
        when a request arrives). Through a group with data-parallel attention the prompt is one
        rank's, whose budget is a k-th of the group's: its chunks are a k-th as large."""
        cycle, round_trip = times
        prompt = self.tasks.mean_prompt_len
        chunked = self.tasks.chunked_prefill  # else: the prompt whole, in an iteration of its own
        ranks = max((slot.costs.degree for slot in self.slots if is_dp(slot.costs.attention)), default=1)
        chunk = min(prompt, max(1, (self.tasks.token_budget - b) / ranks)) if chunked else prompt
        beside = b if chunked else 0  # decodes in the prompt's iterations
        visits = math.ceil(prompt / chunk)
        trip = self.handoffs_s(b) + sum(self._chunk_stage_s(s, beside, chunk, n) for s, n in enumerate(layers))
        plain = self.handoffs_s(b) + sum(self._chunk_stage_s(s, beside, 0.0, n) for s, n in enumerate(layers))
        service = next_visit_s(cycle, concurrency) + (visits - 1) * max(cycle, trip) + max(round_trip, trip)
        output_len = prompt / self.tasks.prefill_per_output if self.tasks.prefill_per_output > 0 else 0.0
        return service + prompt_wait_s(b - 1, visits * (trip - plain), service + output_len * cycle)

    def _chunk_stage_s(self, s: int, b: int, chunk: float, layers: int) -> float:
        """slot s's iteration with a prompt chunk beside b decodes (memoised like _stage_s)."""
        key = (self._alike[s], b, chunk, layers)
        value = self._chunk_times.get(key)
        if value is None:
            value = self._chunk_times[key] = self.slots[s].costs.stage_load_s(b, chunk, layers, *self.ends[s])
        return value

    def decode_step_s(self, layers: tuple[int, ...], concurrency: int, m: int) -> float:
        """The replica's cycle with no prompt work: every micro-batch's sequences decode one token
        at the mean context (step overheads and hand-offs included), the TPOT of pure decoding."""
        sizes = [x for x in micro_batch_sizes(concurrency, m) if x > 0]
        b = max(sizes)
        stage = [self.slots[s].costs.stage_load_s for s in range(self.p)]
        trip = self.handoffs_s(b) + sum(f(b, 0.0, n, *self.ends[s]) for s, (f, n) in enumerate(zip(stage, layers)))
        busy = max(sum(f(x, 0.0, n, *self.ends[s]) for x in sizes) for s, (f, n) in enumerate(zip(stage, layers)))
        return max(trip, busy)

    def iteration_s(self, layers: tuple[int, ...], decodes: int, prompt_tokens: float) -> float:
        """One iteration of one micro-batch through every stage in turn: `decodes` sequences at the
        mean context and `prompt_tokens` prompt tokens (the load llm_planner.serving.closed_loop
        steps through), hand-offs included."""
        key = (tuple(layers), decodes, prompt_tokens)
        value = self._iterations.get(key)
        if value is None:
            stages = zip(self.slots, layers, self.ends)
            trip = sum(slot.costs.stage_load_s(decodes, prompt_tokens, n, *ends) for slot, n, ends in stages)
            value = self._iterations[key] = trip + self.handoffs_s(max(decodes, 1))
        return value

    def within_budget(self, concurrency: int, m: int) -> bool:
        """Whether a micro-batch's decodes and its steady prompt share fit the per-iteration token
        budget (else prompts queue without end: the engine cannot keep C sequences in flight). A
        stage with data-parallel attention runs k schedulers: its busiest rank's ceil(b/k) sequences
        must also fit its ceil(B/k) of the budget, as the export and the runtime give each rank (the
        group's check stays, so the bounds' cap on sequences holds for these layouts too)."""
        b = -(-concurrency // m)
        if any(
            -(-b // s.costs.degree) > DEEPEP_MAX_RANK_DECODES for s in self.slots if s.costs.attention == "dp-deepep"
        ):
            return False  # a rank's decodes past DeepEP's low-latency buffer (cost.dp_attention)
        ranks = {s.costs.degree for s in self.slots if is_dp(s.costs.attention)}
        if self.sequences_within_budget and any(
            -(-concurrency // k) > -(-self.tasks.token_budget // k) for k in (ranks or {1})
        ):
            return False
        return all(self._rank_within_budget(b, k) for k in {1, *ranks})

    def _rank_within_budget(self, b: int, k: int) -> bool:
        """Whether one of k schedulers sharing b sequences and the budget evenly keeps its busiest share."""
        seqs, budget = -(-b // k), -(-self.tasks.token_budget // k)
        if not self.tasks.chunked_prefill:  # decodes and whole prompts in iterations of their own
            return seqs <= budget
        return seqs * (1 + self.tasks.prefill_per_output) <= budget

    # -- choices ------------------------------------------------------------------
    def caps(self, concurrency: int, m: int) -> list[int]:
        """The most layers each stage holds with `concurrency` sequences in flight."""
        b = -(-concurrency // m)
        out, seen = [], {}
        for slot, ends in zip(self.slots, self.ends):
            key = (id(slot.costs), ends)
            if key not in seen:
                seen[key] = slot.costs.max_layers(first=ends[0], last=ends[1], concurrency=concurrency, micro_batch=b)
            out.append(seen[key])
        return out

    def split_layers(self, concurrency: int, m: int, fixed: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
        """A layer split with the smallest cycle found, within memory; None when none fits.

        With X a bound on every stage's busy period, stage s may hold u_s(X) layers (memory and
        X); the split minimising the round trip under X fills the stages with the cheapest
        layers first. The cycle is max(round trip, X); X is swept from the smallest feasible
        value up to where the round trip stops improving. Identical stages (same costs and
        ends) are handled as one group whose stages differ by at most one layer."""
        caps = self.caps(concurrency, m)
        if fixed is not None:
            return fixed if all(1 <= n <= c for n, c in zip(fixed, caps)) else None
        L = self.tasks.num_layers
        if min(caps) < 1 or sum(caps) < L or self.p > L:
            return None
        groups = self._groups(concurrency, m, caps)
        order = sorted(range(len(groups)), key=lambda g: groups[g][3])

        def fill(x: float) -> list[int] | None:
            up = []
            for _members, cap, fp, _, pp, _ in groups:
                u = min(cap, int((x - fp) / pp + 1e-9)) if pp > 0 else cap
                if u < 1:
                    return None
                up.append(u)
            if sum(u * len(g[0]) for u, g in zip(up, groups)) < L:
                return None
            total = [len(g[0]) for g in groups]  # layers of each group: one per stage to start
            left = L - sum(total)
            for g in order:
                add = min(left, (up[g] - 1) * len(groups[g][0]))
                total[g] += add
                left -= add
            return total

        def cycle(total: list[int]) -> float:
            trip, busy = 0.0, 0.0
            for (members, _, fp, pb, pp, fb), t in zip(groups, total):
                top = -(-t // len(members))
                trip += len(members) * fb + t * pb
                busy = max(busy, fp + top * pp)
            return max(trip, busy)

        lo = max(g[2] + g[4] for g in groups)
        hi = max(g[2] + min(g[1], L) * g[4] for g in groups)
        if fill(lo) is None:
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if fill(mid) is not None else (mid, hi)
                if hi - lo <= 1e-4 * hi:
                    break
            lo = hi
        best = fill(lo)
        best_c = cycle(best)
        for x in _sweep(lo, max(hi, best_c)):
            cand = fill(x)
            if cand is not None and (c := cycle(cand)) < best_c:
                best, best_c = cand, c
        out = [0] * self.p
        for (members, *_), t in zip(groups, best):
            base, extra = divmod(t, len(members))
            for i, s in enumerate(members):
                out[s] = base + (i < extra)
        return tuple(out)

    def _groups(self, concurrency: int, m: int, caps: list[int]) -> list[tuple]:
        """(stages, cap, busy fixed, round-trip per layer, busy per layer, round-trip fixed) per group
        of identical stages."""
        sizes = micro_batch_sizes(concurrency, m)
        b, distinct = sizes[0], sorted(set(sizes))
        keyed: dict[tuple, list[int]] = {}
        for s in range(self.p):
            keyed.setdefault((id(self.slots[s].costs), *self.ends[s], caps[s]), []).append(s)
        out = []
        for (_, _, _, cap), members in keyed.items():
            s = members[0]
            fp = sum(self._stage_s(s, x, 0) * sizes.count(x) for x in distinct)
            pp = sum(self._block_s(s, x) * sizes.count(x) for x in distinct)
            out.append((members, cap, fp, self._block_s(s, b), pp, self._stage_s(s, b, 0)))
        return out

    def feasible(self, concurrency: int, m: int, fixed: tuple[int, ...] | None = None) -> ReplicaEval | None:
        if concurrency < m or not self.within_budget(concurrency, m):
            return None
        split = self.split_layers(concurrency, m, fixed)
        if split is None:
            return None
        ev = self.evaluate(split, concurrency, m)
        return ev if ev.tpot_s <= self.tpot_slo_s * (1 + 1e-12) else None

    def best_at(self, m: int, fixed: tuple[int, ...] | None = None) -> ReplicaEval | None:
        """The best operating point found with m micro-batches, then the TTFT target.

        For one split, tokens/s grows with C up to the largest C it meets (`_max_concurrency`).
        Across splits it need not: a larger C may only fit with layers moved to a slower stage.
        So the search tries the split `split_layers` picks at a geometric grid of C (m, 1.25 m,
        ...), pushes each split to its own largest C, and keeps the best; the grid stops at the
        first C no split meets (a split that fits C fits every smaller C)."""
        ev = self.feasible(m, m, fixed)
        if ev is None:
            return None
        best = ev = self._max_concurrency(ev, m)
        if fixed is not None:
            return self._meet_ttft(best, m, fixed)
        seen = {ev.layers}
        c = float(ev.concurrency + 1)
        while c <= MAX_CONCURRENCY:
            cand = self.feasible(int(c), m)
            if cand is None:
                break
            if cand.layers not in seen:
                seen.add(cand.layers)
                cand = self._max_concurrency(cand, m)
                best = cand if cand.tokens_per_s > best.tokens_per_s else best
            c = max(c + 1, c * GRID_RATIO)
        return self._meet_ttft(best, m, fixed)

    def _fits(self, layers: tuple[int, ...], concurrency: int, m: int) -> bool:
        if concurrency < m or not self.within_budget(concurrency, m):
            return False
        if any(n > c for n, c in zip(layers, self.caps(concurrency, m))):
            return False
        return self.cycle_s(layers, concurrency, m) <= self.tpot_slo_s * (1 + 1e-12)

    def _max_concurrency(self, ev: ReplicaEval, m: int) -> ReplicaEval:
        """The largest C at which ev's split still meets memory and the target (C only ever helps)."""
        lo, hi = ev.concurrency, 2 * ev.concurrency
        while hi <= MAX_CONCURRENCY and self._fits(ev.layers, hi, m):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._fits(ev.layers, mid, m) else (lo, mid)
        return ev if lo == ev.concurrency else self.evaluate(ev.layers, lo, m)

    def _meet_ttft(self, ev: ReplicaEval, m: int, fixed) -> ReplicaEval | None:
        if self.ttft_slo_s is None or ev.ttft_s <= self.ttft_slo_s:
            return ev
        c = ev.concurrency
        while c > m:
            c = max(m, int(c * 0.9))
            cand = self.feasible(c, m, fixed)
            if cand is not None and cand.ttft_s <= self.ttft_slo_s:
                return cand
        return None

    def best(
        self, micro_batches: list[int] | None = None, fixed: tuple[int, ...] | None = None, refine: bool = False
    ) -> ReplicaEval | None:
        """The best operating point over the given micro-batch counts (default 1, p/2, p). With
        `refine`, every count between the smallest and the largest given may be chosen: the best
        of those tried is improved by a descent over m (steps halving from a quarter of the range
        down to 1). Tokens/s is not unimodal in m (a count that divides C evenly may win), so the
        descent is a search, not a proof."""
        options = micro_batches or sorted({1, max(1, self.p // 2), self.p})
        tried = {m: self.best_at(m, fixed) for m in options}
        if refine:
            self._refine_micro_batches(tried, min(options), max(options), fixed)
        evals = [e for e in tried.values() if e is not None]
        return max(evals, key=lambda e: e.tokens_per_s, default=None)

    def _refine_micro_batches(self, tried: dict, lo: int, hi: int, fixed) -> None:
        def value(m: int) -> float:
            if m not in tried:
                tried[m] = self.best_at(m, fixed)
            return tried[m].tokens_per_s if tried[m] is not None else 0.0

        cur = max(tried, key=value)
        step = max(1, (hi - lo) // 4)
        while step >= 1:
            moved = False
            for m in (cur - step, cur + step):
                if lo <= m <= hi and value(m) > value(cur):
                    cur, moved = m, True
                    break
            if not moved:
                step //= 2


def _sweep(lo: float, hi: float, steps: int = 8):
    if hi <= lo:
        return []
    return [lo + (hi - lo) * i / steps for i in range(1, steps + 1)]
