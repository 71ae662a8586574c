"""A fourth upper bound on the output tokens/s of any serving plan: the fleet's device prices and
one replica priced at a time (Farley's bound for column generation).

Let pi_c > 0 be a price per device of each class c (the search hands dual prices of its fleet
LP: among the optimal ones, those of llm_planner.serving.search.balanced_prices, each raised to at
least PRICE_FLOOR of the largest; the bound holds at any positive prices),
and rho the largest ratio, over every replica any plan may run, of its tokens/s to the price of
its devices. A plan runs replicas p, x_p copies each, within the N_c devices of every class, so

    sum_p v_p x_p  <=  rho sum_p x_p (price of p's devices)  <=  rho sum_c N_c pi_c.

With the LP's dual prices sum_c N_c pi_c is the fleet LP's value over the patterns the search
evaluated, and rho is 1 when no replica earns more than its devices are worth at those prices:
the bound is then the LP's value, and what rho exceeds 1 measures what the search may have missed.

rho is bounded by a best-first search over cells of (C, m, theta) (llm_planner.serving.bound_cells,
whose module docstring states the rows and why each holds for every replica in a cell): for one
replica in a cell its tokens/s is at most C_hi / theta_lo and the price of its devices at least the
optimum of a small MILP over its stages, per (class, degree) option o the stages n_o (integer),
their layers lam_o and end stages e_o (integer):

  min  sum_o k_o pi_c(o) n_o
  s.t. sum_o lam_o >= L,  n_o <= lam_o <= l_max_o n_o - (l_max_o - l_end_o) e_o,  e_o <= n_o,  sum_o e_o >= 1
       sum_o ((step + h) n_o + r_o lam_o) + t_end - h_max <= theta_hi          (round trip)
       sum_{o of class c} k_o n_o <= N_c                                           (one replica's devices)

(l_max_o: the layers a device of the option holds at C_lo beside the weights, and at most what its
busy period allows at theta_hi: m_lo (step + l t(b)) <= theta_hi with t's least value over the
micro-batch sizes the cell allows, and on the roofline m_lo step + l (m_lo f_j + s_j C_lo) <=
theta_hi for every piece j (Jensen); l_end_o: the same beside the smaller of the embedding's and
the head's weights, and, as the stage e_o holds the head, with the head's least time in its busy
period (bound_space.head_busy_s: the engine's time per sequence, s C_lo, among it); r_o: a layer's
least time at the round trip's micro-batch,
at least ceil(C_lo / m_hi) sequences.) A cell is first scored by its relaxation with fractional
stages (one option or two, in closed form) and its MILP solved only when it reaches the top of a
best-first search; a solved cell at the top is cut in two along its widest dimension (C at a C
where memory changes what a used option holds, else at its middle; m; theta), its parts keeping
its price until solved (a part where the cell's solution still fits has that price as its own,
and needs no MILP). Each MILP stops within MIP_GAP of its optimum; its dual bound is the price.
The search takes BATCH cells from its top at once and solves their MILPs side by side on THREADS
threads; the batches are fixed, so the value does not depend on the threads. The search stops
once the top score is within TARGET of 1, or within STOP_GAP of a plan's tokens/s, when the top
cell is as fine as cells get (its score stands), or once MAX_SOLVES MILPs are solved (checked
between batches). The value is the top score: the cells cover every (C, m, theta), so it bounds
rho. All deterministic: verify recomputes it from the prices the plan states. Left out, so the
bound only grows: workspace, the second end stage, the hand-off of micro-batches larger than the
cell's least, how the stages pack into servers, the TTFT target. What it cannot see is
integrality: a small cluster whose fleet LP runs a fraction of a replica keeps that fraction in
the bound (the cell bound, with whole copies, is the one for that).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

import highspy
import numpy as np

from llm_planner.serving.bound_space import (
    THETA_FINE,
    Cell,
    StageKind,
    busy_layers,
    end_time_s,
    head_busy_s,
    stage_kinds,
    start_cells,
)
from llm_planner.serving.classes import ServerClass
from llm_planner.serving.layout import CostCache

PRICE_FLOOR = 1e-3  # every class is priced at least this share of the dearest (rho needs prices > 0)
TARGET = 1.005  # stop once no cell may earn more than this ratio to its devices' prices
MAX_SOLVES = 3000  # and after this many per-cell MILPs
MIP_GAP = 0.01  # a cell's MILP stops within this share of its optimum (its dual bound is the price)
# HiGHS's options for a cell's MILP: without its primal heuristics and restarts, which took three
# quarters of a cell's time (its root node nearly always closes the gap); its dual bound still
# holds. An option a HiGHS release does not know is left at its default (they change speed only).
CELL_OPTIONS = {
    "output_flag": False,
    "mip_rel_gap": MIP_GAP,
    "mip_allow_restart": False,
    "mip_heuristic_run_feasibility_jump": False,
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_heuristic_run_root_reduced_cost": False,
}
STOP_GAP = 0.02  # or once the bound is within this share of the plan's tokens/s
BATCH = 16  # cells taken from the top of the search at once (their MILPs solved side by side)
THREADS = 2  # threads solving one batch's MILPs (the bound does not depend on it)
M_WEIGHT = 0.25  # a cell's range of m counts as its ratio to this power: parts along m score as their cell does


def floored(prices: dict[str, float]) -> dict[str, float] | None:
    """The prices the bound uses; None when none is positive (no pattern priced anything)."""
    top = max(prices.values(), default=0.0)
    if not top > 0 or not math.isfinite(top):
        return None
    return {c: max(float(v), PRICE_FLOOR * top) for c, v in prices.items()}


@dataclass(frozen=True)
class _Option:
    kind: StageKind
    l_max: int
    l_end: int
    r: float  # a layer's least time in the round trip
    hop_s: float  # the least hand-on of a micro-batch of the cell's least size


def _options(kinds: list[StageKind], cell: Cell, num_layers: int) -> list[_Option]:
    b_lo, b_hi = cell.b_range()
    out = []
    for kd in kinds:
        c = kd.costs
        per_layer = c.layer_bytes(cell.c_lo)
        busy_tau = c.layer_time.least(max(1.0, b_lo - 1), b_hi)  # micro-batches differ by one
        memory = math.floor(c.usable_bytes / per_layer + 1e-9)
        l_max = min(num_layers, memory, busy_layers(c, cell, busy_tau, roofline=True))
        r = c.layer_time.least(b_lo, b_hi)
        if not c.layer_time.measured and cell.m_hi:
            r = max([r] + [f + s * cell.c_lo / cell.m_hi for f, s in c.pieces["block"]])
        if l_max < 1:
            continue
        l_end = min(l_max, math.floor((c.usable_bytes - kd.end_bytes) / per_layer + 1e-9))
        l_end = min(l_end, busy_layers(c, cell, busy_tau, head_busy_s(c, cell), roofline=True))
        out.append(_Option(kd, l_max, max(0, l_end), r, kd.hop_s(b_lo)))
    return out


class _Pricer:
    """The least price of one replica's devices in a cell (module docstring)."""

    def __init__(
        self, kinds: list[StageKind], classes: tuple[ServerClass, ...], prices: dict, num_layers: int, pool: Executor
    ):
        self.kinds, self.prices, self.num_layers, self.pool = kinds, prices, num_layers, pool
        self.capacity = {sc.name: sc.num_devices for sc in classes}
        self.solves = 0
        self._local = threading.local()
        self._seen: dict[Cell, tuple[list[_Option], float]] = {}

    def _of(self, cell: Cell) -> tuple[list[_Option], float]:
        """The cell's stage options and the least time of its end stages (each cell is scored,
        checked and solved, so computed once)."""
        got = self._seen.get(cell)
        if got is None:
            got = self._seen[cell] = (_options(self.kinds, cell, self.num_layers), end_time_s(self.kinds, cell))
        return got

    def _price(self, o: _Option) -> float:
        return o.kind.k * self.prices[o.kind.class_name]

    def quick(self, cell: Cell) -> float:
        """A price no replica of the cell is below (0: none fits): the MILP's relaxation with
        fractional stages, no end stage and no device rows, whose optimum takes one option or two
        (layers and round trip are its only rows): a stage's price and fixed time spread over its
        l_max layers."""
        options, end_s = self._of(cell)
        if not options:
            return 0.0
        time = cell.t_hi + max(o.hop_s for o in options) - end_s
        per_layer = sorted(((o.kind.costs.step_s + o.hop_s) / o.l_max + o.r, self._price(o) / o.l_max) for o in options)
        share = time / self.num_layers  # the mean time a layer may take
        best = math.inf
        for i, (w_fast, c_fast) in enumerate(per_layer):
            if w_fast <= share:
                best = min(best, c_fast)
                for w_slow, c_slow in per_layer[i + 1 :]:
                    if w_slow > share and c_slow < c_fast:  # the slow one's layers as far as time allows
                        x = (share - w_fast) / (w_slow - w_fast)
                        best = min(best, c_fast + x * (c_slow - c_fast))
        return self.num_layers * best if best < math.inf else 0.0

    def exact(self, cells: list[Cell]) -> list[tuple[float, list[int], tuple]]:
        """Per cell the MILP's dual bound (0: no replica fits the cell), the C at which memory
        changes what a used option holds (where to cut the cell) and the solution found (see
        `still_fits`). The MILPs are solved on THREADS threads (HiGHS runs without Python's lock);
        each result is its cell's alone, so the values do not depend on the threads."""
        models = [self._model(cell) for cell in cells]
        todo = [m for m in models if m is not None]
        self.solves += len(todo)
        solved = iter(list(self.pool.map(lambda m: _solve_cell(self._solver(), *m[1:]), todo)))
        out = []
        for cell, model in zip(cells, models):
            out.append((0.0, [], ()) if model is None else self._read(cell, model[0], *next(solved)))
        return out

    def _solver(self) -> highspy.Highs:
        """This thread's HiGHS (one instance is not safe to share between threads)."""
        h = getattr(self._local, "highs", None)
        if h is None:
            h = self._local.highs = highspy.Highs()
            for name, value in CELL_OPTIONS.items():  # output_flag first: an unknown option stays quiet
                h.setOptionValue(name, value)
        return h

    def _model(self, cell: Cell) -> tuple | None:
        """The cell's options and its MILP's prices and rows (module docstring); None when no
        option fits."""
        options, end_s = self._of(cell)
        if not options:
            return None
        n = len(options)
        a, lo, hi = [], [], []

        def row(terms, low, high):
            r = np.zeros(3 * n)
            for i, v in terms:
                r[i] += v
            a.append(r)
            lo.append(low)
            hi.append(high)

        row([(n + i, 1.0) for i in range(n)], self.num_layers, np.inf)
        row([(2 * n + i, 1.0) for i in range(n)], 1.0, np.inf)
        trip = []
        for i, o in enumerate(options):
            row([(n + i, 1.0), (i, -float(o.l_max)), (2 * n + i, float(o.l_max - o.l_end))], -np.inf, 0.0)
            row([(2 * n + i, 1.0), (i, -1.0)], -np.inf, 0.0)
            row([(n + i, 1.0), (i, -1.0)], 0.0, np.inf)
            trip += [(i, o.kind.costs.step_s + o.hop_s), (n + i, o.r)]
        hop_max = max(o.hop_s for o in options)
        row(trip, -np.inf, cell.t_hi + hop_max - end_s)
        for name, devices in self.capacity.items():
            mine = [(i, float(o.kind.k)) for i, o in enumerate(options) if o.kind.class_name == name]
            if mine:
                row(mine, -np.inf, float(devices))
        return options, np.array([self._price(o) for o in options]), a, lo, hi

    def _read(self, cell: Cell, options: list[_Option], fits: bool, value, x) -> tuple[float, list[int], tuple]:
        if not fits:
            return 0.0, [], ()
        if value is None:  # HiGHS gave no bound: the cheap one holds
            return self.quick(cell), [], ()
        n, breaks, used = len(options), [], []
        if x is not None:
            for i, o in enumerate(options):
                if x[i] > 0.5:
                    breaks += o.kind.breaks(max(1, math.ceil(x[n + i] / x[i] - 1e-6)))
                    used.append((id(o.kind), round(x[i]), x[n + i], round(x[2 * n + i])))
        return float(value), sorted(set(breaks)), tuple(used)

    def still_fits(self, cell: Cell, used: tuple) -> bool:
        """Whether a solution of a larger cell's MILP (`exact`) is one of this cell's: its price, the
        larger cell's least, is then this cell's least too, with no MILP to solve."""
        if not used:
            return False
        listed, end_s = self._of(cell)
        options = {id(o.kind): o for o in listed}
        if any(kind not in options for kind, *_ in used):
            return False
        trip = end_s - max(o.hop_s for o in options.values())
        for kind, stages, layers, ends in used:
            o = options[kind]
            if layers > o.l_max * stages - (o.l_max - o.l_end) * ends + 1e-6:
                return False
            trip += (o.kind.costs.step_s + o.hop_s) * stages + o.r * layers
        return trip <= cell.t_hi * (1 + 1e-9)


