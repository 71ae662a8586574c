"""Data parallelism for MILP-SPLIT: identical device groups, one batch shard each.

`device_groups(problem, g)` cuts the cluster into g groups that are identical
up to the cluster's symmetries: the copies of a server template whose count g
divides go to the groups whole (copy r*c/g .. (r+1)*c/g - 1 to group r); in
every other server the devices of each class (llm_planner.core.tensor_groups.device_class:
kind and tensor-parallel degree there) are dealt out evenly (leftovers stay
idle). Group r's i-th device plays the role of group 0's i-th device, so a plan
for group 0 maps onto every group.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.core.tensor_groups import DeviceClass, device_class
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.split.chain import assemble, latency_chain


def device_groups(problem: PlacementProblem, g: int) -> list[list[int]] | None:
    """g lists of device indices, aligned position by position, or None if impossible."""
    by_template: dict[str, list[str]] = defaultdict(list)
    devices_of: dict[tuple[str, DeviceClass], list[int]] = defaultdict(list)
    for i, d in enumerate(problem.devices):
        if d.node not in by_template[d.node_template]:
            by_template[d.node_template].append(d.node)
        devices_of[(d.node, device_class(d))].append(i)
    groups: list[list[int]] = [[] for _ in range(g)]
    for template, nodes in by_template.items():
        classes = sorted({device_class(d) for d in problem.devices if d.node_template == template})
        if len(nodes) % g == 0:
            per = len(nodes) // g
            for r in range(g):
                for node in nodes[r * per : (r + 1) * per]:
                    for cls in classes:
                        groups[r].extend(devices_of.get((node, cls), []))
            continue
        for node in nodes:
            for cls in classes:
                members = devices_of.get((node, cls), [])
                per = len(members) // g
                for r in range(g):
                    groups[r].extend(members[r * per : (r + 1) * per])
    if not groups[0] or any(len(grp) != len(groups[0]) for grp in groups):
        return None
    return groups


def shard_sizes(batch: int, g: int) -> list[int]:
    return [batch // g + (1 if r < batch % g else 0) for r in range(g)]


def candidate_group_counts(problem: PlacementProblem) -> list[int]:
    limit = min(problem.max_shards, problem.batch_size, problem.num_devices)
    return [g for g in range(2, limit + 1) if device_groups(problem, g) is not None]


def data_parallel_plans(ctx, started: float, only: int | None = None) -> list[Plan]:
    """Latency plans with the batch split over g identical groups, for every feasible g (or g = `only`)."""

    problem: PlacementProblem = ctx.problem
    plans = []
    for g in candidate_group_counts(problem) if only is None else [only]:
        groups = device_groups(problem, g)
        assert groups is not None
        sizes = shard_sizes(problem.batch_size, g)
        mask = np.zeros(problem.num_devices, dtype=bool)
        mask[groups[0]] = True
        found = latency_chain(ctx, sizes[0], mask)
        if found is None:
            continue
        assign0, orders0 = assemble(ctx, found[0])
        assignments, orders = replicate(groups, assign0, orders0)
        plans.append(
            make_plan(
                problem,
                sizes,
                assignments,
                solver="milp-split",
                status="heuristic",
                started_at=started,
                lower_bound_s=0.0,
                device_orders=orders,
            )
        )
    return plans


def replicate(groups: list[list[int]], assign0: list[int], orders0: dict[int, list[tuple[int, int]]]):
    """Map group 0's assignment and device orders onto every group, shard r on group r."""
    assignments, orders = [], {}
    for r, group in enumerate(groups):
        to_r = dict(zip(groups[0], group))
        assignments.append([to_r[d] for d in assign0])
        for d, items in orders0.items():
            orders[to_r[d]] = [(r, t) for _, t in items]
    return assignments, orders
