"""The shard-count bound: min over the number of shards s of max(CP(s), LP(s)).

* shard count (both, when the batch may be split: min(Q, S) >= 2): the two
  bounds above pull in opposite directions as the number of shards grows (a
  smaller largest shard shortens the path; every shard pays each task's fixed
  cost again, e.g. reading the weights). Let s be the plan's number of non-empty
  shards, 1 <= s <= min(Q, S). Then the largest shard has >= ceil(Q / s) samples,
  so CP(s), the critical path (bounds/times.py) at that size, bounds the plan; and so does
  LP(s), the load-balance LP with shard counts:
      min T  s.t.  sum_k x_ik = 1,  sum_k z_ik = s,  z_ik >= x_ik  (each task i),
                   w_ik >= f_ijk z_ik + Q s_ijk x_ik  (each piece j),
                   sum_i w_ik <= T  (each device k),  memory rows as above,
  with z_ik the number of shards whose task i runs on k. Any plan with s shards
  gives a feasible point (x as above; z_ik counts those shards, >= 1 >= x_ik
  where k runs part of task i; w_ik = k's time on task i = sum over those
  shards of t(i, k, b) >= sum of (f_ijk + s_ijk b) for every piece j). Identical
  devices merge as before (sums over the copies). So every plan is at least
  min over s of max(CP(s), LP(s)). CP(s) falls and LP(s) rises with s (from a
  point for s + 1 shards, lower z where z > x by one in all: every task has
  slack sum z - sum x = s >= 1; w and T do not grow), so a bisection finds the
  first s* with LP(s*) >= CP(s*), and the minimum is LP(s*) or CP(s* - 1): a
  few LPs however large the batch. With one shard (s = 1, z = x)
  LP(1) is the load-balance LP, so this bound is only computed when min(Q, S) >= 2.

For latency the path LP at ceil(Q / s) samples (bounds/path_lp.py) stands in
for CP(s): it is at least CP(s) and bounds a plan of s shards the same way.
"""

from __future__ import annotations

import functools

from llm_planner.placement.bounds.load import shard_lp_bound
from llm_planner.placement.bounds.path_lp import path_lp_at_shards
from llm_planner.placement.bounds.times import critical_path_bound
from llm_planner.placement.problem import PlacementProblem


def shard_count_bound(problem: PlacementProblem, load=None) -> float:
    """min over s of max(CP(s), LP(s)) (module docstring); 0 when the batch cannot be split."""
    most = min(problem.batch_size, problem.max_shards)
    if most < 2:
        return 0.0

    if problem.objective == "latency":
        path = functools.lru_cache(maxsize=None)(lambda s: path_lp_at_shards(problem, s))
    else:
        path = functools.lru_cache(maxsize=None)(lambda s: critical_path_bound(problem, shards=s))
    load = load or functools.lru_cache(maxsize=None)(lambda s: shard_lp_bound(problem, s))
    # CP falls and LP rises with s: find the first s* with LP(s*) >= CP(s*) by bisection; the
    # minimum of max(CP, LP) is then LP(s*) or CP(s* - 1)
    lo, hi = 1, most
    if load(most) < path(most):
        return path(most)
    while lo < hi:
        mid = (lo + hi) // 2
        if load(mid) >= path(mid):
            hi = mid
        else:
            lo = mid + 1
    return min(load(lo), path(lo - 1)) if lo > 1 else load(1)
