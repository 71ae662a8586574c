"""The most tokens/s a replica of a layout can serve, found cheaply: the layout search's price
check (llm_planner.serving.search) skips a layout this cannot lift above its devices' prices.

A stage of k devices of class c holding l layers does, per device, at most rate_c(k, l)
layer-token passes a second in any plan (llm_planner.serving.bound.stage_rates). A replica
serving T tokens/s passes every token through each stage's l_s layers, so T l_s / k_s <=
rate(k_s, l_s): T <= g_s(l_s) = k_s rate(k_s, l_s) / l_s, for a split with sum_s l_s = L. So T
is at most the largest t at which every stage may hold some l >= 1 layers with g_s(l) >= t and
the stages' largest such l add up to at least L (every l up to the largest is allowed, a
superset, so the value only grows). t is searched over the values g takes. It is never above
the devices' rate bound over L, the check it replaces: T L <= sum_s k_s rate_s.

Second, memory and latency: a replica serves T = C / TPOT with C its sequences in flight and the
TPOT at least its round trip. Every stage keeps the KV cache of all C sequences for its layers, so
C is at most the largest C at which the stages' layer counts (llm_planner.serving.costs.
StageCosts.max_layers, with no embedding or head and a micro-batch of one: the most room) still
add up to L, each at least 1; the round trip is at least every stage's step, every layer at the
least block time of any stage and the least embedding and head times, at a micro-batch of C / p
sequences (p stages: the search runs at most p micro-batches; on a measured block time, of one).
T <= C / trip(C / p), which grows with C on the roofline, so its value at the largest C bounds
it. The value is the smaller of the two: a deep pipeline whose stages keep few sequences each
fails the second.
"""

from __future__ import annotations

import itertools

from llm_planner.serving.bound import stage_rates
from llm_planner.serving.context import ServingContext
from llm_planner.serving.layout import Layout

MAX_SEQUENCES = 1 << 24  # the largest concurrency the memory check tries (more is no bound)


class OptimisticTokens:
    """Per layout, the tokens/s no replica of it exceeds (module docstring); memoised."""

    def __init__(self, ctx: ServingContext):
        self.num_layers, self.cache = ctx.tasks.num_layers, ctx.cache
        self._reach: dict[tuple[str, int, str], list[float]] = {}
        for sc in ctx.classes:
            rates = stage_rates(ctx.cache, sc, ctx.workload.tpot_slo_s)
            for k, attention in sc.shapes:
                g = [k * rates.get((k, attention, n), 0.0) / n for n in range(1, self.num_layers + 1)]
                # reach[l - 1]: the largest g over l layers or more (never rising with l)
                self._reach[(sc.name, k, attention)] = list(itertools.accumulate(reversed(g), max))[::-1]
        self._memo: dict[Layout, float] = {}

    def __call__(self, layout: Layout) -> float:
        got = self._memo.get(layout)
        if got is None:
            got = self._memo[layout] = self._value(layout)
        return got

    def _value(self, layout: Layout) -> float:
        return min(self._rates(layout), self._memory_latency(layout))

    def _rates(self, layout: Layout) -> float:
        stages = [(self._reach[(seg.class_name, seg.degree, seg.attention)], seg.stages) for seg in layout]
        values = sorted({v for reach, _ in stages for v in reach if v > 0})
        best, lo, hi = 0.0, 0, len(values) - 1
        while lo <= hi:  # the held layers only shrink as t grows: the largest t that holds L
            mid = (lo + hi) // 2
            if self._holds(stages, values[mid]):
                best, lo = values[mid], mid + 1
            else:
                hi = mid - 1
        return best

    def _holds(self, stages: list[tuple[list[float], int]], t: float) -> bool:
        total = 0
        for reach, count in stages:
            most = _most_layers(reach, t)
            if most == 0:
                return False
            total += count * most
        return total >= self.num_layers

    def _memory_latency(self, layout: Layout) -> float:
        stages = [(self.cache.of(seg), seg.stages) for seg in layout]
        lo, hi = 0, 1  # lo holds L (0: not even one sequence), hi does not
        while self._keeps(stages, hi):
            if hi >= MAX_SEQUENCES:  # memory does not limit the sequences: no bound from it
                return float("inf")
            lo, hi = hi, 2 * hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._keeps(stages, mid) else (lo, mid)
        if lo == 0:
            return 0.0
        costs = [c for c, _ in stages]
        # the round trip's micro-batch holds at least C / p sequences; on the roofline (pieces
        # f + s b, f >= 0) C / trip(C / p) grows with C, so its value at the largest C bounds all
        b = max(1.0, lo / sum(n for _, n in stages)) if all(map(_roofline, costs)) else 1.0
        trip = sum(n * c.step_s for c, n in stages) + self.num_layers * min(c.layer_time.least(b) for c in costs)
        trip += min(c.first_least_s(b) for c in costs)
        trip += min(c.part_s("final_norm", b) + c.part_s("lm_head", b) for c in costs)
        return lo / trip if trip > 0 else float("inf")

    def _keeps(self, stages: list, concurrency: int) -> bool:
        """Whether the stages hold L layers, each at least one, with `concurrency` sequences in flight."""
        total = 0
        for costs, count in stages:
            most = costs.max_layers(first=False, last=False, concurrency=concurrency, micro_batch=1)
            if most < 1:
                return False
            total += count * min(most, self.num_layers)
        return total >= self.num_layers


def _roofline(costs) -> bool:
    """Whether every part's time is pieces f + s b with f, s >= 0 (no measured block time)."""
    if costs.layer_time.measured:
        return False
    return all(f >= 0 and slope >= 0 for pieces in costs.pieces.values() for f, slope in pieces)


def _most_layers(reach: list[float], t: float) -> int:
    """The most layers l with reach[l - 1] >= t (reach never rises), 0 when none."""
    lo, hi = 0, len(reach)
    while lo < hi:
        mid = (lo + hi) // 2
        if reach[mid] >= t:
            lo = mid + 1
        else:
            hi = mid
    return lo
