"""The refinements of the path LP (bounds/path_lp.py) beyond its rows (1)-(8).

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


Pinned windows. A task that only one device can run is pinned (MILP-SPLIT's
module subproblems pin the module's input and output cuts). Every other device
must wait for data from a pinned ancestor before its first task and send its
results toward a pinned descendant before the end: with H_d and Q_d the least
such head and tail over the tasks d can run, d works at most T - H_d - Q_d, or
nothing (`pinned_heads_tails`, `windows`). Row (7) becomes

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
least b, for up to ENERGY_THRESHOLDS quantile values of each (`energy_rows`).
On the 64-task stage of RWNN BA 3x64 on four A100s, input and output on one, the
LP rises from 160.6 to 176.3 us (best plan known 198.3 us).

"""

from __future__ import annotations

import math

import numpy as np

from llm_planner.placement.bounds.path_rows import Columns, Rows
from llm_planner.placement.problem import PlacementProblem


def pinned_heads_tails(
    problem: PlacementProblem, batch: int, fast: np.ndarray, start: np.ndarray, late: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
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


def before_and_after(problem: PlacementProblem, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def windows(
    problem: PlacementProblem, head: np.ndarray, tail: np.ndarray, classes: list[list[int]], floor: float
) -> np.ndarray:
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


def energy_rows(
    ub: Rows,
    col: Columns,
    classes: list[list[int]],
    counts: np.ndarray,
    t_x: np.ndarray,
    head: np.ndarray,
    tail: np.ndarray,
    floor: float,
    scale: float,
) -> None:
    """(11) sum_{i in S_c(a, b)} t_ic x_ic <= m_c (T - min(a + b, floor)) for each class c and
    threshold pair (a, b), with S_c(a, b) the tasks whose head on c is at least a and whose tail
    on c is at least b.

    head[i, d] (tail[i, d]): the least time before task i can start on device d (from its
    finish there to the end), the larger of its earliest start by fastest times and its pinned
    head (`pinned_heads_tails`); a task's head on c is the least over c's devices. On a device
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


def head_tail_rows(
    ub: Rows, problem: PlacementProblem, col: Columns, t_x: np.ndarray, counts: np.ndarray, max_terms: int
) -> None:
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
        ii, ww = np.nonzero(
            related[chosen]
        )  # w is an ancestor (for the head) or a descendant (for the tail) of chosen[ii]
        of, xc = col.x_of(ww)  # the x columns of w
        cls = col.cols_x[xc]
        terms = [(ii[of] * nc + cls, xc, t_x[xc] / counts[cls])]
        if tail:
            terms += [(rows, col.c0 + chosen[rows // nc], 1.0), (rows, col.t, -1.0)]
        else:
            own = (
                pos[col.rows_x[own_x]][:, None] * nc + np.arange(nc)[None, :]
            )  # i's own time, in each of i's class rows
            terms += [(own, own_x[:, None], t_x[own_x][:, None]), (rows, col.c0 + chosen[rows // nc], -1.0)]
        ub.add(len(rows), *terms)
