"""The load-balance LP and LP(s), the same with shard counts (both objectives).

Notation and the facts (F1), (F2): bounds/times.py.

* load balance (both): the LP
      min T  s.t.  sum_k x_ik = 1 (each task i),  sum_i Q r_ik x_ik <= T (each
      device k),  x_ik >= 0, x_ik = 0 where k cannot run i,
  with r_ik = t(i, k, Q) / Q. Any plan gives a feasible point: x_ik = (samples
  of task i that run on k) / Q; then sum_i Q r_ik x_ik = sum over (shard s,
  task i) on k of b_s t(i, k, Q) / Q <= sum of t(i, k, b_s) (F2) <= the time k
  is busy with tasks, which is at most both the makespan (tasks on one device
  do not overlap) and k's load per batch (loads add transfer terms >= 0). So
  T* <= makespan, and T* / Q <= max load / Q. Devices with identical cost
  columns (same kind) are merged into one with m times the capacity: spreading
  a merged solution evenly over the m copies is feasible for the full LP and
  has the same T, so the optimum is unchanged while the LP shrinks.
  Memory rows (a refinement): sum_i need_ik x_ik <= cap_k for every device with
  finite capacity, need_ik = weight_bytes_i + mem_bytes_per_sample_i * Q where
  task i's memory counts on k (else 0). Valid: the plan's point x has x_ik <= 1
  where k holds task i (and 0 elsewhere), so need_ik x_ik <= weight_bytes_i +
  mem_bytes_per_sample_i * (samples of i on k), and summed over i that is at
  most the memory the plan uses on k, which fits. Merging identical devices
  stays exact (capacity m * cap). If these rows make the LP infeasible, no
  plan fits in memory at all; the bound then drops them.

* shard count (when the batch may be split): LP(s), the load-balance LP with the
  number of shards s fixed, is `shard_lp_bound` here; the bound over every s and
  why it holds are in bounds/shard_count.py.
"""

from __future__ import annotations

import logging

import numpy as np
import scipy.optimize
import scipy.sparse

from llm_planner.placement.bounds.device_classes import (
    LP_SAFETY,
    coo,
    device_classes,
    family_time_rows,
    memory_rows,
    physical_families,
)
from llm_planner.placement.bounds.times import per_sample_rates
from llm_planner.placement.problem import PlacementProblem

log = logging.getLogger(__name__)


def load_balance_bound(problem: PlacementProblem, *, memory: bool = True) -> float:
    """Optimum of the fractional load-balancing LP (module docstring), in objective units.

    With `memory`, the LP also keeps each device within its capacity (valid, see
    the module docstring); should that make it infeasible (then no plan fits at
    all) the bound falls back to the LP without memory rows.
    """
    classes = device_classes(problem)
    reps = [c[0] for c in classes]
    work = per_sample_rates(problem)[:, reps] * problem.batch_size  # [N, C]: Q r_ik
    finite = np.isfinite(work)
    scale = float(work[finite].max()) if finite.any() else 0.0
    if scale <= 0:
        return 0.0
    rows, cols = np.nonzero(finite)  # one variable x_ic per (task, device class) that can run it
    num_x, num_c = len(rows), len(classes)
    counts = np.array([len(c) for c in classes], dtype=float)
    # variables [x_0 .. x_{num_x-1}, T]; min T
    cost = np.zeros(num_x + 1)
    cost[-1] = 1.0
    a_eq = scipy.sparse.csr_matrix((np.ones(num_x), (rows, np.arange(num_x))), shape=(problem.num_tasks, num_x + 1))
    # work of class c: sum_i (Q r_ic / scale) x_ic - m_c T <= 0   (m_c identical devices share it)
    ub = [(cols, np.arange(num_x), work[rows, cols] / scale), (np.arange(num_c), np.full(num_c, num_x), -counts)]
    rhs = [np.zeros(num_c)]
    families = physical_families(problem, classes)
    fam_ub, fam_rhs = family_time_rows(families, cols, work[rows, cols] / scale, num_x, num_c, num_c)
    ub += fam_ub
    rhs += fam_rhs
    if memory:
        ub_mem, rhs_mem = memory_rows(
            problem, reps, counts, rows, cols, first_row=num_c + len(families), families=families
        )
        ub += ub_mem
        rhs += rhs_mem
    b_ub = np.concatenate(rhs)
    a_ub = scipy.sparse.csr_matrix(coo(ub), shape=(len(b_ub), num_x + 1))
    # HiGHS's interior point with crossover: the same optimal basis as its simplex, 2-3x sooner on
    # the large LPs of long chains (20,000 tasks on three devices: 4.2 s against 12 s)
    res = scipy.optimize.linprog(
        cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(problem.num_tasks), bounds=(0, None), method="highs-ipm"
    )
    if res.status == 2 and memory:
        log.info("load-balance LP with memory is infeasible: no plan fits in memory; bounding without memory")
        return load_balance_bound(problem, memory=False)
    if res.status != 0:
        log.warning("load-balance LP not solved (%s); using 0 as its bound", res.message)
        return 0.0
    bound = max(0.0, float(res.fun)) * scale * (1 - LP_SAFETY)
    return bound / problem.batch_size if problem.objective == "throughput" else bound


