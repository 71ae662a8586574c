"""A second upper bound on the output tokens/s of any serving plan: over levels of a replica's
concurrency C *and* of its mean micro-batch b = C / m, so that weights read once per
micro-batch, the round trip and Little's law all count.

Take a replica (stages s of k_s devices holding l_s layers, C sequences in flight, m
micro-batches of sizes that differ by at most one, mean b) serving R tokens/s. With a stage's
iteration at least step + l t(b') on a micro-batch of b' (t: one layer's time, the stage's
embedding, head and hand-offs dropped):

  busy     TPOT >= m (step + l_s t_lo)      (every micro-batch once; t_lo: least t near b)
  rate     R = C / TPOT <= b / (step + l_s t(b)), so each device does z = R l / k <= g(l),
           g(l) = b l / (k (step + l t(b))), concave in l: below each of its tangents
  trip     T >= TPOT >= round trip >= sum_s (step + l_s t_lo)
  Little   C = R TPOT >= R sum_s (step + l_s t_lo) = sum over its devices of z (step / l + t_lo)
  memory   l (w + C kv) <= M on every device

Cut C into levels [C_j, 1.25 C_j) and b into levels of one grid shared by every class
(1.5^i and the breakpoints of every measured profile). A device of class c in a stage of
degree k at level pair (j, i) holds at most l_max layers (memory at C_j, the busy period at
m >= C_j / b_hi); for each group (c, k, j, i) the LP has y devices, lam = sum of their l and
z = sum of their passes per second:

  max sum z / L
  s.t. z <= g(l_q) y + g'(l_q) (lam - l_q y)     for tangent points l_q   (rate, per device)
       y <= lam <= l_max y
       sum_{k,j,i} y <= N_c                                               (devices)
       per pair (j, i):  sum lam / k >= L u_ji,  sum_{k} y_c <= N_c u_ji  (a copy, u binary)
                         sum (step y + t_lo lam) / k <= (T / L) sum lam / k           (trip)
                         sum z (step / l_max + t_lo) <= (C_hi / L) sum lam / k        (Little)

Each row summed over the replicas at a pair holds for every plan (a replica's l / k add up to
L, so sum lam / k / L counts its replicas), hence the optimum bounds every plan. The rate uses b
at the top of its level and t there (the roofline's b / (step + l t(b)) grows with b); a measured
table, piecewise linear and maybe not monotone, uses its least value over the level instead.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from llm_planner.serving.classes import ServerClass
from llm_planner.serving.layout import CostCache

log = logging.getLogger(__name__)

C_RATIO = 1.25  # concurrency levels
B_RATIO = 1.5  # mean micro-batch levels
TANGENT_LAYERS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
NODE_LIMIT = 5_000  # the MILP stops after this many branch-and-bound nodes (its dual bound holds): the same
# bound on every machine, which verify recomputes
TIME_LIMIT_S = 300.0  # and, as a safety net only, after this long (the bound then depends on the machine: logged)


@dataclass(frozen=True)
class _Group:
    """Devices of one class and degree at one (concurrency, micro-batch) level pair."""

    class_name: str
    pair: tuple[int, int]
    k: int
    l_max: int
    step_s: float
    t_lo: float  # least layer time over the level (busy period, round trip, Little)
    b_hi: float
    t_rate: float  # layer time the rate uses at b_hi
    c_hi: float


def _batch_grid(cache: CostCache, classes: tuple[ServerClass, ...], top: float) -> list[float]:
    """b levels shared by every class: 1, 1.5, 2.25, ... and every measured breakpoint, up to top."""
    points = {1.0}
    for sc in classes:
        for costs in cache.shapes(sc):
            points |= {x for x in costs.layer_time.breakpoints if 1.0 < x < top}
    x = B_RATIO
    while x < top:
        points.add(x)
        x *= B_RATIO
    return sorted(points)


def _layer_times(costs, b_lo: float, b_hi: float) -> tuple[float, float]:
    """(least layer time for micro-batches of b_lo..b_hi sequences, the time the rate uses)."""
    t = costs.layer_time
    if not t.measured:  # the pieces: below the time, and b / t(b) on them grows with b
        return t.lower(b_lo), t.lower(b_hi)
    least = t.least(max(1.0, math.floor(b_lo)), math.ceil(b_hi))  # sizes differ by one around the mean
    return least, least


def _groups(cache: CostCache, classes: tuple[ServerClass, ...], tpot_slo_s: float) -> list[_Group]:
    num_layers, out, c = cache.tasks.num_layers, [], 1.0
    for j in range(10_000):
        c_hi, grid = c * C_RATIO, None
        level = []
        for sc in classes:
            for costs in cache.shapes(sc):
                k = costs.degree
                per_layer = costs.layer_bytes(c)
                l_mem = int(costs.usable_bytes // per_layer) if per_layer > 0 else num_layers
                if l_mem < 1:
                    continue
                grid = grid or _batch_grid(cache, classes, c_hi) + [c_hi]
                level += _pair_groups(costs, sc.name, k, j, c, c_hi, grid, min(l_mem, num_layers), tpot_slo_s)
        if grid is None:  # no device holds a layer at this concurrency: none at a larger one
            return out
        out += level
        c = c_hi
    return out


def _pair_groups(
    costs, name: str, k: int, j: int, c: float, c_hi: float, grid: list[float], l_mem: int, tpot_slo_s: float
) -> list[_Group]:
    out = []
    for i, (b_lo, b_hi) in enumerate(zip(grid, grid[1:])):
        t_lo, t_rate = _layer_times(costs, b_lo, b_hi)
        m_lo = max(1.0, c / b_hi)
        busy = tpot_slo_s / m_lo - costs.step_s  # what the busy period leaves the layers
        # a measured table may reach 0 (its end pieces are extended down to it): then only memory
        # and the busy period's steps limit the layers
        l_max = min(l_mem, math.floor(busy / t_lo + 1e-9)) if t_lo > 0 else (l_mem if busy >= 0 else 0)
        if l_max >= 1:
            out.append(_Group(name, (j, i), k, l_max, costs.step_s, t_lo, b_hi, t_rate, c_hi))
    return out


class SparseRows:
    """A sparse constraint matrix built row by row."""

    def __init__(self):
        self.r, self.c, self.v, self.lo, self.up = [], [], [], [], []

    def add(self, entries, lo: float, up: float) -> None:
        n = len(self.lo)
        for col, val in entries:
            self.r.append(n)
            self.c.append(col)
            self.v.append(val)
        self.lo.append(lo)
        self.up.append(up)

    def constraint(self, ncols: int) -> LinearConstraint:
        a = sparse.csr_matrix((self.v, (self.r, self.c)), shape=(len(self.lo), ncols))
        return LinearConstraint(a, self.lo, self.up)


def _rate_rows(rows: SparseRows, groups: list[_Group]) -> None:
    n = len(groups)
    for g, gr in enumerate(groups):
        y, lam, z = g, n + g, 2 * n + g
        for lq in [x for x in TANGENT_LAYERS if x < gr.l_max] + [gr.l_max]:
            den = gr.step_s + lq * gr.t_rate
            value, slope = gr.b_hi * lq / (gr.k * den), gr.b_hi * gr.step_s / (gr.k * den * den)
            rows.add([(z, 1.0), (lam, -slope), (y, -(value - slope * lq))], -np.inf, 0.0)
        rows.add([(lam, 1.0), (y, -float(gr.l_max))], -np.inf, 0.0)
        rows.add([(lam, 1.0), (y, -1.0)], 0.0, np.inf)


def _pair_rows(rows: SparseRows, groups: list[_Group], classes, num_layers: int, tpot_slo_s: float) -> int:
    """Devices, copies, round trips and Little's law; returns the number of binaries u."""
    n = len(groups)
    pairs: dict[tuple[int, int], list[int]] = {}
    for g, gr in enumerate(groups):
        pairs.setdefault(gr.pair, []).append(g)
    for sc in classes:
        rows.add([(g, 1.0) for g, gr in enumerate(groups) if gr.class_name == sc.name], -np.inf, sc.num_devices)
    for q, idx in enumerate(pairs.values()):
        u = 3 * n + q
        rows.add([(n + g, 1.0 / groups[g].k) for g in idx] + [(u, -float(num_layers))], 0.0, np.inf)
        for sc in classes:
            mine = [(g, 1.0) for g in idx if groups[g].class_name == sc.name]
            if mine:
                rows.add(mine + [(u, -float(sc.num_devices))], -np.inf, 0.0)
        per_layer = tpot_slo_s / num_layers
        rows.add(
            [(g, groups[g].step_s / groups[g].k) for g in idx]
            + [(n + g, (groups[g].t_lo - per_layer) / groups[g].k) for g in idx],
            -np.inf,
            0.0,
        )
        c_hi = groups[idx[0]].c_hi
        rows.add(
            [(2 * n + g, groups[g].step_s / groups[g].l_max + groups[g].t_lo) for g in idx]
            + [(n + g, -c_hi / (num_layers * groups[g].k)) for g in idx],
            -np.inf,
            0.0,
        )
    return len(pairs)


