"""The rows (1)-(8) of the path LP (bounds/path_lp.py has the model and its proof),
its column layout and its sparse row blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse

from llm_planner.placement.bounds.device_classes import family_time_rows, memory_pools, memory_rows, per_capacity
from llm_planner.placement.bounds.times import per_sample_rates, task_times
from llm_planner.placement.problem import PlacementProblem


class Rows:
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
        """Rows built elsewhere with absolute row indices starting at self.num (e.g. classes.memory_rows)."""
        self.parts += parts
        self.rhs += rhs
        self.num += sum(len(r) for r in rhs)

    def matrix(self, num_cols: int) -> tuple[scipy.sparse.csr_matrix, np.ndarray]:
        r, c, v = (np.concatenate(x) for x in zip(*self.parts))
        return scipy.sparse.csr_matrix((v, (r, c)), shape=(self.num, num_cols)), np.concatenate(self.rhs)


def least_transfers(problem: PlacementProblem, classes: list[list[int]], batch: int) -> tuple[np.ndarray, np.ndarray]:
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
class Columns:
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


def path_rows(
    ub: Rows,
    problem: PlacementProblem,
    col: Columns,
    t_x: np.ndarray,
    comm_edges: np.ndarray,
    *,
    x0: int = 0,
    c0: int | None = None,
) -> None:
    """(2) sum_c t_ic x_ic - C_i <= 0; (3) C_p + sum_c t_ic x_ic + d_e - C_i <= 0; (6) C_i - T <= 0 for sinks.
    x0 and c0: where the placement and finish-time columns start (default: x and C)."""
    n, src, dst = problem.num_tasks, problem.edge_src, problem.edge_dst
    c0 = col.c0 if c0 is None else c0
    ub.add(n, (col.rows_x, x0 + np.arange(col.num_x), t_x), (np.arange(n), c0 + np.arange(n), -1.0))
    num_e = problem.num_edges
    er, ec = col.x_of(dst)  # each edge's consumer's x columns
    ub.add(
        num_e,
        (er, x0 + ec, t_x[ec]),
        (np.arange(num_e), c0 + src, 1.0),
        (np.arange(num_e), c0 + dst, -1.0),
        (comm_edges, col.d0 + np.arange(len(comm_edges)), 1.0),
    )
    sinks = np.setdiff1d(np.arange(n), src)
    ub.add(len(sinks), (np.arange(len(sinks)), c0 + sinks, 1.0), (np.arange(len(sinks)), col.t, -1.0))


def path_memory_rows(
    ub: Rows,
    eq: Rows,
    problem: PlacementProblem,
    col: Columns,
    reps: np.ndarray,
    counts: np.ndarray,
    batch: int,
    scale: float,
    copies: int = 1,
    families: list = (),
) -> int:
    """(8) for one shard (batch = Q): the load-balance LP's memory rows (classes.memory_rows) on x.
    Returns the number of columns. A split batch (batch < Q) goes to `_whole_batch_rows`, the
    shard copies of a partition (copies > 1) to `_shared_weight_rows`."""
    if batch < problem.batch_size:
        return _whole_batch_rows(ub, eq, problem, col, reps, counts, batch, scale, families)
    if copies > 1:
        return _shared_weight_rows(ub, problem, col, reps, counts, copies, families)
    ub.extend(*memory_rows(problem, list(reps), counts, col.rows_x, col.cols_x, first_row=ub.num, families=families))
    return col.t + 1


def _shared_weight_rows(
    ub: Rows,
    problem: PlacementProblem,
    col: Columns,
    reps: np.ndarray,
    counts: np.ndarray,
    copies: int,
    families: list = (),
) -> int:
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
        ub.add(
            1,
            (np.zeros(len(at0), int), y0 + at0, per_capacity(weights[at0], cap)),
            (np.zeros(len(at), int), at, per_capacity(per_sample[at], cap)),
            rhs=np.array([count]),
        )  # (8b)
    return y0 + nx0


def _whole_batch_rows(
    ub: Rows,
    eq: Rows,
    problem: PlacementProblem,
    col: Columns,
    reps: np.ndarray,
    counts: np.ndarray,
    batch: int,
    scale: float,
    families: list = (),
) -> int:
    """The largest shard (x, `batch` samples) of a split batch, with the whole batch beside it.

    Columns y_ic (class c holds task i's weights), z_ic (the share of the batch's
    samples whose task i runs on c) and C'_i. Rows: x <= y, z <= y, z >= (b / Q) x,
    sum_c z_ic = 1; memory sum_i (w_i y_ic + m_i Q z_ic) <= m_c cap_c; load
    sum_i Q r_ic z_ic <= m_c T (r: per-sample rates, bounds/times.py); and the path
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
        ub.add(
            1,
            (zero, col.y0 + at, per_capacity(weights[at], cap)),
            (zero, col.z0 + at, per_capacity(per_sample[at], cap)),
            rhs=np.array([count]),
        )
    work = per_sample_rates(problem)[col.rows_x, reps[col.cols_x]] * q / scale
    ub.add(len(reps), (col.cols_x, col.z0 + idx, work), (np.arange(len(reps)), col.t, -counts))
    ub.extend(*family_time_rows(families, col.cols_x, work, col.t, ub.num, len(reps), col_offset=col.z0))
    one = task_times(problem, 1)[col.rows_x, reps[col.cols_x]] / scale
    c2 = col.z0 + nx  # C'_i
    path_rows(ub, problem, col, one, np.zeros(0, int), x0=col.z0, c0=c2)
    return c2 + n


def transfer_rows(
    ub: Rows, comm_edges: np.ndarray, src: np.ndarray, dst: np.ndarray, col: Columns, into: np.ndarray, out: np.ndarray
) -> None:
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