def _solve_cell(h: highspy.Highs, price: np.ndarray, a: list, lo: list, hi: list) -> tuple[bool, float | None, object]:
    """A cell's MILP (`_Pricer._model`: stages, then layers, then end stages per option; the stages
    and end stages integer) solved by HiGHS: whether it is feasible, its dual bound (None: HiGHS
    gave none) and the solution found (None: none). Its costs are not negative, so HiGHS's
    "unbounded or infeasible" is infeasible."""
    n = len(price)
    rows = np.array(a)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = 3 * n, len(rows)
    lp.col_cost_ = np.concatenate([price, np.zeros(2 * n)])
    lp.col_lower_, lp.col_upper_ = np.zeros(3 * n), np.full(3 * n, highspy.kHighsInf)
    lp.row_lower_ = np.maximum(np.array(lo, dtype=float), -highspy.kHighsInf)
    lp.row_upper_ = np.minimum(np.array(hi, dtype=float), highspy.kHighsInf)
    nonzero = rows != 0
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))])
    lp.a_matrix_.index_, lp.a_matrix_.value_ = np.nonzero(nonzero)[1], rows[nonzero]
    whole, part = highspy.HighsVarType.kInteger, highspy.HighsVarType.kContinuous
    lp.integrality_ = [whole] * n + [part] * n + [whole] * n
    h.clearModel()
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    if status in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible):
        return False, None, None
    info = h.getInfo()
    x = np.array(h.getSolution().col_value) if info.primal_solution_status == 2 else None
    bound = info.mip_dual_bound
    return True, (float(bound) if math.isfinite(bound) and bound > 0 else None), x


