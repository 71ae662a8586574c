"""The best stages for Helix's engine over llm_planner.helix.plan's family, exactly, without
enumerating the family (docs/helix.md, "Planning for Helix's engine").

A layout's estimate (llm_planner.helix.engine) is C / (latency + the sum of its stages' round
times at C), where C, the queries in flight, is set by its fullest stage: C grows with the
integer width x blocks(layers) of the stage, its "room". So for each room r that some stage can
have, the best layout whose smallest room is exactly r minimises a sum over machine types
under two conditions, every stage's room at least r and some stage's exactly r: per type and
number of layers, the cheapest choice (one width, a stage count, layer counts that differ by at
most one) under each condition, then a dynamic program over the types for the split of the
model's layers with a flag for "some stage's room is r". The best over all r is the family's
best layout; `count_layouts` gives the family's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llm_planner.helix.engine import EngineTables, Network, Stage, estimate, room_queries, stage_room, stage_round_s
from llm_planner.helix.rules import stage_fits

INF = math.inf


@dataclass(frozen=True)
class Kind:
    name: str  # machine type, an EngineTables.name
    machines: int
    table: EngineTables


@dataclass(frozen=True)
class _Choice:
    width: int
    count: int  # stages

    def stages(self, kind: str, layers: int) -> tuple[Stage, ...]:
        base, extra = divmod(layers, self.count)
        return tuple(Stage(kind, self.width, base + (i < extra)) for i in range(self.count))


def choices(kind: Kind, layers: int) -> list[_Choice]:
    """A type's ways to cover `layers` layers (none for 0 layers: that is using no machine)."""
    return [
        _Choice(width, count)
        for width in range(1, kind.machines + 1)
        for count in range(1, min(kind.machines // width, layers) + 1)
        if stage_fits(kind.table, math.ceil(layers / count))  # the most layers one of its stages holds
    ]


def best_stages(kinds: list[Kind], num_layers: int, prompt_len: float, network: Network) -> tuple[Stage, ...] | None:
    """The stages of the family's best layout (module docstring); None when none holds the model."""
    tables = {k.name: k.table for k in kinds}
    per_kind = [_TypeChoices(k, num_layers) for k in kinds]
    rooms = sorted({int(r) for options in per_kind for r in options.rooms[1:, 1:-1].flat})
    best, best_value = None, -INF
    for r in rooms:
        stages = _best_at(per_kind, num_layers, r, room_queries(r, prompt_len), network)
        if stages is None:
            continue
        value = estimate(list(stages), tables, prompt_len, network).tokens_per_s
        if value > best_value:
            best, best_value = stages, value
    return best


def _best_at(per_kind: list[_TypeChoices], num_layers: int, r: int, queries: float, network: Network):
    """The cheapest stages whose smallest room is exactly r (`queries` in flight), or None."""
    dp = np.full((2, num_layers + 1), INF)  # [some stage's room is r][layers covered]
    dp[0, 0] = 0.0
    trail = []
    for options in per_kind:
        cost, pick = options.costs(num_layers, r, queries, network)
        dp, back = _combine(dp, cost)
        trail.append((options, pick, back))
    if not math.isfinite(dp[1, num_layers]):
        return None
    return _unwind(trail, num_layers)


class _TypeChoices:
    """Every choice of one type for every layer count, as arrays (built once, priced per room):
    a choice of `count` stages of `width` machines over `layers` layers has `extra` stages of
    `base + 1` layers and the rest of `base`."""

    def __init__(self, kind: Kind, num_layers: int):
        rows = [(n, c.width, c.count) for n in range(1, num_layers + 1) for c in choices(kind, n)]
        self.kind, top = kind, kind.table.max_layers
        self.layers, self.width, self.count = (np.array([r[i] for r in rows], dtype=int) for i in range(3))
        self.base, self.extra = np.divmod(self.layers, self.count)
        # rooms[w, x]: a stage of w machines holding x layers (helix_engine.stage_room); none at x = 0 or top + 1
        none = np.iinfo(int).max
        self.rooms = np.full((kind.machines + 1, top + 2), none)
        for w in range(1, kind.machines + 1):
            for x in range(1, top + 1):
                self.rooms[w, x] = stage_room(Stage(kind.name, w, x), kind.table)
        low = np.where(self.count > self.extra, self.rooms[self.width, self.base], none)
        high = np.where(self.extra > 0, self.rooms[self.width, self.base + 1], none)
        self.min_room = np.minimum(low, high)

    def costs(self, num_layers: int, r: int, queries: float, network: Network):
        """cost[h][n]: the cheapest round time over n layers with every room >= r and (h = 1) some
        room == r; pick[h][n] the choice's index. cost[0][0] = 0: the type unused."""
        kind, top = self.kind, self.kind.table.max_layers
        per = np.zeros((kind.machines + 1, top + 2))  # one stage's round time by width and layers
        for w in range(1, kind.machines + 1):
            for x in range(1, top + 1):
                per[w, x] = stage_round_s(Stage(kind.name, w, x), kind.table, queries, network)
        total = (self.count - self.extra) * per[self.width, self.base] + self.extra * per[self.width, self.base + 1]
        cost = np.full((2, num_layers + 1), INF)
        cost[0, 0] = 0.0
        pick = np.full((2, num_layers + 1), -1)
        for h, ok in enumerate((self.min_room >= r, self.min_room == r)):
            index = np.flatnonzero(ok)
            order = index[np.lexsort((total[index], self.layers[index]))]  # by layers, then cheapest first
            firsts = order[np.unique(self.layers[order], return_index=True)[1]]
            cost[h, self.layers[firsts]], pick[h, self.layers[firsts]] = total[firsts], firsts
        return cost, pick

    def stages(self, index: int) -> tuple[Stage, ...]:
        choice = _Choice(int(self.width[index]), int(self.count[index]))
        return choice.stages(self.kind.name, int(self.layers[index]))


def _combine(dp: np.ndarray, cost: np.ndarray):
    """Add one type: new[f][n] = min over j of dp[f'][n - j] + cost[h][j], with f = f' or h."""
    size = dp.shape[1]
    new = np.full_like(dp, INF)
    back = np.full((2, size, 3), -1, dtype=int)  # (j, f', h)
    for j in range(size):
        for f_prev in (0, 1):
            for h in (0, 1):
                if not math.isfinite(cost[h, j]):
                    continue
                f = f_prev | h
                value = dp[f_prev, : size - j] + cost[h, j]
                better = value < new[f, j:]
                new[f, j:] = np.where(better, value, new[f, j:])
                back[f, j:][better] = (j, f_prev, h)
    return new, back


def _unwind(trail, num_layers: int) -> tuple[Stage, ...]:
    stages, n, f = [], num_layers, 1
    for options, pick, back in reversed(trail):
        j, f_prev, h = (int(x) for x in back[f, n])
        if j > 0:
            stages += options.stages(pick[h, j])
        n, f = n - j, f_prev
    return tuple(stages)


def count_layouts(kinds: list[Kind], num_layers: int) -> int:
    """Layouts in the family: per split of the layers among the types, the product of each
    type's choices (a type with no layers counts once, the rest need a choice)."""
    ways = [1] + [0] * num_layers
    for kind in kinds:
        per = [1] + [len(choices(kind, n)) for n in range(1, num_layers + 1)]
        ways = [sum(ways[n - j] * per[j] for j in range(n + 1)) for n in range(num_layers + 1)]
    return ways[num_layers] - (1 if num_layers == 0 else 0)
