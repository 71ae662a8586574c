"""The verifier's own discrete-event simulation of fixed device orders (llm_planner.placement.verify, check 7).

Each device runs its items in the given order, each as soon as the device is
free and every input has arrived (finish of the producer + transfer time);
completion events are handled in time order. Nothing here uses
llm_planner.placement.schedule: the verifier re-derives the schedule on its own.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from llm_planner.placement.problem import PlacementProblem

Item = tuple[int, int]  # (shard, task index)


class EventSimulation:
    """Discrete-event run of fixed device orders: completion events in time order."""

    def __init__(self, problem: PlacementProblem, sizes: list[int], assign: list[np.ndarray], orders: list[list[Item]]):
        self.p, self.sizes, self.assign, self.orders = problem, sizes, assign, orders
        self.in_edges, self.out_edges = problem.in_edges(), problem.out_edges()
        self.waiting = {it: len(self.in_edges[it[1]]) for order in orders for it in order}
        self.arrival = {it: 0.0 for it in self.waiting}  # when the last input is on the device
        self.head = [0] * problem.num_devices  # position of each device's next item
        self.free_at = [0.0] * problem.num_devices
        self.running = [False] * problem.num_devices
        self.events: list[tuple[float, int, Item]] = []
        self.start: dict[Item, float] = {}
        self.finish: dict[Item, float] = {}

    def try_start(self, k: int) -> None:
        if self.running[k] or self.head[k] >= len(self.orders[k]):
            return
        it = self.orders[k][self.head[k]]
        if self.waiting[it]:
            return
        start = self.start[it] = max(self.free_at[k], self.arrival[it])
        end = start + self.p.task_time(it[1], k, self.sizes[it[0]])
        self.running[k] = True
        heapq.heappush(self.events, (end, k, it))

    def run(self, checker) -> float:
        for k in range(self.p.num_devices):
            self.try_start(k)
        while self.events:
            end, k, (s, i) = heapq.heappop(self.events)
            self.finish[(s, i)] = end
            self.running[k], self.free_at[k] = False, end
            self.head[k] += 1
            for e in self.out_edges[i]:
                v = int(self.p.edge_dst[e])
                l = int(self.assign[s][v])
                self.arrival[(s, v)] = max(self.arrival[(s, v)], end + self.p.transfer_time(e, k, l, self.sizes[s]))
                self.waiting[(s, v)] -= 1
                self.try_start(l)
            self.try_start(k)
        if len(self.finish) < len(self.waiting):
            checker.bad("simulation deadlock: the device orders contradict the task graph; " + self.stuck(checker))
            return math.nan
        return max(self.finish.values(), default=0.0)

    def stuck(self, checker) -> str:
        parts = []
        for k, order in enumerate(self.orders):
            if self.head[k] < len(order):
                s, i = order[self.head[k]]
                missing = [
                    checker.tasks[int(self.p.edge_src[e])]
                    for e in self.in_edges[i]
                    if (s, int(self.p.edge_src[e])) not in self.finish
                ]
                parts.append(
                    f"{checker.devices[k]!r} waits to run {checker.item((s, i))}, whose inputs {missing} never finish"
                )
        return "; ".join(parts)
