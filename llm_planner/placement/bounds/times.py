"""Task times and the critical path bound; the notation and facts every bound uses.

Every function returns a bound in the units of the problem's objective: seconds
of makespan for "latency", seconds per sample for "throughput" (the busiest
device's load per batch divided by the batch size Q). No plan, whatever its
shards, placement and order, can do better. docs/objectives.md explains them.

Notation: t(i, k, b) = max_j (f_ijk + s_ijk * b) for b >= 1 (and 0 for b = 0),
the time of task i on device k for b samples, with f >= 0 and s >= 0 (roofline
pieces and explicit per-sample times both have them; see llm_planner.cost.roofline). A
plan splits the batch into shards of sizes b_1..b_S >= 1 with sum Q and S at most
the problem's max_shards.

Two facts the proofs use:

(F1) t(i, k, b) is non-decreasing in b >= 1: every piece has a slope s >= 0.

(F2) t(i, k, b) / b is non-increasing in b >= 1 when every intercept f >= 0:
     t(b) / b = max_j (f_j / b + s_j), and each f_j / b is non-increasing in b,
     and a maximum of non-increasing functions is non-increasing. Hence for
     1 <= b <= Q, t(b) >= b * t(Q) / Q: a sub-batch costs at least its share of
     the full batch's time. (Convexity alone would not give this: an affine
     t(b) = f + s b with f < 0 has t(b) / b increasing. We never assume it: if a
     problem ever carries a negative intercept or slope, the bounds take the
     minimum over every sub-batch size instead (min over b in 1..Q of t(b) / b
     for the rates, min over b >= ceil(Q / S) for the path), valid always.)

The critical path bound:

critical path (latency): some shard has b >= ceil(Q / S) samples (pigeonhole).
  Every task of that shard runs for at least min_k t(i, k, ceil(Q / S)) (F1),
  and a task starts after all its predecessors finish (transfers are >= 0), so
  the longest path of those minimal times is at most that shard's finish time,
  which is at most the makespan.
  (throughput): the device that runs task i of that shard has a load of at least
  min_k t(i, k, ceil(Q / S)), so max_i of it, divided by Q, bounds the objective.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from llm_planner.placement.problem import PlacementProblem

log = logging.getLogger(__name__)


def task_times(problem: PlacementProblem, batch: int) -> np.ndarray:
    """t(i, k, batch) for every task and device as an [N, K] array (+inf where unsupported)."""
    if batch <= 0:
        return np.where(problem.supported, 0.0, np.inf)
    pieces = problem.time_pieces
    times = np.max(pieces[..., 0] + pieces[..., 1] * batch, axis=2)
    return np.where(problem.supported, times, np.inf)


def _pieces_nonnegative(problem: PlacementProblem) -> bool:
    return bool(np.all(problem.time_pieces >= 0))


def fastest_task_times(problem: PlacementProblem, batch: int) -> np.ndarray:
    """min over devices k and sub-batches b in [batch, Q] of t(i, k, b), for every task.

    With non-negative slopes (F1) that is min_k t(i, k, batch).
    """
    if _pieces_nonnegative(problem):
        return task_times(problem, batch).min(axis=1)
    log.warning("negative cost intercepts or slopes: bounds take minima over every sub-batch size")
    return np.min([task_times(problem, b).min(axis=1) for b in range(batch, problem.batch_size + 1)], axis=0)


def largest_shard_floor(problem: PlacementProblem) -> int:
    """ceil(Q / S): some shard of every plan holds at least this many samples."""
    return math.ceil(problem.batch_size / max(1, problem.max_shards))


def critical_path_bound(problem: PlacementProblem, *, shards: int | None = None) -> float:
    """Longest path of fastest task times at the smallest possible largest shard
    (of `shards` non-empty shards; default: at most the problem's max_shards).

    Latency: that path length (s). Throughput: the longest single such task
    divided by the batch size (s per sample). See the module docstring.
    """
    floor = largest_shard_floor(problem) if shards is None else math.ceil(problem.batch_size / shards)
    times = fastest_task_times(problem, floor)
    if problem.objective == "throughput":
        return float(times.max()) / problem.batch_size
    return longest_path(problem, times)


def longest_path(problem: PlacementProblem, times: np.ndarray) -> float:
    """The longest path of the graph with task i taking times[i] and transfers free."""
    finish = np.zeros(problem.num_tasks)
    in_edges = problem.in_edges()
    for name in problem.graph.topological_order():
        i = problem.graph.index(name)
        ready = max((finish[int(problem.edge_src[e])] for e in in_edges[i]), default=0.0)
        finish[i] = ready + times[i]
    return float(finish.max())


def per_sample_rates(problem: PlacementProblem) -> np.ndarray:
    """r_ik, a valid lower bound on t(i, k, b) / b for every 1 <= b <= Q ([N, K], +inf unsupported)."""
    q = problem.batch_size
    if _pieces_nonnegative(problem):
        return task_times(problem, q) / q  # (F2)
    rates = np.full(problem.supported.shape, np.inf)
    for b in range(1, q + 1):
        rates = np.minimum(rates, task_times(problem, b) / b)
    return rates