def halves(cell: Cell, breaks: list[int]) -> list[Cell]:
    """The cell cut in two along its widest dimension (by ratio): C at the break nearest its middle
    (a C where memory changes what an option holds) or at its middle; m and theta at their middles.
    [cell] when it is as fine as cells get (one C, one m, theta within THETA_FINE)."""
    widths = [
        cell.c_hi / cell.c_lo if cell.c_hi > cell.c_lo else 1.0,
        (cell.m_hi / cell.m_lo if cell.m_hi else 4.0) ** M_WEIGHT if cell.m_hi != cell.m_lo else 1.0,
        cell.t_hi / cell.t_lo if cell.t_hi / cell.t_lo > THETA_FINE else 1.0,
    ]
    axis = max(range(3), key=lambda i: widths[i])
    if widths[axis] <= 1.0:
        return [cell]
    if axis == 0:
        mid = math.sqrt(cell.c_lo * cell.c_hi)
        inside = [c for c in breaks if cell.c_lo <= c < cell.c_hi]
        cut = min(inside, key=lambda c: abs(math.log((c + 0.5) / mid))) if inside else min(int(mid), cell.c_hi - 1)
        return [dataclasses.replace(cell, c_hi=cut), dataclasses.replace(cell, c_lo=cut + 1)]
    if axis == 1:
        cut = 2 * cell.m_lo - 1 if not cell.m_hi else (cell.m_lo + cell.m_hi) // 2
        low, high = dataclasses.replace(cell, m_hi=cut), dataclasses.replace(cell, m_lo=cut + 1)
        return [low] + ([high] if high.m_lo <= high.c_hi else [])
    mid = math.sqrt(cell.t_lo * cell.t_hi)
    return [dataclasses.replace(cell, t_hi=mid), dataclasses.replace(cell, t_lo=mid)]


