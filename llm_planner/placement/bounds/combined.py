"""The best lower bound known for a problem: the maximum of the critical path
(bounds/times.py), the load-balance LP (load.py), the shard-count bound
(shard_count.py) and, for latency, the path LP at the smallest possible largest shard
(path_lp.py) and the partition bound (partition.py: one copy of the graph per shard of
each partition of Q, sharing the devices).
"""

from __future__ import annotations

import functools

from llm_planner.placement.bounds.load import load_balance_bound, shard_lp_bound
from llm_planner.placement.bounds.partition import partition_bound
from llm_planner.placement.bounds.path_lp import path_lp_bound
from llm_planner.placement.bounds.shard_count import shard_count_bound
from llm_planner.placement.bounds.times import critical_path_bound, largest_shard_floor
from llm_planner.placement.problem import PlacementProblem


def lower_bound(problem: PlacementProblem) -> float:
    """The best valid bound for the problem's objective (max of the bounds above; for latency
    also the path LP of bounds/path_lp.py at the smallest possible largest shard, and its
    partition bound). Computed anew on every call: a solve asks once (solve.session)."""
    load = functools.lru_cache(maxsize=None)(lambda s: shard_lp_bound(problem, s))  # LP(s), shared by the two bounds
    bounds = [critical_path_bound(problem), load_balance_bound(problem), shard_count_bound(problem, load)]
    if problem.objective == "latency":
        bounds.append(path_lp_bound(problem, largest_shard_floor(problem)))
        bounds.append(partition_bound(problem, max(bounds), load))
    return max(bounds)
