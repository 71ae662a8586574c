"""What the cell and price bounds (llm_planner.serving.bound_cells, bound_prices) share: cells of a
replica's concurrency C, micro-batches m and TPOT theta, the first coarse cells and how a cell is
cut; the (class, degree) options a stage may use with its hand-on and end costs; and the least
time the stage holding the head spends on it per TPOT (bound_cells' docstring states the rows
that read them and why each holds for every replica in a cell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_planner.core.spec import LinkSpec
from llm_planner.cost.roofline import transfer_s
from llm_planner.serving.classes import ServerClass
from llm_planner.serving.costs import StageCosts
from llm_planner.serving.layout import CostCache
from llm_planner.serving.links import as_class_links

THETA_FINE = 1.0005  # a cell narrower than this ratio is not split further along theta
THETA_START = 1.25  # ratio of the first TPOT intervals
MAX_BREAKS = 2  # a used cell is cut along C after at most this many l_max breaks (those nearest its middle)
SPLIT = 4  # a used cell is cut into this many parts along theta, and in two along C and along m


def _cut(lo: float, hi: float, parts: int) -> list[tuple[float, float]]:
    """[lo, hi] cut into `parts` intervals of equal ratio."""
    points = [lo * (hi / lo) ** (i / parts) for i in range(parts)] + [hi]
    return list(zip(points, points[1:]))


@dataclass(frozen=True)
class Cell:
    """Replicas with C in [c_lo, c_hi] sequences in flight (integers), m in [m_lo, m_hi] micro-batches
    (m_hi = 0: no upper end) and a TPOT in [t_lo, t_hi]."""

    c_lo: int
    c_hi: int
    m_lo: int
    m_hi: int
    t_lo: float
    t_hi: float

    def b_range(self) -> tuple[float, float]:
        """The micro-batch sizes the cell allows (ceilings of C / m)."""
        lo = max(1.0, math.ceil(self.c_lo / self.m_hi) if self.m_hi else 1.0)
        return lo, max(lo, math.ceil(self.c_hi / self.m_lo))

    def parts(self, breaks: list[int]) -> list[Cell]:
        """The cell cut along C after each break inside it (the MAX_BREAKS nearest its middle; with
        none, in the middle), in two along m and in SPLIT along theta."""
        cs = [(self.c_lo, self.c_hi)]
        if self.c_hi > self.c_lo:
            inside = [c for c in breaks if self.c_lo <= c < self.c_hi]
            mid = math.sqrt(self.c_lo * self.c_hi)
            inside = sorted(inside, key=lambda c: abs(math.log((c + 0.5) / mid)))[:MAX_BREAKS]
            cuts = sorted(set(inside)) or [min(int(mid), self.c_hi - 1)]
            edges = [self.c_lo - 1, *cuts, self.c_hi]
            cs = [(lo + 1, hi) for lo, hi in zip(edges, edges[1:])]
        ms = [(self.m_lo, self.m_hi)]
        if self.m_hi == 0:
            ms = [(self.m_lo, 2 * self.m_lo - 1), (2 * self.m_lo, 0)]
        elif self.m_hi > self.m_lo:
            mid_m = (self.m_lo + self.m_hi) // 2
            ms = [(self.m_lo, mid_m), (mid_m + 1, self.m_hi)]
        ts = [(self.t_lo, self.t_hi)]
        if self.t_hi / self.t_lo > THETA_FINE:
            ts = _cut(self.t_lo, self.t_hi, SPLIT)
        return [Cell(c0, c1, m0, m1, t0, t1) for c0, c1 in cs for m0, m1 in ms for t0, t1 in ts if m0 <= c1]


@dataclass(frozen=True)
class StageKind:
    """A stage option: a class at one degree, with what the rows read of it."""

    class_name: str
    k: int
    costs: StageCosts
    links: tuple[LinkSpec, ...]  # the links a stage of it may hand on over (inside its server, between servers)
    handoff_bytes: float  # what a stage hands on per sequence of its micro-batch
    end_bytes: float  # the smaller of the embedding's and the head's weights per device

    def hop_s(self, b: float) -> float:
        """The least time a stage of it takes to hand on a micro-batch of b sequences: latency
        and bytes over the fastest link it may use."""
        return min((transfer_s(lk, b * self.handoff_bytes) for lk in self.links), default=0.0)

    def breaks(self, layers: int) -> list[int]:
        """The largest C at which memory still holds `layers` layers a device (alone, and beside an
        end): above it the option's l_max is below `layers`."""
        c = self.costs
        if c.kv_bytes_per_seq <= 0:
            return []
        rooms = (c.usable_bytes, c.usable_bytes - self.end_bytes)
        return [math.floor(c.concurrency_held(layers, room)) for room in rooms]