def _score(cell: Cell, price: float) -> float:
    """A cell's tokens/s over the least price of a replica's devices in it."""
    return cell.c_hi / cell.t_lo / price


def best_ratio(
    cache: CostCache,
    classes: tuple[ServerClass, ...],
    tpot_slo_s: float,
    links,
    prices: dict[str, float],
    enough: float = TARGET,
) -> float:
    """An upper bound on rho (module docstring) for prices already floored (all positive); the
    search stops once it is at most `enough` (or TARGET)."""
    kinds = stage_kinds(cache, classes, links)
    if not kinds:
        return 0.0
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        return _search(_Pricer(kinds, classes, prices, cache.tasks.num_layers, pool), classes, tpot_slo_s, enough)


def _search(pricer: _Pricer, classes: tuple[ServerClass, ...], tpot_slo_s: float, enough: float) -> float:
    """The best-first search over cells (module docstring): its top score once it stops."""
    heap: list[tuple] = []
    ties = itertools.count()  # first pushed first among equal scores: deterministic

    def push(cell: Cell, price: float, exact: bool, breaks: list[int], used: tuple = ()) -> None:
        if price > 0:  # 0: no replica fits the cell
            heapq.heappush(heap, (-_score(cell, price), next(ties), price, exact, cell, breaks, used))

    for cell in start_cells(pricer.kinds, classes, pricer.num_layers, tpot_slo_s):
        push(cell, pricer.quick(cell), False, [])
    stop = max(enough, TARGET)
    while heap and -heap[0][0] > stop and pricer.solves < MAX_SOLVES:
        rough, solved = [], []  # cells to price by their MILPs; priced cells to cut, with their parts
        while heap and -heap[0][0] > stop and len(rough) + len(solved) < BATCH:
            entry = heapq.heappop(heap)
            _, _, price, exact, cell, breaks, used = entry
            parts = halves(cell, breaks) if exact else None
            if parts == [cell]:  # as fine as cells get: its score stands
                heapq.heappush(heap, entry)
                break
            if exact:
                solved.append((price, breaks, used, parts))
            else:
                rough.append(cell)
        if not rough and not solved:
            break
        for cell, result in zip(rough, pricer.exact(rough)):
            push(cell, result[0], True, *result[1:])
        for price, breaks, used, parts in solved:
            for part in parts:  # a part's replicas are its cell's: they cost at least as much
                if pricer.still_fits(part, used):
                    push(part, price, True, breaks, used)
                else:
                    push(part, max(price, pricer.quick(part)), False, [])
    return -heap[0][0] if heap else 0.0


def price_bound(
    cache: CostCache,
    classes: tuple[ServerClass, ...],
    tpot_slo_s: float,
    links,
    prices: dict[str, float] | None,
    tokens_per_s: float = 0.0,
) -> float:
    """Output tokens/s no plan exceeds (module docstring); inf without a positive price. With a
    plan's `tokens_per_s`, the search for rho stops once the bound is within STOP_GAP of it."""
    usable = floored({sc.name: (prices or {}).get(sc.name, 0.0) for sc in classes})
    if usable is None:
        return float("inf")
    worth = sum(sc.num_devices * usable[sc.name] for sc in classes)  # the fleet LP's value at these prices
    enough = tokens_per_s / ((1 - STOP_GAP) * worth)
    return best_ratio(cache, classes, tpot_slo_s, links, usable, enough) * worth
