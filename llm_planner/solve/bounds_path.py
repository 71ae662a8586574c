"""The path LP: a latency lower bound that weighs the critical path, device load,
transfers and memory against each other in one linear program.

The critical path bound (solve/bounds.py) puts every task on its fastest device
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
(F1 of solve/bounds.py); the memory that shard alone holds fits, so (8) holds).
`solve.bounds.shard_count_bound` uses it for CP(s).

Head and tail rows. The path rows see only the tasks on one path; the load row
sees a class's work but not when it can run. Two more rows per task i and class
c tie them:

      sum_{w anc i} t_wc x_wc / m_c + sum_c' t_ic' x_ic'  <= C_i            (9)
      C_i + sum_{w desc i} t_wc x_wc / m_c                <= T              (10)

Valid: i's ancestors on c all finish before i starts, on m_c devices, so i
starts no earlier than their work over m_c and then runs its own time; its
descendants on c all start after C_i and end by T. On the randomly wired
graphs of benchmarks/bench_split.py they raise the bounds by up to 11%
(docs/benchmarks.md). They grow as ancestor pairs x classes, so above
MAX_HEAD_TAIL_TERMS terms they are written for every s-th task in topological
order only, with the least stride s that keeps them within it.

The LP grows as (tasks + edges) x classes: above MAX_TRANSFER_EDGES edges it
leaves out the transfer rows (4)-(5), and above MAX_PATH_LP_EDGES edges
`path_lp_bound` returns the critical path bound alone (a dense randomly wired
graph of 778 tasks has 19,503 edges; there the LP takes seconds and the
load-balance LP is the stronger bound anyway).

Pinned windows. A task that only one device can run is pinned (MILP-SPLIT's
module subproblems pin the module's input and output cuts). Every other device
must wait for data from a pinned ancestor before its first task and send its
results toward a pinned descendant before the end: with H_d and Q_d the least
such head and tail over the tasks d can run, d works at most T - H_d - Q_d, or
nothing (`_pinned_heads_tails`, `_windows`). Row (7) becomes

      m_c T >= sum_i t_ic x_ic + W_c,   W_c = sum_{d in c} min(H_d + Q_d, CP)    (7')

with CP the critical path bound (an idle device does no work, and T >= CP). On
the 33-task stage of RWNN WS 3x32 on a CPU, an A100 and a T4, input and output
on the A100, the LP rises from 162.4 to 170.6 us (best plan known 185.7 us).

Energy rows. The head and tail rows see the ancestors and descendants of one
task; a stage of a randomly wired network has levels wider than the devices, and
the tasks of a level all run after the levels before and before the levels after:

      sum_{i in S_c(a, b)} t_ic x_ic <= m_c (T - min(a + b, CP))   each class c, (a, b)   (11)

with S_c(a, b) the tasks whose head on c (the longer of its earliest start by
fastest times and its pinned head there) is at least a and whose tail on c is at
least b, for up to ENERGY_THRESHOLDS quantile values of each (`_energy_rows`).
On the 64-task stage of RWNN BA 3x64 on four A100s, input and output on one, the
LP rises from 160.6 to 176.3 us (best plan known 198.3 us).

Partitions (`partition_bound`). For a batch that may be split, the path LP of
one copy of the graph per shard, for each partition of Q into at most S shard
sizes, with the copies sharing the devices' load and memory rows: a plan whose
shards have those sizes gives a feasible point (each shard its own copy), so
the least such LP over the partitions bounds every plan (docs/objectives.md,
"Shard partitions").
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import scipy.optimize
import scipy.sparse

from llm_planner.solve.bounds import (
    LP_SAFETY,
    _device_classes,
    family_time_rows,
    memory_pools,
    physical_families,
    _memory_rows,
    fastest_task_times,
    longest_path,
    per_capacity,
    per_sample_rates,
    task_times,
)
from llm_planner.solve.problem import PlacementProblem

log = logging.getLogger(__name__)

MAX_TRANSFER_EDGES = 500  # above: no transfer rows (4)-(5)
MAX_PATH_LP_EDGES = 5_000  # above, and above MAX_PATH_LP_SIZE too: the critical path bound alone
MAX_PATH_LP_SIZE = 2_000_000  # tasks x edges: a dense randomly wired stage of 257 tasks (6,487 edges) still gets the LP
MAX_HEAD_TAIL_TERMS = 300_000  # above: head and tail rows (9)-(10) for every s-th task only (they grow as ancestor pairs x classes)
MAX_HEAD_TAIL_TERMS_DENSE = 50_000  # the same above MAX_PATH_LP_EDGES edges (257 tasks, 6,487 edges: 2.0 -> 0.6 s, bound -0.2%)


class _Rows:
    """Sparse constraint rows A_ub x <= b_ub, appended block by block."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.rhs: list[np.ndarray] = []
        self.num = 0

    def add(self, count: int, *terms: tuple[np.ndarray, np.ndarray, np.ndarray], rhs: np.ndarray | None = None) -> None:
        """`count` new rows; each term is (row offset within the block, column, coefficient)."""
        for rows, cols, vals in terms:
            rows, cols, vals = np.broadcast_arrays(np.asarray(rows), np.asarray(cols), np.asarray(vals, dtype=float))
            self.parts.append((self.num + rows.ravel(), cols.ravel(), vals.ravel()))
        self.rhs.append(np.zeros(count) if rhs is None else rhs)
        self.num += count

    def extend(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], rhs: list[np.ndarray]) -> None:
        """Rows built elsewhere with absolute row indices starting at self.num (e.g. bounds._memory_rows)."""
        self.parts += parts
        self.rhs += rhs
        self.num += sum(len(r) for r in rhs)

    def matrix(self, num_cols: int) -> tuple[scipy.sparse.csr_matrix, np.ndarray]:
        r, c, v = (np.concatenate(x) for x in zip(*self.parts))
        return scipy.sparse.csr_matrix((v, (r, c)), shape=(self.num, num_cols)), np.concatenate(self.rhs)


