"""The iterated local search on a module subproblem's assignment: single tasks move between
devices, each assignment scored by its exact list-scheduled makespan (`ListMakespan`), with
random kicks out of local optima. Its effort is counted in evaluations, not seconds, so that
its result does not depend on the machine's load.
"""

from __future__ import annotations

import heapq
import random

import numpy as np

from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.problem import PlacementProblem

KICK_STRENGTH = 10  # the iterated local search moves 1..KICK_STRENGTH random tasks before each descent
KICK_PATIENCE = 200  # and stops after this many kicks in a row that found nothing better


class ListMakespan:
    """Makespan of an assignment of a one-shard subproblem, list-scheduled exactly as
    schedule.asap_schedule does without device orders (same upward ranks, same choice
    rule), with every cost precomputed: the local search's evaluation function."""

    def __init__(self, sub: PlacementProblem):

        b, num_k = sub.batch_size, sub.num_devices
        self.num_tasks, self.num_devices = sub.num_tasks, num_k
        self.times = task_times(sub, b).tolist()
        comm = sub.comm_fixed + sub.comm_slope * b
        comm[:, np.arange(num_k), np.arange(num_k)] = 0.0
        self.comm = comm.tolist()
        self.succ: list[list[tuple[int, int]]] = [[] for _ in range(sub.num_tasks)]
        for e, (u, v) in enumerate(zip(sub.edge_src.tolist(), sub.edge_dst.tolist())):
            self.succ[u].append((e, v))
        self.indegree = np.bincount(sub.edge_dst, minlength=sub.num_tasks).tolist()
        index = {t.name: i for i, t in enumerate(sub.graph.tasks)}
        self.reverse_topo = [index[name] for name in reversed(sub.graph.topological_order())]

    def __call__(self, a: list[int]) -> float:
        times, comm, succ = self.times, self.comm, self.succ
        rank = [0.0] * self.num_tasks
        for i in self.reverse_topo:
            tail = 0.0
            for e, v in succ[i]:
                tail = max(tail, comm[e][a[i]][a[v]] + rank[v])
            rank[i] = times[i][a[i]] + tail
        pending: list[list[tuple[float, float, int]]] = [[] for _ in range(self.num_devices)]
        avail: list[list[tuple[float, int]]] = [[] for _ in range(self.num_devices)]
        free, ready, waiting = [0.0] * self.num_devices, [0.0] * self.num_tasks, list(self.indegree)
        # what set each task's start: the producer whose data came last, or the task before it on its device
        producer, before, last_on = [-1] * self.num_tasks, [-1] * self.num_tasks, [-1] * self.num_devices
        self.last, self.producer, self.before = -1, producer, before
        for i in range(self.num_tasks):
            if waiting[i] == 0:
                heapq.heappush(pending[a[i]], (0.0, -rank[i], i))
        makespan = 0.0
        while True:
            best, where = None, -1
            for k in range(self.num_devices):
                pend, av = pending[k], avail[k]
                while pend and pend[0][0] <= free[k]:
                    heapq.heappush(av, heapq.heappop(pend)[1:])
                head = (free[k], *av[0]) if av else (pend[0] if pend else None)
                if head is not None and (best is None or head < best):
                    best, where = head, k
            if best is None:
                return makespan
            i = best[2]
            heapq.heappop(avail[where] if avail[where] else pending[where])
            if free[where] > ready[i]:
                before[i] = last_on[where]
            last_on[where] = i
            finish = free[where] = max(free[where], ready[i]) + times[i][where]
            if finish > makespan:
                makespan, self.last = finish, i
            for e, v in succ[i]:
                arrival = finish + comm[e][where][a[v]]
                if arrival > ready[v]:
                    ready[v], producer[v] = arrival, i
                waiting[v] -= 1
                if waiting[v] == 0:
                    heapq.heappush(pending[a[v]], (ready[v], -rank[v], v))

    def critical(self) -> list[int]:
        """The tasks of the last call's critical chain: from the last task to finish back to the
        start, each task's device predecessor where it waited for the device, else the producer
        whose data arrived last: the tasks whose moves are most likely to shorten the schedule."""
        chain, i = [], self.last
        while i >= 0:
            chain.append(i)
            i = self.before[i] if self.before[i] >= 0 else self.producer[i]
        return chain