def batch_level_bound(cache: CostCache, classes: tuple[ServerClass, ...], tpot_slo_s: float) -> float:
    """Output tokens/s no plan exceeds (module docstring); inf when it cannot be solved."""
    groups = _groups(cache, classes, tpot_slo_s)
    if not groups:
        return 0.0
    if any(gr.step_s + gr.t_rate <= 0 for gr in groups):  # a layer of no time and no step: no rate limit
        return float("inf")
    rows = SparseRows()
    _rate_rows(rows, groups)
    n_u = _pair_rows(rows, groups, classes, cache.tasks.num_layers, tpot_slo_s)
    n = len(groups)
    value = np.zeros(3 * n)
    value[2 * n :] = 1.0 / cache.tasks.num_layers
    best = maximise_with_binaries(value, rows, n_u)
    return float("inf") if best is None else best


def maximise_with_binaries(value: np.ndarray, rows: SparseRows, n_binaries: int) -> float | None:
    """The most value @ x over x >= 0 and n_binaries binaries after them (within the rows): the
    optimum, 0 when nothing is feasible, HiGHS's dual bound when it stops at its node limit (it
    still holds), None when it has none."""
    return solve_with_binaries(value, rows, n_binaries, node_limit=NODE_LIMIT)[0]


def solve_with_binaries(
    value: np.ndarray,
    rows: SparseRows,
    n_binaries: int,
    rel_gap: float = 1e-4,
    time_limit_s: float = TIME_LIMIT_S,
    integers: list[int] | None = None,
    node_limit: int | None = None,
) -> tuple[float | None, np.ndarray | None]:
    """maximise_with_binaries's value and the solution it found (None when it has none), the
    columns listed in `integers` integer too. With `rel_gap` HiGHS stops once its dual bound is
    within that share of its best solution: the value is then the dual bound (still a bound), the
    solution the best one found."""
    n = len(value)
    integral = np.concatenate([np.zeros(n), np.ones(n_binaries)])
    integral[integers or []] = 1
    res = milp(
        np.concatenate([-value, np.zeros(n_binaries)]),
        constraints=rows.constraint(n + n_binaries),
        integrality=integral,
        bounds=Bounds(0, np.concatenate([np.full(n, np.inf), np.ones(n_binaries)])),
        options={"time_limit": time_limit_s, "mip_rel_gap": rel_gap}
        | ({"node_limit": node_limit} if node_limit is not None else {}),
    )
    dual = getattr(res, "mip_dual_bound", None)
    if res.status == 1 and "time" in str(res.message).lower():
        log.warning(
            "a bound MILP stopped at its %g s time limit: its dual bound holds but depends on the machine", time_limit_s
        )
    if res.status == 0:
        return (max(-res.fun, -dual) if dual is not None and np.isfinite(dual) else -res.fun), res.x
    if res.status == 2:
        return 0.0, None
    return (-dual if dual is not None and np.isfinite(dual) else None), None