def shard_lp_bound(problem: PlacementProblem, shards: int, *, memory: bool = True) -> float:
    """LP(s) of the module docstring: load balance with `shards` non-empty shards, each paying
    every task's fixed costs on the device that runs it. In objective units."""
    classes = device_classes(problem)
    reps = [c[0] for c in classes]
    q = problem.batch_size
    ok = problem.supported[:, reps]
    rows, cols = np.nonzero(ok)  # one (x, z, w) triple per (task, device class) that can run it
    n, num_c = len(rows), len(classes)
    pieces = problem.time_pieces[rows, np.array(reps)[cols]]  # [n, P, 2]
    scale = float(np.max(pieces[..., 0] * shards + pieces[..., 1] * q, initial=0.0))
    if scale <= 0:
        return 0.0
    counts = np.array([len(c) for c in classes], dtype=float)
    idx = np.arange(n)
    x, z, w, t = idx, n + idx, 2 * n + idx, 3 * n  # column blocks
    cost = np.zeros(3 * n + 1)
    cost[t] = 1.0
    eq = [(rows, x, np.ones(n)), (problem.num_tasks + rows, z, np.ones(n))]
    b_eq = np.concatenate([np.ones(problem.num_tasks), np.full(problem.num_tasks, float(shards))])
    ub = [(idx, x, np.ones(n)), (idx, z, -np.ones(n))]  # x - z <= 0
    r = n
    for j in range(pieces.shape[1]):  # f z + Q s x - w <= 0, in units of `scale`
        ub += [
            (r + idx, z, pieces[:, j, 0] / scale),
            (r + idx, x, pieces[:, j, 1] * q / scale),
            (r + idx, w, -np.ones(n)),
        ]
        r += n
    ub += [(r + cols, w, np.ones(n)), (r + np.arange(num_c), np.full(num_c, t), -counts)]  # sum_i w - m T <= 0
    rhs = [np.zeros(r + num_c)]
    families = physical_families(problem, classes)
    fam_ub, fam_rhs = family_time_rows(families, cols, np.ones(n), t, r + num_c, num_c, col_offset=2 * n)
    ub += fam_ub
    rhs += fam_rhs
    r += len(families)
    if memory:
        mem, mem_rhs = memory_rows(problem, reps, counts, rows, cols, first_row=r + num_c, families=families)
        ub += mem
        rhs += mem_rhs
    b_ub = np.concatenate(rhs)
    a_ub = scipy.sparse.csr_matrix(coo(ub), shape=(len(b_ub), 3 * n + 1))
    a_eq = scipy.sparse.csr_matrix(coo(eq), shape=(2 * problem.num_tasks, 3 * n + 1))
    res = scipy.optimize.linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status == 2 and memory:
        return shard_lp_bound(problem, shards, memory=False)
    if res.status != 0:
        log.warning("shard-count LP not solved (%s); using 0 as its bound", res.message)
        return 0.0
    bound = max(0.0, float(res.fun)) * scale * (1 - LP_SAFETY)
    return bound / q if problem.objective == "throughput" else bound