class _MoveSearch:
    """Moves of one task (a whole colocation group) to another device under the
    subproblem's support and memory rules, scored by the list-scheduled makespan."""

    def __init__(self, sub: PlacementProblem, assign: list[int]):
        self.sub, self.makespan = sub, ListMakespan(sub)
        self.need = sub.memory_need(sub.batch_size)
        member = {i: [i] for i in range(sub.num_tasks)}
        for group in sub.colocate_groups():
            for i in group:
                member[i] = group
        self.units = [member[i] for i in range(sub.num_tasks) if member[i][0] == i]
        self.unit_of = [0] * sub.num_tasks
        for n, unit in enumerate(self.units):
            for i in unit:
                self.unit_of[i] = n
        self.evaluations = 0

    def used(self, assign: list[int]) -> np.ndarray:
        used = np.zeros(self.sub.num_devices)
        np.add.at(used, assign, self.need[np.arange(self.sub.num_tasks), assign])
        return used

    def fits(self, unit: list[int], k: int, used: np.ndarray) -> bool:
        return (
            bool(self.sub.supported[unit, k].all()) and used[k] + self.need[unit, k].sum() <= self.sub.mem_capacity[k]
        )

    def score(self, assign: list[int]) -> float:
        self.evaluations += 1
        return self.makespan(assign)

    def _move(self, assign: list[int], unit: list[int], k: int, used: np.ndarray, value: float) -> float | None:
        """Move `unit` to device k (where it fits) in place: kept, with `used` updated, and its
        makespan returned if that is below `value`; else undone and None."""
        old = assign[unit[0]]
        for m in unit:
            assign[m] = k
        moved = self.score(assign)
        if moved < value * (1 - 1e-12):
            used[old] -= self.need[unit, old].sum()
            used[k] += self.need[unit, k].sum()
            return moved
        for m in unit:
            assign[m] = old
        return None

    def descend(self, assign: list[int], value: float, max_evaluations: int) -> float:
        """First-improvement descent in place; returns the final makespan."""
        return self._descend(assign, value, max_evaluations, lambda: self.units, restart=False)

    def descend_critical(self, assign: list[int], value: float, max_evaluations: int) -> float:
        """`descend` over the units on the critical chain (ListMakespan.critical) only, the chain
        taken again after each improving move; in place, returns the final makespan. The last
        schedule scored must be `assign`'s."""

        def chain() -> list[list[int]]:
            return [self.units[n] for n in dict.fromkeys(self.unit_of[i] for i in self.makespan.critical())]

        return self._descend(assign, value, max_evaluations, chain, restart=True)

    def _descend(self, assign: list[int], value: float, max_evaluations: int, units, *, restart: bool) -> float:
        """Passes over `units()` trying every move of each, until a pass improves nothing or the
        budget is spent; with `restart`, a new pass (a new `units()`) after each improving move."""
        used, improved = self.used(assign), True
        while improved and self.evaluations < max_evaluations:
            improved = False
            for unit in units():
                for k in range(self.sub.num_devices):
                    if self.evaluations >= max_evaluations:
                        break
                    if k != assign[unit[0]] and self.fits(unit, k, used):
                        moved = self._move(assign, unit, k, used, value)
                        if moved is not None:
                            value, improved = moved, True
                            if restart:
                                break
                if (improved and restart) or self.evaluations >= max_evaluations:
                    break
        return value

    def kick(self, assign: list[int], rng: random.Random, strength: int) -> None:
        """Move 1..strength random units to random devices where they fit (in place)."""
        used = self.used(assign)
        for _ in range(rng.randint(1, strength)):
            unit = rng.choice(self.units)
            old = assign[unit[0]]
            options = [k for k in range(self.sub.num_devices) if k != old and self.fits(unit, k, used)]
            if options:
                k = rng.choice(options)
                for m in unit:
                    assign[m] = k
                used[old] -= self.need[unit, old].sum()
                used[k] += self.need[unit, k].sum()


def improve_by_moves(
    sub: PlacementProblem, assign: list[int], max_evaluations: int, *, kicks: bool = False, seed: int = 0
) -> list[int]:
    """Local search from `assign`: first-improvement descent over one-task (colocation
    group) moves while the list-scheduled makespan drops and memory fits; with `kicks`,
    an iterated local search that then perturbs the best assignment (1 to KICK_STRENGTH random moves),
    descends again over the moves of the tasks on the critical chain only (`descend_critical`: a
    few tasks instead of all, so many more kicks fit in the budget) and keeps the result when it
    is better, until `max_evaluations`
    schedules are spent or KICK_PATIENCE kicks in a row found nothing better (seeded:
    the same input gives the same output). Returns the
    best assignment found; it fits wherever the start fits."""
    search = _MoveSearch(sub, assign)
    best = list(assign)
    value = search.descend(best, search.score(best), max_evaluations)
    rng = random.Random(seed)
    idle = 0
    while kicks and search.evaluations < max_evaluations and search.units and idle < KICK_PATIENCE:
        trial = list(best)
        search.kick(trial, rng, KICK_STRENGTH)
        tried = search.descend_critical(trial, search.score(trial), max_evaluations)
        idle += 1
        if tried < value * (1 - 1e-12):
            best, value, idle = trial, tried, 0
    return best