def _least_transfers(problem: PlacementProblem, classes: list[list[int]], batch: int) -> tuple[np.ndarray, np.ndarray]:
    """a[e, c], o[e, c]: the least transfer time of edge e into / out of class c from / to outside it."""
    num_e, num_c = problem.num_edges, len(classes)
    into, out = np.zeros((num_e, num_c)), np.zeros((num_e, num_c))
    if num_e == 0 or num_c < 2:
        return into, out
    times = problem.comm_fixed + problem.comm_slope * batch  # [E, K, K]
    for c, members in enumerate(classes):
        inside = np.zeros(problem.num_devices, dtype=bool)
        inside[members] = True
        into[:, c] = times[:, ~inside][:, :, inside].min(axis=(1, 2))
        out[:, c] = times[:, inside][:, :, ~inside].min(axis=(1, 2))
    return np.maximum(into, 0.0), np.maximum(out, 0.0)


@dataclass(frozen=True)
class _Columns:
    """Column layout: x_ic (one per supported task-class pair), C_i, d_e, u_ec, v_ec, T, then y_ic, z_ic."""

    rows_x: np.ndarray  # task of each x column
    cols_x: np.ndarray  # class of each x column
    num_tasks: int
    num_classes: int
    num_comm_edges: int

    @property
    def num_x(self) -> int:
        return len(self.rows_x)

    def x_of(self, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position in `tasks`, x column) for every x column of every task in `tasks`
        (rows_x is sorted, so task i's x columns are contiguous)."""
        first = np.searchsorted(self.rows_x, tasks)
        per = np.searchsorted(self.rows_x, tasks, side="right") - first
        offsets = np.arange(per.sum()) - np.repeat(np.cumsum(per) - per, per)
        return np.repeat(np.arange(len(tasks)), per), np.repeat(first, per) + offsets

    @property
    def c0(self) -> int:
        return self.num_x

    @property
    def d0(self) -> int:
        return self.c0 + self.num_tasks

    @property
    def u0(self) -> int:
        return self.d0 + self.num_comm_edges

    @property
    def v0(self) -> int:
        return self.u0 + self.num_comm_edges * self.num_classes

    @property
    def t(self) -> int:
        return self.v0 + self.num_comm_edges * self.num_classes

    @property
    def y0(self) -> int:
        return self.t + 1

    @property
    def z0(self) -> int:
        return self.y0 + self.num_x


def path_lp_bound(problem: PlacementProblem, batch: int, *, memory: bool = True, head_tail: bool = True,
                  copies: int = 1) -> float:
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
    start, after = _before_and_after(problem, fast)
    path = float((start + fast).max(initial=0.0))  # the critical path: longest_path(problem, fast)
    classes = _device_classes(problem)
    reps = np.array([c[0] for c in classes])
    counts = np.array([len(c) for c in classes], dtype=float)
    work = task_times(problem, batch)[:, reps]  # [N, C]
    finite = np.isfinite(work)
    scale = float(work[finite].max(initial=0.0))
    if scale <= 0:
        return path
    if problem.num_edges <= MAX_TRANSFER_EDGES:
        into, out = _least_transfers(problem, classes, batch)
        comm_edges = np.nonzero((into > 0).any(axis=1) | (out > 0).any(axis=1))[0]
    else:
        into = out = np.zeros((problem.num_edges, len(classes)))
        comm_edges = np.zeros(0, dtype=int)
    rows_x, cols_x = np.nonzero(finite)
    col = _Columns(rows_x=rows_x, cols_x=cols_x, num_tasks=problem.num_tasks, num_classes=len(classes), num_comm_edges=len(comm_edges))
    t_x = work[rows_x, cols_x] / scale
    ub = _Rows()
    _path_rows(ub, problem, col, t_x, comm_edges)
    if len(comm_edges):
        _transfer_rows(ub, comm_edges, problem.edge_src, problem.edge_dst, col, into / scale, out / scale)
    head, tail = _pinned_heads_tails(problem, batch, fast, start, after)
    idle = _windows(problem, head, tail, classes, path) / scale
    ub.add(len(counts), (col.cols_x, np.arange(col.num_x), t_x), (np.arange(len(counts)), col.t, -counts), rhs=-idle)  # (7)
    families = physical_families(problem, classes)
    ub.extend(*family_time_rows(families, col.cols_x, t_x, col.t, ub.num, len(classes)))  # (7) over shared physical devices
    _energy_rows(ub, col, classes, counts, t_x, np.maximum(start[:, None], head), np.maximum(after[:, None], tail), path, scale)
    if head_tail:
        _head_tail_rows(ub, problem, col, t_x, counts, terms)
    eq = _Rows()
    eq.add(problem.num_tasks, (rows_x, np.arange(col.num_x), 1.0), rhs=np.ones(problem.num_tasks))  # (1)
    num_cols = col.t + 1
    if memory:
        num_cols = _memory(ub, eq, problem, col, reps, counts, batch, scale, copies, families)
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


def _pinned_heads_tails(problem: PlacementProblem, batch: int, fast: np.ndarray, start: np.ndarray,
                        late: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """head[i, d], tail[i, d]: least time before task i can start on device d, and least time
    from its finish there to the end of the plan, because of tasks pinned to other devices.

    A task p that only one device pi(p) can run (a module's input and output cuts) is pinned.
    A task i that runs on d != pi(p), with p an ancestor of i, starts at least
    EF_p + L(p, i) + c(p, i) after the plan starts: p's earliest finish (the longest path of
    fastest times up to and including p), the longest path of fastest times strictly between p
    and i, and the least transfer time c(p, i) over the edges of the paths from p to i, since
    some edge of that longest path carries the data off pi(p). In the same way, with v a pinned
    descendant of i on pi(v) != d, the plan ends at least L(i, v) + c(i, v) + t_v + (the longest
    path of fastest times after v) after i finishes (t_v: v's fastest time). `fast`: the fastest
    times; `start` and `late`: the longest paths of them before and after each task.
    """
    n, num_d = problem.num_tasks, problem.num_devices
    head, tail = np.zeros((n, num_d)), np.zeros((n, num_d))
    pinned = np.flatnonzero(problem.supported.sum(axis=1) == 1)
    if len(pinned) == 0 or problem.num_edges == 0 or num_d < 2:
        return head, tail
    comm = problem.comm_fixed + problem.comm_slope * batch  # [E, K, K]
    least = np.maximum(comm[:, ~np.eye(num_d, dtype=bool)].min(axis=1), 0.0)
    order = [problem.graph.index(name) for name in problem.graph.topological_order()]
    ins, outs = problem.in_edges(), problem.out_edges()
    early = start + fast  # earliest finish

    def paths(p: int, sweep: list[int], edges: list[list[int]], other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Longest path of fastest times strictly between p and each task reached from p along
        `edges`, and the least transfer on those paths (-inf and inf where not reached)."""
        between, cheapest = np.full(n, -np.inf), np.full(n, np.inf)
        for i in sweep:
            for e in edges[i]:
                q = int(other[e])
                if q == p:
                    between[i], cheapest[i] = max(between[i], 0.0), min(cheapest[i], least[e])
                elif np.isfinite(between[q]):
                    between[i] = max(between[i], between[q] + fast[q])
                    cheapest[i] = min(cheapest[i], cheapest[q], least[e])
        return between, cheapest

    for p in pinned:
        away = problem.supported[p] == 0  # every device but pi(p)
        between, cheapest = paths(p, order, ins, problem.edge_src)
        reach = np.flatnonzero(np.isfinite(between))
        value = early[p] + between[reach] + cheapest[reach]
        head[np.ix_(reach, away)] = np.maximum(head[np.ix_(reach, away)], value[:, None])
        between, cheapest = paths(p, order[::-1], outs, problem.edge_dst)
        reach = np.flatnonzero(np.isfinite(between))
        value = between[reach] + cheapest[reach] + fast[p] + late[p]
        tail[np.ix_(reach, away)] = np.maximum(tail[np.ix_(reach, away)], value[:, None])
    return head, tail


def _before_and_after(problem: PlacementProblem, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The longest path of `times` before each task starts, and after it finishes (transfers free)."""
    order = [problem.graph.index(name) for name in problem.graph.topological_order()]
    ins, outs = problem.in_edges(), problem.out_edges()
    src, dst = problem.edge_src, problem.edge_dst
    before, after = np.zeros(problem.num_tasks), np.zeros(problem.num_tasks)
    for i in order:
        before[i] = max((before[int(src[e])] + times[int(src[e])] for e in ins[i]), default=0.0)
    for i in reversed(order):
        after[i] = max((times[int(dst[e])] + after[int(dst[e])] for e in outs[i]), default=0.0)
    return before, after


def _windows(problem: PlacementProblem, head: np.ndarray, tail: np.ndarray, classes: list[list[int]], floor: float) -> np.ndarray:
    """W_c = sum over the devices d of class c of min(H_d + Q_d, floor), with H_d and Q_d the
    least head and tail of the tasks d can run: d starts its first task no earlier than H_d and
    ends its last Q_d before the end; its tasks do not overlap, so it works at most
    T - H_d - Q_d, and an idle device none, at most T - floor when floor <= T (a bound on every
    plan). Row (7) subtracts W_c from m_c T."""
    able = problem.supported
    first = np.where(able, head, np.inf).min(axis=0)
    last = np.where(able, tail, np.inf).min(axis=0)
    window = np.minimum(np.where(np.isfinite(first), first, 0.0) + np.where(np.isfinite(last), last, 0.0), floor)
    return np.array([window[members].sum() for members in classes])


ENERGY_THRESHOLDS = 12  # threshold values per class for the heads and for the tails of rows (11)


def _energy_rows(ub: _Rows, col: _Columns, classes: list[list[int]], counts: np.ndarray, t_x: np.ndarray,
                 head: np.ndarray, tail: np.ndarray, floor: float, scale: float) -> None:
    """(11) sum_{i in S_c(a, b)} t_ic x_ic <= m_c (T - min(a + b, floor)) for each class c and
    threshold pair (a, b), with S_c(a, b) the tasks whose head on c is at least a and whose tail
    on c is at least b.

    head[i, d] (tail[i, d]): the least time before task i can start on device d (from its
    finish there to the end), the larger of its earliest start by fastest times and its pinned
    head (`_pinned_heads_tails`); a task's head on c is the least over c's devices. On a device
    of c the tasks of S_c run within [a, T - b] and do not overlap, so they take at most
    T - a - b; a device that runs none of them takes 0 <= T - floor (floor: a bound on every
    plan). Thresholds: up to ENERGY_THRESHOLDS of the distinct heads and of the distinct tails
    per class (quantiles).
    head, tail and floor in seconds; rows in model units (`scale` seconds)."""
    if ENERGY_THRESHOLDS <= 0 or len(head) < 2:
        return

    def thresholds(values: np.ndarray) -> np.ndarray:
        distinct = np.unique(values)
        if len(distinct) > ENERGY_THRESHOLDS:
            distinct = np.unique(np.quantile(distinct, np.linspace(0, 1, ENERGY_THRESHOLDS), method="lower"))
        return distinct

    for c, members in enumerate(classes):
        h, q = head[:, members].min(axis=1), tail[:, members].min(axis=1)
        xs = np.flatnonzero(col.cols_x == c)  # the x columns of class c
        tasks = col.rows_x[xs]
        pairs = [(a, b) for a in thresholds(h[tasks]) for b in thresholds(q[tasks]) if a + b > 0]
        rows_, cols_, vals_, rhs = [], [], [], []
        for r, (a, b) in enumerate(pairs):
            inside = xs[(h[tasks] >= a) & (q[tasks] >= b)]
            rows_ += [np.full(len(inside) + 1, r)]
            cols_ += [np.append(inside, col.t)]
            vals_ += [np.append(t_x[inside], -counts[c])]
            rhs.append(-counts[c] * min(a + b, floor) / scale)
        if pairs:
            ub.add(len(pairs), (np.concatenate(rows_), np.concatenate(cols_), np.concatenate(vals_)), rhs=np.array(rhs))


def _ancestors(problem: PlacementProblem) -> np.ndarray:
    """anc[i, w]: w is a proper ancestor of i (a bool matrix, tasks x tasks)."""
    anc = np.zeros((problem.num_tasks, problem.num_tasks), dtype=bool)
    in_edges = problem.in_edges()
    for name in problem.graph.topological_order():
        i = problem.graph.index(name)
        for e in in_edges[i]:
            p = int(problem.edge_src[e])
            anc[i] |= anc[p]
            anc[i, p] = True
    return anc


def _head_tail_rows(ub: _Rows, problem: PlacementProblem, col: _Columns, t_x: np.ndarray, counts: np.ndarray,
                    max_terms: int) -> None:
    """(9) sum_{w anc i} t_wc x_wc / m_c + sum_c' t_ic' x_ic' - C_i <= 0 and
    (10) C_i + sum_{w desc i} t_wc x_wc / m_c - T <= 0, for each class c and each task i,
    or, where that would take more than `max_terms` terms, for every s-th task i
    in topological order with s the least stride that keeps them within it (each row is
    valid on its own)."""
    if max_terms <= 0:
        return
    anc = _ancestors(problem)
    n, nc = problem.num_tasks, len(counts)
    stride = max(1, math.ceil(2 * int(anc.sum()) * nc / max_terms))
    topo = np.array([problem.graph.index(name) for name in problem.graph.topological_order()], dtype=int)
    chosen = topo[stride - 1 :: stride]
    pos = np.full(n, -1)
    pos[chosen] = np.arange(len(chosen))
    rows = np.arange(len(chosen) * nc)  # row pos(i) * nc + c
    own_x = np.nonzero(pos[col.rows_x] >= 0)[0]  # the x columns of the chosen tasks
    for related, tail in ((anc, False), (anc.T, True)):
        ii, ww = np.nonzero(related[chosen])  # w is an ancestor (for the head) or a descendant (for the tail) of chosen[ii]
        of, xc = col.x_of(ww)  # the x columns of w
        cls = col.cols_x[xc]
        terms = [(ii[of] * nc + cls, xc, t_x[xc] / counts[cls])]
        if tail:
            terms += [(rows, col.c0 + chosen[rows // nc], 1.0), (rows, col.t, -1.0)]
        else:
            own = pos[col.rows_x[own_x]][:, None] * nc + np.arange(nc)[None, :]  # i's own time, in each of i's class rows
            terms += [(own, own_x[:, None], t_x[own_x][:, None]), (rows, col.c0 + chosen[rows // nc], -1.0)]
        ub.add(len(rows), *terms)


def _path_rows(ub: _Rows, problem: PlacementProblem, col: _Columns, t_x: np.ndarray, comm_edges: np.ndarray,
               *, x0: int = 0, c0: int | None = None) -> None:
    """(2) sum_c t_ic x_ic - C_i <= 0; (3) C_p + sum_c t_ic x_ic + d_e - C_i <= 0; (6) C_i - T <= 0 for sinks.
    x0 and c0: where the placement and finish-time columns start (default: x and C)."""
    n, src, dst = problem.num_tasks, problem.edge_src, problem.edge_dst
    c0 = col.c0 if c0 is None else c0
    ub.add(n, (col.rows_x, x0 + np.arange(col.num_x), t_x), (np.arange(n), c0 + np.arange(n), -1.0))
    num_e = problem.num_edges
    er, ec = col.x_of(dst)  # each edge's consumer's x columns
    ub.add(num_e, (er, x0 + ec, t_x[ec]), (np.arange(num_e), c0 + src, 1.0), (np.arange(num_e), c0 + dst, -1.0),
           (comm_edges, col.d0 + np.arange(len(comm_edges)), 1.0))
    sinks = np.setdiff1d(np.arange(n), src)
    ub.add(len(sinks), (np.arange(len(sinks)), c0 + sinks, 1.0), (np.arange(len(sinks)), col.t, -1.0))


def _memory(ub: _Rows, eq: _Rows, problem: PlacementProblem, col: _Columns, reps: np.ndarray, counts: np.ndarray, batch: int,
            scale: float, copies: int = 1, families: list = ()) -> int:
    """(8) for one shard (batch = Q): the load-balance LP's memory rows (bounds._memory_rows) on x.
    Returns the number of columns. A split batch (batch < Q) goes to `_whole_batch_rows`, the
    shard copies of a partition (copies > 1) to `_shared_weight_rows`."""
    if batch < problem.batch_size:
        return _whole_batch_rows(ub, eq, problem, col, reps, counts, batch, scale, families)
    if copies > 1:
        return _shared_weight_rows(ub, problem, col, reps, counts, copies, families)
    ub.extend(*_memory_rows(problem, list(reps), counts, col.rows_x, col.cols_x, first_row=ub.num, families=families))
    return col.t + 1


def _shared_weight_rows(ub: _Rows, problem: PlacementProblem, col: _Columns, reps: np.ndarray, counts: np.ndarray,
                        copies: int, families: list = ()) -> int:
    """(8) for `shard_copies` of `copies` shards (copy j's task i is task i + j n): columns
    y_ic after T, one per x column of copy 0 (class c runs task i in some shard), and rows

        x_(i + j n)c <= y_ic                                              each copy j     (8a)
        sum_i w_i y_ic + sum_j sum_i m_i b_j x_(i + j n)c <= m_c cap_c    each class c    (8b)

    (w: weights, m b_j: copy j's per-sample memory, where memory counts on c). Valid: a device
    holds the weights of every task it runs for any shard, at least once over the class, and
    the per-sample memory of each shard it runs the task for. Stronger than weights on copy 0's
    x alone (a copy that put more of the graph on a class than copy 0 would hold no weights for
    it). The same (8b) over each family of classes that share physical devices (bounds.
    physical_families). Returns the number of columns."""
    nx0 = col.num_x // copies  # the copies repeat copy 0's supported (task, class) pairs, in order
    n0 = problem.num_tasks // copies
    assert nx0 * copies == col.num_x and not (col.rows_x[:nx0] >= n0).any(), "not shard copies"
    y0 = col.t + 1
    idx = np.arange(col.num_x)
    ub.add(col.num_x, (idx, idx, 1.0), (idx, y0 + idx % nx0, -1.0))  # (8a)
    held = problem.mem_counts[col.rows_x, reps[col.cols_x]]
    weights = problem.weight_bytes[col.rows_x[:nx0]] * held[:nx0]
    per_sample = problem.mem_bytes_per_sample[col.rows_x] * held  # copies have batch 1, with b_j in m
    for pool, cap, count in memory_pools(problem, reps, counts, families):
        at0, at = np.flatnonzero(np.isin(col.cols_x[:nx0], pool)), np.flatnonzero(np.isin(col.cols_x, pool))
        ub.add(1, (np.zeros(len(at0), int), y0 + at0, per_capacity(weights[at0], cap)),
               (np.zeros(len(at), int), at, per_capacity(per_sample[at], cap)), rhs=np.array([count]))  # (8b)
    return y0 + nx0


def _whole_batch_rows(ub: _Rows, eq: _Rows, problem: PlacementProblem, col: _Columns, reps: np.ndarray, counts: np.ndarray,
                      batch: int, scale: float, families: list = ()) -> int:
    """The largest shard (x, `batch` samples) of a split batch, with the whole batch beside it.

    Columns y_ic (class c holds task i's weights), z_ic (the share of the batch's
    samples whose task i runs on c) and C'_i. Rows: x <= y, z <= y, z >= (b / Q) x,
    sum_c z_ic = 1; memory sum_i (w_i y_ic + m_i Q z_ic) <= m_c cap_c; load
    sum_i Q r_ic z_ic <= m_c T (r: per-sample rates, solve/bounds.py); and the path
    rows (2), (3), (6) for z with one-sample times and free transfers. Valid for a
    plan with shards X^s of b_s samples (the largest, x, has >= b): y = 1 where a
    device of c runs task i for some shard (it holds the weights), z = sum_s (b_s / Q)
    X^s; each device holds its weights once and the per-sample memory of the
    samples it runs. The path rows hold for each X^s at b_s >= 1 samples, and the
    least T meeting them is a convex function of the placement (it is an LP's value
    with the placement in its constraints), so they hold for the average z too.
    """
    q, nx, n = problem.batch_size, col.num_x, problem.num_tasks
    held = problem.mem_counts[col.rows_x, reps[col.cols_x]]
    weights = problem.weight_bytes[col.rows_x] * held
    per_sample = problem.mem_bytes_per_sample[col.rows_x] * held * q
    idx = np.arange(nx)
    ub.add(nx, (idx, idx, 1.0), (idx, col.y0 + idx, -1.0))  # x <= y
    ub.add(nx, (idx, col.z0 + idx, 1.0), (idx, col.y0 + idx, -1.0))  # z <= y
    ub.add(nx, (idx, idx, batch / q), (idx, col.z0 + idx, -1.0))  # (b / Q) x <= z
    eq.add(n, (col.rows_x, col.z0 + idx, 1.0), rhs=np.ones(n))
    for pool, cap, count in memory_pools(problem, reps, counts, families):
        at = np.flatnonzero(np.isin(col.cols_x, pool))
        zero = np.zeros(len(at), int)
        ub.add(1, (zero, col.y0 + at, per_capacity(weights[at], cap)), (zero, col.z0 + at, per_capacity(per_sample[at], cap)),
               rhs=np.array([count]))
    work = per_sample_rates(problem)[col.rows_x, reps[col.cols_x]] * q / scale
    ub.add(len(reps), (col.cols_x, col.z0 + idx, work), (np.arange(len(reps)), col.t, -counts))
    ub.extend(*family_time_rows(families, col.cols_x, work, col.t, ub.num, len(reps), col_offset=col.z0))
    one = task_times(problem, 1)[col.rows_x, reps[col.cols_x]] / scale
    c2 = col.z0 + nx  # C'_i
    _path_rows(ub, problem, col, one, np.zeros(0, int), x0=col.z0, c0=c2)
    return c2 + n


def _transfer_rows(ub: _Rows, comm_edges: np.ndarray, src: np.ndarray, dst: np.ndarray, col: _Columns,
                   into: np.ndarray, out: np.ndarray) -> None:
    """(4) x_ic - x_pc - u_ec <= 0 and x_pc - x_ic - v_ec <= 0; (5) sum_c a u - d <= 0, sum_c o v - d <= 0."""
    num_ce, num_c = len(comm_edges), col.num_classes
    xcol = np.full((col.num_tasks, num_c), -1)
    xcol[col.rows_x, col.cols_x] = np.arange(col.num_x)
    p, i = src[comm_edges], dst[comm_edges]
    pos = np.arange(num_ce)
    for c in range(num_c):
        terms_u = [(pos, col.u0 + pos * num_c + c, -1.0)]
        terms_v = [(pos, col.v0 + pos * num_c + c, -1.0)]
        for cols, sign in ((xcol[i, c], 1.0), (xcol[p, c], -1.0)):
            ok = cols >= 0
            terms_u.append((pos[ok], cols[ok], sign))
            terms_v.append((pos[ok], cols[ok], -sign))
        ub.add(num_ce, *terms_u)
        ub.add(num_ce, *terms_v)
    rep = np.repeat(pos, num_c)
    flat = np.arange(num_ce * num_c)
    ub.add(num_ce, (rep, col.u0 + flat, into[comm_edges].ravel()), (pos, col.d0 + pos, -1.0))
    ub.add(num_ce, (rep, col.v0 + flat, out[comm_edges].ravel()), (pos, col.d0 + pos, -1.0))


def path_lp_at_shards(problem: PlacementProblem, shards: int) -> float:
    """The path LP for plans of `shards` non-empty shards: its largest has >= ceil(Q / shards) samples."""
    return path_lp_bound(problem, math.ceil(problem.batch_size / shards))


# The partition bound (docs/objectives.md "Shard partitions"): how far it may go.
MAX_PARTITIONS = 64  # more partitions of Q into at most S parts: the bound is not computed
MAX_PARTITION_LPS = 16  # union LPs solved at most; the partitions left count with their cheap bound
MAX_PARTITION_TASKS = 4_000  # a union of more tasks (copies x tasks) counts with its cheap bound


def partitions(total: int, most: int, largest: int | None = None):
    """Every partition of `total` into at most `most` parts, parts in non-increasing order."""
    largest = total if largest is None else largest
    if total == 0:
        yield ()
        return
    if most == 0:
        return
    for first in range(min(total, largest), 0, -1):
        for rest in partitions(total - first, most - 1, first):
            yield (first, *rest)


def count_partitions(total: int, most: int) -> int:
    """len(list(partitions(total, most))), without listing them: p(n, k) = p(n, k - 1) + p(n - k, k)
    counts partitions of n into parts of size at most k, the same number as into at most k parts."""
    table = [[1] + [0] * total for _ in range(most + 1)]  # table[k][n]
    for k in range(1, most + 1):
        for n in range(1, total + 1):
            table[k][n] = table[k - 1][n] + (table[k][n - k] if n >= k else 0)
    return table[most][total]


def shard_copies(problem: PlacementProblem, sizes: tuple[int, ...]) -> PlacementProblem:
    """One copy of the graph per shard size, as a one-shard problem of one sample whose copy j
    takes task i's time and edge e's transfer time at sizes[j] samples; copy j's per-sample
    memory is that of sizes[j] samples, and only copy 0 holds weights (the path LP with
    `copies=len(sizes)` counts them where any copy runs the task)."""
    from dataclasses import replace

    from llm_planner.graph.ir import TaskGraph

    n = problem.num_tasks
    tasks, edges, pieces, comm, weights, per_sample = [], [], [], [], [], []
    for j, b in enumerate(sizes):
        tasks += [replace(t, name=f"{t.name}#{j}") for t in problem.graph.tasks]
        edges += [replace(e, src=f"{e.src}#{j}", dst=f"{e.dst}#{j}") for e in problem.graph.edges]
        piece = np.zeros((n, problem.num_devices, 1, 2))
        piece[:, :, 0, 0] = np.where(problem.supported, task_times(problem, b), 0.0)
        pieces.append(piece)
        comm.append(problem.comm_fixed + problem.comm_slope * b)
        weights.append(problem.weight_bytes if j == 0 else np.zeros(n))
        per_sample.append(problem.mem_bytes_per_sample * b)
    s = len(sizes)
    return replace(
        problem, graph=TaskGraph(name=f"{problem.graph.name}{list(sizes)}", tasks=tuple(tasks), edges=tuple(edges)),
        batch_size=1, max_shards=1, time_pieces=np.concatenate(pieces), supported=np.tile(problem.supported, (s, 1)),
        edge_src=np.concatenate([problem.edge_src + j * n for j in range(s)]),
        edge_dst=np.concatenate([problem.edge_dst + j * n for j in range(s)]),
        comm_fixed=np.concatenate(comm), comm_slope=np.zeros((s * problem.num_edges, *problem.comm_slope.shape[1:])),
        weight_bytes=np.concatenate(weights), mem_bytes_per_sample=np.concatenate(per_sample),
        mem_counts=np.tile(problem.mem_counts, (s, 1)), hop_s_per_sample=np.tile(problem.hop_s_per_sample, s),
    )


def partition_bound(problem: PlacementProblem, floor: float = 0.0, load=None) -> float:
    """A latency bound for a batch that may be split: min over the partitions P = (b_1 >= ... >= b_s)
    of Q into at most S parts of the path LP of `shard_copies(problem, P)`, each shard's own copy
    of the graph with all copies sharing the devices' time and memory (docs/objectives.md).

    Three bounds per partition, each at least the one before: cheap, LP(s) of the shard-count
    bound (`load(s)`, shard_lp_bound by default); light, the larger of that and the union LP
    without its head and tail rows; full, with them. With at most MAX_PARTITIONS partitions,
    every one is a candidate (`_best_first`); with more, one per number of shards
    (`_by_shard_count`). Once the least bound is at most `floor` (a bound the caller already
    has), the result is `floor`."""
    import functools

    from llm_planner.solve.bounds import shard_lp_bound

    q, most = problem.batch_size, min(problem.batch_size, problem.max_shards)
    if problem.objective != "latency" or most < 2:
        return floor
    load = load or functools.lru_cache(maxsize=None)(lambda s: shard_lp_bound(problem, s))
    if count_partitions(q, most) <= MAX_PARTITIONS:
        value = _best_first(problem, list(partitions(q, most)), load)
    else:
        value = _by_shard_count(problem, most, load, floor)
    return max(floor, value)


def _raise(problem: PlacementProblem, p: tuple[int, ...], value: float, stage: int) -> float:
    """A partition's bound after its light (stage 0 -> 1) or full (1 -> 2) union LP."""
    return max(value, path_lp_bound(shard_copies(problem, p), 1, head_tail=stage == 1, copies=len(p)))


def _best_first(problem: PlacementProblem, candidates: list[tuple[int, ...]], load) -> float:
    """The least bound over `candidates`: the one whose bound is least so far is raised to its next
    bound until that least one is final (full; or light once MAX_PARTITION_LPS full LPs were
    solved or when its union exceeds MAX_PARTITION_TASKS tasks). No other can then be lower, and
    candidates never reached keep their cheap bound without costing a union LP."""
    import heapq

    heap = [(load(len(p)), 0, p) for p in candidates]  # (bound, stage: 0 cheap, 1 light, 2 full, partition)
    heapq.heapify(heap)
    full_lps = 0
    while True:
        value, stage, p = heap[0]
        small = len(p) * problem.num_tasks <= MAX_PARTITION_TASKS
        if stage == 2 or not small or (stage == 1 and full_lps >= MAX_PARTITION_LPS):
            log.debug("partition bound: %d full union LPs, %.6g s, set by %s", full_lps, value, p)
            return value
        full_lps += stage == 1
        heapq.heapreplace(heap, (_raise(problem, p, value, stage), stage + 1, p))


def _by_shard_count(problem: PlacementProblem, most: int, load, floor: float) -> float:
    """Too many partitions: for each s, the sizes (ceil(Q / s), 1, ..., 1) stand for every partition
    into s parts (its largest part has at least ceil(Q / s) samples, the others at least 1, and the
    union LP only rises with the sizes: times by F1, per-sample memory). LP(s) rises with s
    (solve/bounds.py), so once LP(s) reaches the least bound found, no larger s can be lower; and
    once the least is at most `floor`, the caller's bound stands."""
    q, best, full_lps = problem.batch_size, math.inf, 0
    for s in range(1, most + 1):
        value = load(s)
        if value >= best or best <= floor:
            break
        p = (math.ceil(q / s),) + (1,) * (s - 1)
        if len(p) * problem.num_tasks > MAX_PARTITION_TASKS:
            best = min(best, value)
            break
        value = _raise(problem, p, value, 0)
        if value < best and full_lps < MAX_PARTITION_LPS:
            value, full_lps = _raise(problem, p, value, 1), full_lps + 1
        best = min(best, value)
    log.debug("partition bound by shard count: %d full union LPs, %.6g s", full_lps, best)
    return best
