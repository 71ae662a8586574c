"""Throughput plans improved by moving tasks between devices (MILP-SPLIT, throughput objective).

The stage DP of split.throughput keeps every module whole on one contiguous stage,
while the exact MILP may put any task anywhere: on a three-stage RWNN over a CPU,
an A100 and a T4 the DP can only hand out whole stages. This search starts from a
plan and moves one task at a time (a colocation group as a whole) to the device
that lowers the bottleneck load, or that keeps it and lowers the sum of squared
loads (which spreads work off the bottleneck and opens later moves), as long as
the device can run the task and has the memory for it (of every batch the plan keeps in
flight: problem.fit).

A move's effect is computed from what depends on where the moved tasks sit: their
own times and the transfer charges of the problem's throughput model
(docs/objectives.md) on their edges (direct) or on their outputs and their
predecessors' outputs (host-staged), so one evaluation costs the moved tasks'
degree times K, not a pass over the graph. Plans of several shards are searched
shard by shard when the shards use disjoint devices (the data-parallel groups of
split.data_parallel), each shard keeping to the devices no other shard uses; plans
whose shards share devices are left as they are. The effort is capped in move
evaluations (MAX_MOVE_EVALUATIONS), so the result does not depend on the
machine's load. After the descent, an iterated search: 1..KICK_STRENGTH random
groups go to random devices where they fit, the descent runs again, and the
best assignment seen is kept, until KICK_PATIENCE kicks in a row find nothing
better or the budget is spent (seeded, so runs repeat).
"""

from __future__ import annotations

import random

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.fit import fits_steady_state
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.schedule import add_transfer_charges, device_loads, make_plan

MAX_MOVE_EVALUATIONS = 100_000  # (group, device) pairs tried per plan
KICK_STRENGTH = 6  # after the descent: move 1..KICK_STRENGTH random groups to random devices, descend again
KICK_PATIENCE = 60  # and stop after this many kicks in a row that found nothing better
REL = 1e-12
IN_FLIGHT_ATTEMPTS = 2  # searches per start: with the start's batches in flight, then (once) with the result's


class _Shard:
    """One shard's assignment with its loads (plus the other shards' as a fixed background) and memory."""

    def __init__(
        self,
        problem: PlacementProblem,
        batch: int,
        assign: list[int],
        allowed: np.ndarray,
        background: np.ndarray,
        batches: int = 1,
    ):

        p = self.p = problem
        self.b, self.a, self.allowed = batch, list(assign), allowed
        self.times = task_times(p, batch)
        # per-sample memory for `batches` batches in flight (problem.fit)
        self.need = p.memory_need(batch, batches)
        self.used = np.zeros(p.num_devices)
        for i, k in enumerate(self.a):
            self.used[k] += self.need[i, k]
        self.load = background + device_loads(p, [batch], [self.a])
        self.direct = p.throughput_model == "direct"
        self.out_edges, self.in_edges = p.out_edges(), p.in_edges()
        groups = [sorted(g) for g in p.colocate_groups()]
        grouped = {i for g in groups for i in g}
        self.groups = groups + [[i] for i in range(p.num_tasks) if i not in grouped]
        self._touch = [self._touched(g) for g in self.groups]

    def _touched(self, group: list[int]) -> list[int]:
        """Edges (direct) or outputs (host-staged) whose charges depend on the group's device."""
        if self.direct:
            return sorted({e for i in group for e in self.out_edges[i] + self.in_edges[i]})
        preds = {int(self.p.edge_src[e]) for i in group for e in self.in_edges[i]}
        return sorted(set(group) | preds)

    def _part(self, n: int) -> np.ndarray:
        """The loads that depend on where group n sits, under the current assignment."""
        a = self.a
        out = np.zeros(self.p.num_devices)
        for i in self.groups[n]:
            out[a[i]] += self.times[i, a[i]]
        add_transfer_charges(self.p, out, a, self.b, self._touch[n], self.out_edges)
        return out

    def _set(self, n: int, k: int) -> None:
        for i in self.groups[n]:
            self.a[i] = k

    def _others(self, n: int) -> np.ndarray:
        """The devices group n may move to: allowed, able to run all of it, not where it is."""
        group = self.groups[n]
        able = self.allowed & self.p.supported[group].all(axis=0)
        able[self.a[group[0]]] = False
        return np.flatnonzero(able)

    def _fits(self, n: int, k: int) -> bool:
        return self.used[k] + self.need[self.groups[n], k].sum() <= self.p.mem_capacity[k]

    def _place(self, n: int, k: int, load: np.ndarray | None = None) -> None:
        """Move group n to device k, with its memory; `load` is the loads after the move when known."""
        group = self.groups[n]
        k0 = self.a[group[0]]
        rest = self.load - self._part(n) if load is None else None
        self._set(n, k)
        self.load = rest + self._part(n) if load is None else load
        self.used[k0] -= self.need[group, k0].sum()
        self.used[k] += self.need[group, k].sum()

    def descend(self, budget: int) -> int:
        """Best-device moves, group by group, until a pass moves nothing or the budget is spent; returns the
        budget left."""
        moved = True
        while moved and budget > 0:
            moved = False
            for n in range(len(self.groups)):
                options = self._others(n)
                if not len(options):
                    continue
                budget -= len(options)
                k0 = self.a[self.groups[n][0]]
                rest = self.load - self._part(n)
                best, pick = _score(self.load), None
                for k in options:
                    if not self._fits(n, int(k)):
                        continue
                    self._set(n, int(k))
                    load = rest + self._part(n)
                    score = _score(load)
                    if _better(score, best):
                        best, pick = score, (int(k), load)
                self._set(n, k0)
                if pick is not None:
                    self._place(n, *pick)
                    moved = True
                if budget <= 0:
                    break
        return budget


