"""The path LP: a latency lower bound that weighs the critical path, device load,
transfers and memory against each other in one linear program.

The critical path bound (bounds/times.py) puts every task on its fastest device
and the load-balance LP spreads work over every device for free; each alone is
weak where the two pull apart: a randomly wired stage on a CPU, an A100 and a T4
(the path wants the A100, the load wants all three, and moving a task pays a
transfer), or a decoder too large for its GPUs (a chain runs its blocks one
after another, so the blocks memory pushes onto the CPU lengthen the path
itself). This LP holds all of it at once, for one shard of b samples:

    min T  s.t.
      sum_c x_ic = 1                                   each task i            (1)
      C_i >= sum_c t_ic x_ic                           each task i            (2)
      C_i >= C_p + sum_c t_ic x_ic + d_e               each edge e = (p, i)   (3)
      u_ec >= x_ic - x_pc,  v_ec >= x_pc - x_ic        each edge, class c     (4)
      d_e >= sum_c a_ec u_ec,  d_e >= sum_c o_ec v_ec   each edge              (5)
      T >= C_i                                         each sink i            (6)
      m_c T >= sum_i t_ic x_ic                          each device class c    (7)
      sum_i need_ic x_ic <= m_c cap_c                   each class with finite memory (8)
      x, u, v, d, C >= 0

over device classes c (devices with identical cost columns, m_c of them; as in
the load-balance LP), with t_ic = t(i, c, b), a_ec = the least time of edge e's
transfer into a device of c from a device outside c, o_ec = the least out of c
into a device outside c, and need_ic = weight_bytes_i + mem_bytes_per_sample_i
* b where task i's memory counts on c.

Validity (T* <= the makespan of any one-shard plan of b samples): set x_ic = 1
for the class of task i's device, C_i = i's finish time, d_e = the transfer
time of edge e in the plan, u_ec = max(0, x_ic - x_pc), v_ec = max(0, x_pc -
x_ic), T = the makespan. (1) holds; (2) and (3): a task runs for t_ic after its
inputs arrive, and an input arrives d_e after its producer finishes; (4) by
definition; (5): if p and i are in one class every u and v is 0, else u is 1
at i's class only and v at p's class only, and the transfer, between a device
outside and one inside those classes, takes at least a_ec and at least o_ec;
(6): the makespan is the last finish; (7): the tasks on one device do not
overlap, so a class's work is at most m_c makespans; (8): the memory of the
tasks a class holds fits in its devices. Transfers within a class are free
here (a relaxation).

Shards. With several shards the LP, at b = ceil(Q / s), bounds a plan of s
non-empty shards: its largest shard has >= b samples and is a one-shard plan of
its own on the same devices (times and transfers do not fall with more samples
(F1 of bounds/times.py); the memory that shard alone holds fits, so (8) holds).
`bounds.shard_count.shard_count_bound` uses it for CP(s).

The LP grows as (tasks + edges) x classes: above MAX_TRANSFER_EDGES edges it
leaves out the transfer rows (4)-(5), and above MAX_PATH_LP_EDGES edges
`path_lp_bound` returns the critical path bound alone (a dense randomly wired
graph of 778 tasks has 19,503 edges; there the LP takes seconds and the
load-balance LP is the stronger bound anyway).

Rows (1)-(8) are built in bounds/path_rows.py; the refinements (7'), (9)-(11) (pinned
windows, head and tail rows, energy rows) in bounds/path_refine.py; the partition
bound (one copy of the graph per shard) in bounds/partition.py.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import scipy.optimize

from llm_planner.placement.bounds.device_classes import LP_SAFETY, device_classes, family_time_rows, physical_families
from llm_planner.placement.bounds.path_refine import (
    before_and_after,
    energy_rows,
    head_tail_rows,
    pinned_heads_tails,
    windows,
)
from llm_planner.placement.bounds.path_rows import (
    Columns,
    Rows,
    least_transfers,
    path_memory_rows,
    path_rows,
    transfer_rows,
)
from llm_planner.placement.bounds.times import fastest_task_times, longest_path, task_times
from llm_planner.placement.problem import PlacementProblem

log = logging.getLogger(__name__)

MAX_TRANSFER_EDGES = 500  # above: no transfer rows (4)-(5)
MAX_PATH_LP_EDGES = 5_000  # above, and above MAX_PATH_LP_SIZE too: the critical path bound alone
MAX_PATH_LP_SIZE = 2_000_000  # tasks x edges: a dense randomly wired stage of 257 tasks (6,487 edges) still gets the LP
MAX_HEAD_TAIL_TERMS = (
    300_000  # above: head and tail rows (9)-(10) for every s-th task only (they grow as ancestor pairs x classes)
)
MAX_HEAD_TAIL_TERMS_DENSE = (
    50_000  # the same above MAX_PATH_LP_EDGES edges (257 tasks, 6,487 edges: 2.0 -> 0.6 s, bound -0.2%)
)


def path_lp_bound(
    problem: PlacementProblem, batch: int, *, memory: bool = True, head_tail: bool = True, copies: int = 1
) -> float:
    """Optimum of the path LP (module docstring) for the largest shard, of `batch` <= Q samples, in seconds.

    Returns the critical path of fastest times when the LP cannot be solved; leaves
    out the transfer rows (4)-(5) above MAX_TRANSFER_EDGES edges and thins the head and
    tail rows (9)-(10) above MAX_HEAD_TAIL_TERMS terms, and everywhere with `head_tail=False`
    (a weaker bound, often ten times faster). `copies` > 1: the problem is `shard_copies`
    of that many shards, whose weights the memory rows count once per class that runs
    any copy of a task (`_shared_weight_rows`).
    """
    fast = fastest_task_times(problem, batch)
    terms = MAX_HEAD_TAIL_TERMS
    if problem.num_edges > MAX_PATH_LP_EDGES:
        if problem.num_tasks * problem.num_edges > MAX_PATH_LP_SIZE:
            return longest_path(problem, fast)
        terms = min(terms, MAX_HEAD_TAIL_TERMS_DENSE)
    start, after = before_and_after(problem, fast)
    path = float((start + fast).max(initial=0.0))  # the critical path: longest_path(problem, fast)
    classes = device_classes(problem)
    reps = np.array([c[0] for c in classes])
    counts = np.array([len(c) for c in classes], dtype=float)
    work = task_times(problem, batch)[:, reps]  # [N, C]
    finite = np.isfinite(work)
    scale = float(work[finite].max(initial=0.0))
    if scale <= 0:
        return path
    if problem.num_edges <= MAX_TRANSFER_EDGES:
        into, out = least_transfers(problem, classes, batch)
        comm_edges = np.nonzero((into > 0).any(axis=1) | (out > 0).any(axis=1))[0]
    else:
        into = out = np.zeros((problem.num_edges, len(classes)))
        comm_edges = np.zeros(0, dtype=int)
    rows_x, cols_x = np.nonzero(finite)
    col = Columns(
        rows_x=rows_x,
        cols_x=cols_x,
        num_tasks=problem.num_tasks,
        num_classes=len(classes),
        num_comm_edges=len(comm_edges),
    )
    t_x = work[rows_x, cols_x] / scale
    ub = Rows()
    path_rows(ub, problem, col, t_x, comm_edges)
    if len(comm_edges):
        transfer_rows(ub, comm_edges, problem.edge_src, problem.edge_dst, col, into / scale, out / scale)
    head, tail = pinned_heads_tails(problem, batch, fast, start, after)
    idle = windows(problem, head, tail, classes, path) / scale
    ub.add(
        len(counts), (col.cols_x, np.arange(col.num_x), t_x), (np.arange(len(counts)), col.t, -counts), rhs=-idle
    )  # (7)
    families = physical_families(problem, classes)
    ub.extend(
        *family_time_rows(families, col.cols_x, t_x, col.t, ub.num, len(classes))
    )  # (7) over shared physical devices
    energy_rows(
        ub, col, classes, counts, t_x, np.maximum(start[:, None], head), np.maximum(after[:, None], tail), path, scale
    )
    if head_tail:
        head_tail_rows(ub, problem, col, t_x, counts, terms)
    eq = Rows()
    eq.add(problem.num_tasks, (rows_x, np.arange(col.num_x), 1.0), rhs=np.ones(problem.num_tasks))  # (1)
    num_cols = col.t + 1
    if memory:
        num_cols = path_memory_rows(ub, eq, problem, col, reps, counts, batch, scale, copies, families)
    a_ub, b_ub = ub.matrix(num_cols)
    a_eq, b_eq = eq.matrix(num_cols)
    cost = np.zeros(num_cols)
    cost[col.t] = 1.0
    res = scipy.optimize.linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status == 2 and memory:
        return path_lp_bound(problem, batch, memory=False, head_tail=head_tail, copies=copies)
    if res.status != 0:
        log.warning("path LP not solved (%s); using the critical path as its bound", res.message)
        return path
    return max(path, max(0.0, float(res.fun)) * scale * (1 - LP_SAFETY))


def path_lp_at_shards(problem: PlacementProblem, shards: int) -> float:
    """The path LP for plans of `shards` non-empty shards: its largest has >= ceil(Q / shards) samples."""
    return path_lp_bound(problem, math.ceil(problem.batch_size / shards))
