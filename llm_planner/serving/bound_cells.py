"""A third upper bound on the output tokens/s of any serving plan: every replica priced whole,
over cells of its concurrency C, micro-batches m and TPOT theta, refined where the optimum lies.

The bounds of llm_planner.serving.bound and bound_batches let each device run at its own best
rate; in a replica every stage serves the same tokens/s, so a fast class cannot run ahead of the
slow stages of its own pipeline. Here a replica is described by (C, m, theta), its tokens/s is
exactly C / theta, and every stage must fit that one operating point.

Take a replica of any plan (stages s of k_s devices of class c_s holding l_s >= 1 layers, C
sequences in flight in m micro-batches, TPOT theta <= T; llm_planner.serving.replica). With
t(b) = max_j (f_j + s_j b) one layer's time on b sequences (the roofline's pieces; a measured
table: its least value over the micro-batches the cell allows, tau), w a layer's weights and kv
one sequence's KV cache of a layer per device, M the usable memory, F the smaller of the
embedding's and the head's weights:

  memory   l_s (w + C kv) <= M,  and l_s <= floor(M / (w + C kv))
  busy     m (step + l_s t(C / m)) <= theta             (Jensen: t is convex in b)
  trip     sum_s (step + h + l_s t(C / m)) - h_max + t_end <= theta
  end      one stage holds the head: l_s (w + C kv) + F <= M, and its busy period carries the
           head's least time H (head_busy_s: m_lo f + s C_lo on each piece of the final norm's
           and the head's time, the engine's time per sequence among them)
  cover    sum_s l_s = L,  sum_s l_s C = L C

(h: the least time a stage hands on a micro-batch of at least the cell's least size b_lo =
ceil(C_lo / m_hi) sequences, latency and bytes over the fastest link it may use (inside its server
only where the server holds two stages of its degree; 0 on a one-server cluster of several
classes, where a hand-off between classes may take the cheapest link), h_max the largest, so
that the last stage, which hands back only the new tokens, is charged none; t_end: the least
embedding plus the least head time.) A cell is a box C in [C_lo, C_hi], m in [m_lo, m_hi],
theta in [theta_lo, theta_hi]. For each cell the LP has x (copies) and K (their sequences in
flight, sum of C), and per stage option (class, degree) lam (layers), mu (layers times C), n
(stages), e (end stages) and W (layer time):

  max  sum_cells K / theta_lo
  s.t. C_lo x <= K <= C_hi x,  sum lam >= L x,  sum mu >= L K,  mu >= C_lo lam
       W >= tau lam,  W >= f_j lam + s_j mu / m_hi                        (layer time)
       m_lo step n + m_lo f_j lam + s_j mu <= theta_hi n                  (busy, roofline)
       sum ((step + h) n + W) + (t_end - h_max - theta_hi) x <= 0         (round trip)
       w lam + kv mu + F e <= M n,  lam <= l_max n - (l_max - l_end) e      (memory)
       e <= n,  sum e >= x                                                (head stages)
       sum over cells and degrees k n <= N_c                              (devices)
       mu >= C_hi lam + U (K - C_hi x)                                    (one C per replica)
       x integer

(l_max: the floor above at C_lo, and the busy row's floor at theta_hi / m_lo with tau taken down to
b_lo - 1, as micro-batches differ by one; l_end the
same less F and with H in the busy period, whose rows carry H e; U the most layers one replica
puts on the option, min(L, l_max floor(N_c / k)).)
Every row summed over the replicas of a plan in one cell holds with x their number, K their
sequences, n and e their stage counts, lam their layers, mu their layers times C, so the optimum
bounds every plan. The row "one C per replica" is McCormick's for mu = C lam on one replica
(C <= C_hi, lam <= U), summed over the cell's replicas: it keeps the LP from giving the option
whose memory binds fewer sequences per layer than the others. C is an integer, so the cells are
integer ranges; they start coarse (C in [2^j, 2^(j+1) - 1], m in [1], [2], [3, 4], ..., theta
in ratios of 1.25 up to the target). Every cell a round's optimum uses is cut along C where a
class it uses can no longer hold the layers a device it gives them (so that the cell's l_max
holds for all its C; else in the middle), in two along m and in four along theta, and the MILP
is solved again, within a number of rounds, of cells and of columns over all rounds (a
round's time grows with them). Each round's value is a bound (the cells always cover every
(C, m, theta)): its MILP stops within 3% of its optimum or after ROUND_NODE_LIMIT nodes and its
dual bound is the value, both deterministic, so verify recomputes the same value; past the node
limit the refinement stops. Left out, so
the bound only grows: workspace, the second end stage, the hand-off of micro-batches larger
than b_lo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llm_planner.serving.bound_batches import SparseRows, solve_with_binaries
from llm_planner.serving.bound_space import (
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

ROUNDS = 8  # refinement rounds at most
MAX_CELLS = 600  # stop refining past this many cells
WORK_LIMIT = 100_000  # and before a round whose columns, added to the rounds' before it, pass this
ROUND_NODE_LIMIT = 500  # one round's MILP stops after this many branch-and-bound nodes (its dual bound holds)
ROUND_TIME_LIMIT_S = 60.0  # and, as a safety net only, after this long (the bound then depends on the machine)
REL_GAP = 0.03  # each round's MILP stops within 3% of its optimum (its dual bound is the value)


@dataclass(frozen=True)
class _Option:
    kind: StageKind
    l_max: int
    l_end: int
    tau: float
    hop_s: float  # the least hand-on of a micro-batch of the cell's least size
    head_s: float  # the head's least time per TPOT on the stage that holds it (head_busy_s)


def _options(kinds: list[StageKind], cell: Cell, num_layers: int) -> list[_Option]:
    b_lo, b_hi = cell.b_range()
    out = []
    for kd in kinds:
        costs = kd.costs
        tau = costs.layer_time.least(b_lo, b_hi)
        busy_tau = costs.layer_time.least(max(1.0, b_lo - 1), b_hi)  # micro-batches differ by one
        per_layer = costs.layer_bytes(cell.c_lo)
        l_max = min(num_layers, math.floor(costs.usable_bytes / per_layer + 1e-9), busy_layers(costs, cell, busy_tau))
        if l_max < 1:
            continue
        head_s = head_busy_s(costs, cell)  # the head stage's busy period carries the head too
        l_end = min(l_max, math.floor((costs.usable_bytes - kd.end_bytes) / per_layer + 1e-9))
        l_end = min(l_end, busy_layers(costs, cell, busy_tau, head_s))
        out.append(_Option(kd, l_max, max(0, l_end), tau, kd.hop_s(b_lo), head_s))
    return out


def _may_hold_a_copy(options: list[_Option], capacity: dict[str, int], num_layers: int, time_s: float) -> bool:
    """Whether one copy fits the cell at all: the model's layers within every device's layers, and
    within the time, each layer at its least time (a stage's fixed cost spread over its l_max layers)."""
    if not options:
        return False
    room = {}
    for o in options:
        room[o.kind.class_name] = max(
            room.get(o.kind.class_name, 0.0), capacity[o.kind.class_name] * o.l_max / o.kind.k
        )
    fastest = min(o.tau + o.kind.costs.step_s / o.l_max for o in options)
    return sum(room.values()) >= num_layers and num_layers * fastest <= time_s * (1 + 1e-9)


class _Model:
    """The MILP of the module docstring over a list of cells."""

    def __init__(self, kinds, classes, cells: list[Cell], num_layers: int):
        self.rows, self.value, self.x_of, self.integers = SparseRows(), [], [], []
        self.kinds, self.num_layers = kinds, num_layers
        self.capacity = {sc.name: sc.num_devices for sc in classes}
        self.device_terms: dict[str, list] = {sc.name: [] for sc in classes}
        self.stages_of: list[list[tuple[StageKind, int, int]]] = []  # per cell: (option's kind, its lam and n columns)
        for cell in cells:
            self._cell(cell)
        for sc in classes:
            self.rows.add(self.device_terms[sc.name], -np.inf, float(sc.num_devices))

    def _column(self, value: float, integer: bool = False) -> int:
        self.value.append(value)
        if integer:
            self.integers.append(len(self.value) - 1)
        return len(self.value) - 1

    def _cell(self, cell: Cell) -> None:
        options = _options(self.kinds, cell, self.num_layers)
        end_s = end_time_s(self.kinds, cell)
        self.stages_of.append([])
        if not _may_hold_a_copy(options, self.capacity, self.num_layers, cell.t_hi - end_s):
            self.x_of.append(None)
            return
        x, seqs = self._column(0.0, integer=True), self._column(1.0 / cell.t_lo)
        self.x_of.append(x)
        self.rows.add([(seqs, 1.0), (x, -cell.c_lo)], 0.0, np.inf)
        self.rows.add([(seqs, 1.0), (x, -cell.c_hi)], -np.inf, 0.0)
        hop_max = max(o.hop_s for o in options)
        cover, ends = [(x, -float(self.num_layers))], [(x, -1.0)]
        seq_layers = [(seqs, -float(self.num_layers))]
        trip = [(x, end_s - hop_max - cell.t_hi)]
        for o in options:
            lam, mu = self._column(0.0), self._column(0.0)
            n, e = self._column(0.0), self._column(0.0)
            self.stages_of[-1].append((o.kind, lam, n))
            costs = o.kind.costs
            cover.append((lam, 1.0))
            seq_layers.append((mu, 1.0))
            trip += [(n, costs.step_s + o.hop_s), (self._layer_time(cell, o, (lam, mu, n, e)), 1.0)]
            ends.append((e, 1.0))
            self.rows.add([(lam, 1.0), (n, -float(o.l_max)), (e, float(o.l_max - o.l_end))], -np.inf, 0.0)
            self.rows.add([(e, 1.0), (n, -1.0)], -np.inf, 0.0)
            self.rows.add([(mu, 1.0), (lam, -cell.c_lo)], 0.0, np.inf)
            most = float(min(self.num_layers, o.l_max * (self.capacity[o.kind.class_name] // o.kind.k)))
            self.rows.add([(mu, 1.0), (lam, -cell.c_hi), (seqs, -most), (x, most * cell.c_hi)], 0.0, np.inf)
            room = costs.usable_bytes  # llm_planner.cost.memory's l W + l C KV + ends, over the columns
            memory = [(lam, costs.weight_bytes["block"] / room), (mu, costs.kv_bytes_per_seq / room)]
            self.rows.add(memory + [(e, o.kind.end_bytes / room), (n, -1.0)], -np.inf, 0.0)
            self.device_terms[o.kind.class_name].append((n, float(o.kind.k)))
        self.rows.add(cover, 0.0, np.inf)
        self.rows.add(seq_layers, 0.0, np.inf)
        self.rows.add(trip, -np.inf, 0.0)
        self.rows.add(ends, 0.0, np.inf)

    def _layer_time(self, cell: Cell, o: _Option, columns: tuple[int, int, int, int]) -> int:
        """A column w >= the stages' layer time per iteration, sum over stages of l t(C / m): at
        least tau lam, and on the roofline (t = max_j f_j + s_j b, b >= C / m) at least
        f_j lam + s_j mu / m_hi for every piece j. On the roofline the stages' busy periods too:
        m (step + l t(C / m)) <= theta, the head stage's with the head's least time H
        (head_busy_s), so m_lo step n + m_lo f_j lam + s_j mu + H e <= theta_hi n."""
        lam, mu, n, e = columns
        w = self._column(0.0)
        self.rows.add([(w, 1.0), (lam, -o.tau)], 0.0, np.inf)
        if o.kind.costs.layer_time.measured:
            return w
        for f, slope in o.kind.costs.pieces["block"]:
            if cell.m_hi:
                self.rows.add([(w, 1.0), (lam, -f), (mu, -slope / cell.m_hi)], 0.0, np.inf)
            busy = [(n, cell.m_lo * o.kind.costs.step_s - cell.t_hi), (lam, cell.m_lo * f), (mu, slope), (e, o.head_s)]
            self.rows.add(busy, -np.inf, 0.0)
        return w

    def solve(self) -> tuple[float | None, np.ndarray | None]:
        return solve_with_binaries(
            np.array(self.value), self.rows, 0, REL_GAP, ROUND_TIME_LIMIT_S, self.integers, ROUND_NODE_LIMIT
        )

    def refined(self, cells: list[Cell], sol: np.ndarray) -> list[Cell] | None:
        """The cells with every cell the solution uses cut (Cell.parts), along C where an option it
        uses can no longer hold the layers a device it gives them (their mean, rounded up); None
        when it uses none."""
        out, used = [], False
        for cell, x, stages in zip(cells, self.x_of, self.stages_of):
            if x is None or sol[x] <= 1e-9:
                out.append(cell)
                continue
            used = True
            need = [(kind, max(1, math.ceil(sol[lam] / sol[n] - 1e-6))) for kind, lam, n in stages if sol[n] > 0.5]
            breaks = sorted({c for kind, layers in need for c in kind.breaks(layers)})
            out += cell.parts(breaks)
        return out if used else None


def cell_bound(
    cache: CostCache,
    classes: tuple[ServerClass, ...],
    tpot_slo_s: float,
    links=None,
    stop_above: float = float("inf"),
) -> float:
    """Output tokens/s no plan exceeds (module docstring); inf when a round cannot be solved. The
    refinement also stops when its value is still above `stop_above` (another bound's) and the last
    round's gain, repeated for every round left, would not bring it below."""
    kinds = stage_kinds(cache, classes, links)
    if not kinds:
        return 0.0
    num_layers = cache.tasks.num_layers
    cells = start_cells(kinds, classes, num_layers, tpot_slo_s)
    best, work = float("inf"), 0
    for left in range(ROUNDS - 1, -1, -1):
        model = _Model(kinds, classes, cells, num_layers)
        work += len(model.value)
        if work > WORK_LIMIT and best < float("inf"):
            break
        value, sol = model.solve()
        if value is None or (sol is None and value == 0.0):  # no bound, or "infeasible" (all zero is feasible)
            return best
        gain, best = best - value, min(best, value)
        if sol is None:  # stopped at its time limit: its dual bound holds, its cells are not refined
            break
        if best > stop_above and gain * left < best - stop_above:
            break
        refined = model.refined(cells, sol)
        if refined is None or len(refined) > MAX_CELLS:
            break
        cells = refined
    return best