def _score(load: np.ndarray) -> tuple[float, float]:
    """(bottleneck load, sum of squared loads), compared by `_better`."""
    return float(load.max()), float(np.square(load).sum())


def _better(score: tuple[float, float], best: tuple[float, float]) -> bool:
    """A lower bottleneck, or the same one (within REL) and a lower sum of squared loads."""
    return score[0] < best[0] * (1 - REL) or (score[0] <= best[0] * (1 + REL) and score[1] < best[1] * (1 - REL))


def _search(shard: _Shard, budget: int, rng: random.Random) -> int:
    """Descend, then kick and descend again while the budget and the patience last, keeping the best
    assignment found; leaves it in `shard`. Returns the budget left."""
    budget = shard.descend(budget)
    best = (_score(shard.load), list(shard.a), shard.load.copy(), shard.used.copy())
    idle = 0
    while budget > 0 and idle < KICK_PATIENCE:
        for _ in range(rng.randint(1, KICK_STRENGTH)):
            n = rng.randrange(len(shard.groups))
            able = [int(k) for k in shard._others(n) if shard._fits(n, int(k))]
            if able:
                shard._place(n, rng.choice(able))
        budget = shard.descend(budget - 1)
        score = _score(shard.load)
        if _better(score, best[0]):
            best, idle = (score, list(shard.a), shard.load.copy(), shard.used.copy()), 0
        else:
            idle += 1
            shard.a, shard.load, shard.used = list(best[1]), best[2].copy(), best[3].copy()
    shard.a, shard.load, shard.used = best[1], best[2], best[3]
    return budget


def improve_loads(problem: PlacementProblem, plan: Plan, started: float) -> Plan | None:
    """`plan` with tasks moved to lower its bottleneck load (see the module docstring), as a MILP-SPLIT
    plan whose steady state fits (problem.fit); None when its shards share devices, no move helped, or
    no improved plan fits.

    Balancing loads lowers the busiest device's load, so the plan may then need more batches in
    flight: the moves keep the memory of the start's batches in flight (B), and when the result needs
    more and they do not fit, the search runs again from the start with the memory of those (once,
    IN_FLIGHT_ATTEMPTS: the search is MILP-SPLIT's costliest step)."""
    batches = plan.batches_in_flight
    for _ in range(IN_FLIGHT_ATTEMPTS):
        better = _moved(problem, plan, started, batches)
        if better is None or problem.objective != "throughput" or fits_steady_state(problem, better):
            return better
        batches = max(batches + 1, better.batches_in_flight)
    return None


def _moved(problem: PlacementProblem, plan: Plan, started: float, batches: int) -> Plan | None:
    """improve_loads' search, with the per-sample memory of `batches` batches in flight."""
    dev = {name: k for k, name in enumerate(problem.device_names)}
    sizes = list(plan.shard_sizes)
    assigns = [[dev[plan.shard_assignments[s][t.name]] for t in problem.graph.tasks] for s in range(len(sizes))]
    used = [set(a) for a in assigns]
    if any(used[s] & used[r] for s in range(len(sizes)) for r in range(s)):
        return None
    budget = MAX_MOVE_EVALUATIONS
    changed = False
    for s, b in enumerate(sizes):
        if b <= 0:
            continue
        others = [r for r in range(len(sizes)) if r != s and sizes[r] > 0]
        allowed = np.ones(problem.num_devices, dtype=bool)
        for r in others:
            allowed[list(used[r])] = False
        background = (
            device_loads(problem, [sizes[r] for r in others], [assigns[r] for r in others])
            if others
            else np.zeros(problem.num_devices)
        )
        shard = _Shard(problem, b, assigns[s], allowed, background, batches)
        budget = _search(shard, budget, random.Random(s))
        if shard.a != assigns[s]:
            assigns[s], used[s], changed = shard.a, set(shard.a), True
        if budget <= 0:
            break
    if not changed:
        return None
    return make_plan(
        problem, sizes, assigns, solver="milp-split", status="heuristic", started_at=started, lower_bound_s=0.0
    )