def stage_kinds(cache: CostCache, classes: tuple[ServerClass, ...], links) -> list[StageKind]:
    """Every (class, degree) a stage may use. A stage hands on inside its server only where the
    server holds two stages of its degree (llm_planner.serving.layout.build_slots), else over a link
    between its class and a class of the plan (`links`: ClassLinks, or one link between any two
    servers; llm_planner.serving.links). On a cluster of one server, a hand-off between two classes
    takes the server's link between their kinds, which may be the cheapest of all: with two classes
    or more, no hand-off is charged there."""
    links = as_class_links(links, classes)
    free = links.one_server and len(classes) > 1
    out = []
    for sc in classes:
        for costs in cache.shapes(sc):
            k = costs.degree
            two = sc.per_server // k >= 2
            own = (sc.intra_link,) if two and sc.intra_link is not None else ()
            others = () if links.one_server else links.out_of(sc.name, itself=sc.num_devices > k)
            each = () if free else (*own, *others)
            end = min(costs.first_bytes, costs.weight_bytes["final_norm"] + costs.weight_bytes["lm_head"])
            out.append(StageKind(sc.name, k, costs, each, cache.tasks.handoff_bytes_per_seq, end))
    return out


def head_busy_s(costs: StageCosts, cell: Cell) -> float:
    """The least time the stage holding the head spends on it per TPOT in the cell: each of its
    m >= m_lo micro-batches passes the final norm and the head once, C >= c_lo sequences in all, so
    on every piece (f, s) of a part's time with f, s >= 0 (a part's time is at least each piece)
    at least m_lo f + s c_lo (the head's pieces carry the engine's time per sequence)."""
    total = 0.0
    for part in ("final_norm", "lm_head"):
        pieces = costs.pieces[part]
        total += max((cell.m_lo * f + s * cell.c_lo for f, s in pieces if f >= 0 and s >= 0), default=0.0)
    return total


def busy_layers(costs: StageCosts, cell: Cell, busy_tau: float, head_s: float = 0.0, roofline: bool = False) -> float:
    """The most layers a stage of `costs` has time for in the cell (inf: no limit): its busy period,
    m >= m_lo passes of its step and layers plus `head_s` (the stage holding the head: head_busy_s),
    within theta_hi, each layer at least busy_tau; with `roofline`, also on every piece (f, s) of the
    layer's time where it has no measured one, m_lo step + l (m_lo f + s c_lo) + head_s <= theta_hi
    (Jensen: the layer's time is convex in the micro-batch)."""
    most = math.floor(((cell.t_hi - head_s) / cell.m_lo - costs.step_s) / busy_tau + 1e-9) if busy_tau > 0 else math.inf
    if roofline and not costs.layer_time.measured:
        for f, s in costs.pieces["block"]:
            den = cell.m_lo * f + s * cell.c_lo
            if den > 0:
                most = min(most, math.floor((cell.t_hi - head_s - cell.m_lo * costs.step_s) / den + 1e-9))
    return most


def end_time_s(kinds: list[StageKind], cell: Cell) -> float:
    """The least time of the first stage's own parts (embedding, dense first layers) plus the least
    head time of any stage option at the cell's smallest micro-batch."""
    b_lo, _ = cell.b_range()
    embed = min(kd.costs.first_least_s(b_lo) for kd in kinds)
    head = min(kd.costs.part_s("final_norm", b_lo) + kd.costs.part_s("lm_head", b_lo) for kd in kinds)
    return embed + head


def start_cells(kinds: list[StageKind], classes, num_layers: int, tpot_slo_s: float) -> list[Cell]:
    """The first, coarse cells: C in [1, 1], [2, 3], [4, 7], ... up to what all memory holds, m in
    [1], [2], [3, 4], [5, 8], ..., the TPOT in ratios of THETA_START from the least round trip (the
    least step and every layer at its least time on any class) to the target."""
    memory = sum(sc.num_devices * sc.kind.usable_mem_bytes for sc in classes)
    kv = min(kd.k * kd.costs.kv_bytes_per_seq for kd in kinds)
    c_top = max(2.0, memory / (num_layers * kv)) if kv > 0 else 2.0**20
    cs, c = [], 1
    while c <= c_top:
        cs.append((c, 2 * c - 1))
        c *= 2
    ms, m = [(1, 1), (2, 2)], 3
    while m <= c_top:
        ms.append((m, 2 * m - 2))
        m = 2 * m - 1
    ms.append((m, 0))
    t_min = min(kd.costs.step_s for kd in kinds) + num_layers * min(kd.costs.layer_time.least() for kd in kinds)
    t_min = min(max(t_min, 1e-9), tpot_slo_s)  # no replica's round trip is shorter
    ts = _cut(t_min, tpot_slo_s, max(1, math.ceil(math.log(tpot_slo_s / t_min) / math.log(THETA_START))))
    ts = ts if t_min < tpot_slo_s else [(tpot_slo_s, tpot_slo_s)]
    return [Cell(c0, c1, m0, m1, t0, t1) for c0, c1 in cs for m0, m1 in ms for t0, t1 in ts if m0 <= c1]
