"""An upper bound on the output tokens/s of *any* serving plan of the model on the cluster.

`tokens_upper_bound` is the least of the MILP below (concurrency levels), the one of
llm_planner.serving.bound_batches (concurrency and micro-batch levels) and the one of
llm_planner.serving.bound_cells (whole replicas over cells of C, m and TPOT); each holds alone. The
per-device rates below also order the search's candidates (llm_planner.serving.search).

Take any plan (replicas of pipeline stages, each a device or a group of k devices of one class,
tensor-parallel or with data-parallel attention (its own StageCosts: every bound loops over each
class's shapes), holding l >= 1 decoder layers, C sequences in flight, m micro-batches)
and one of its stages. Its block time on b sequences is max_j(f_j + s_j b) with f_j, s_j >= 0
(llm_planner.cost.roofline; collectives included), so over one cycle (every micro-batch once)

    TPOT = cycle >= busy period >= l * sum_j' max_j (f_j + s_j b_j') >= l * max_j (f_j + s_j C)

(dropping the step overhead, the embedding and head, and m - 1 weight reads). The stage does
R l layer-token passes per second, R = C / TPOT the replica's tokens/s, so each of its k
devices does, with the stage's fixed step overhead counted once (m >= 1 micro-batches each pay
it: TPOT >= step + l max_j (f_j + s_j C)),

    R l / k  <=  g_{k,l}(C) = C l / (k (step + l max_j (f_j + s_j C))),  increasing in C,

and C is bounded on that stage by memory, l (w_k + C kv_k) <= M, and by the target,
step + l max_j (f_j + s_j C) <= TPOT target: C <= C_max(k, l). So a device of the class does at
most rho = max over offered degrees k and l = 1..L of g_{k,l}(C_max(k, l)) layer-token passes
per second, whatever plan it is in (0 if it is in none). Few layers per stage let C grow but pay
the step overhead on few layers; many layers amortise it but leave less memory for KV. Every
output token needs L passes, so

    tokens/s <= sum over classes of (devices of the class) * rho_class / L.

Coupling the devices of one replica: it has one concurrency C, and every one of its devices
holds the KV cache of all C sequences over its l / k "device-layers", which add up to L over
the replica. Cut the concurrencies into levels [C_j, C_j+1) (C_j = 1.25^j). A device in a stage
(k, l) of a replica at level j has a memory that holds C_j sequences over its l layers, and does
at most rho_{c,k,l,j} = g_{k,l}(min(C_j+1, C_max(k, l))) passes per second; the devices at a
level in use hold at least L device-layers. With y >= 0 the devices of class c in stages (k, l)
at level j (continuous: a relaxation) and u_j in {0, 1} whether level j is used:

    tokens/s <= max sum y rho / L
    s.t.  sum_{k,l,j} y_{c,k,l,j} <= N_c                      (each device in one stage)
          sum_{c,k,l} y_{c,k,l,j} l / k >= L u_j               (a level in use holds a model copy)
          sum_{k,l} y_{c,k,l,j} <= N_c u_j                     (no device at an unused level)
          sum_{c,k,l} y_{c,k,l,j} (tau_{c,k,l} - (T / L) l / k) <= 0   (round trips within the target)

The last row: a replica's round trip is at least the sum over its stages of step + l t_min
(t_min: a layer's least time on any micro-batch of at least one sequence) and at most the
target T, while its stages' l add up to L. Shared by the stage's k devices, tau = (step + l
t_min) / k, so sum over the replica's devices of (tau - (T / L) l / k) <= T - T = 0, and the
sum over the replicas at one level too. It keeps a deep pipeline of single devices, each
fast at its own few layers, from counting when the layers one after another cannot meet T.

Solved as a small MILP (HiGHS; its dual bound if it stops early). It forbids a replica whose
devices hold one layer each with a concurrency their memory over the whole model cannot hold.
It holds for every plan of the model the planner can express (any split, degrees, micro-batches,
concurrency, replicas mixing classes); what it leaves out (fixed costs, hand-offs, the m weight
reads, the last layer's head) only makes it larger. A single device of a profiled class uses
its measured block time t(C), piecewise linear between the profile's points: on each piece the
rate grows with C, so the bound takes each piece's largest allowed C.
"""

from __future__ import annotations

import numpy as np

from llm_planner.core.spec import LinkSpec
from llm_planner.serving.bound_batches import SparseRows, batch_level_bound, maximise_with_binaries
from llm_planner.serving.bound_cells import cell_bound
from llm_planner.serving.bound_prices import price_bound
from llm_planner.serving.classes import ServerClass
from llm_planner.serving.layout import CostCache
from llm_planner.serving.links import ClassLinks


def stage_rates(cache: CostCache, sc: ServerClass, tpot_slo_s: float) -> dict[tuple[int, str, int], float]:
    """(degree k, attention, layers l) -> the most layer-token passes per second one device of the
    class does in a stage of k devices (its attention tensor- or data-parallel) holding l layers,
    in any plan (0: no such stage fits)."""
    out = {}
    for costs in cache.shapes(sc):
        k, rate = costs.degree, _rate_of(costs)
        for layers in range(1, cache.tasks.num_layers + 1):
            out[(k, costs.attention, layers)] = rate(costs, k, layers, tpot_slo_s)
    return out


def device_rate_bound(cache: CostCache, sc: ServerClass, tpot_slo_s: float) -> float:
    """rho: layer-token passes per second one device of the class can do in any plan."""
    return max(stage_rates(cache, sc, tpot_slo_s).values(), default=0.0)


def _rate_of(costs):
    """The rate function of the stage's layer time: exact on the roofline's pieces, or on a measured table."""
    return _measured_rate if costs.layer_time.measured else _roofline_rate


def _roofline_rate(costs, k: int, layers: int, tpot_slo_s: float, c_cap: float = float("inf")) -> float:
    """C l / (k (step + l max_j (f_j + s_j C))) at the largest C that memory and the target allow."""
    block, step = costs.pieces["block"], costs.step_s
    c_held = costs.concurrency_held(layers)
    if c_held < 0:
        return 0.0
    c_max = min(c_cap, c_held)
    for f, s in block:
        if s > 0:
            c_max = min(c_max, max(0.0, ((tpot_slo_s - step) / layers - f) / s))
    if c_max < 1 or c_max == float("inf"):
        return 0.0 if c_max < 1 else float("inf")
    return c_max * layers / (k * (step + layers * max(f + s * c_max for f, s in block)))


def _measured_rate(costs, k: int, layers: int, tpot_slo_s: float, c_cap: float = float("inf")) -> float:
    """The same for a measured block time t(C), linear between its breakpoints (they include where
    a table's extended end reaches 0): on each piece C l / (k (step + l t(C))) is monotone in C,
    so its largest value is at an end of the piece's part that memory and the target allow."""
    step, t = costs.step_s, costs.layer_time
    c_held = costs.concurrency_held(layers)
    if c_held < 0:
        return 0.0
    c_mem = min(c_cap, c_held)
    if c_mem < 1:
        return 0.0
    ends = sorted({1.0, c_mem, *(x for x in t.breakpoints if 1.0 < x < c_mem)})
    best = 0.0
    limit = (tpot_slo_s - step) / layers
    for x0, x1 in zip(ends, ends[1:] + [c_mem]):
        y0, y1 = t(x0), t(x1)
        # on a piece the rate is monotone in C: its largest value is at an end of the part the
        # target allows (the left one where step + l t(C)'s line has a negative intercept)
        for x in {_rightmost_within(x0, x1, y0, y1, limit), x0 if y0 <= limit else None} - {None}:
            time = step + layers * (y0 + (y1 - y0) * (x - x0) / (x1 - x0 or 1.0))
            best = max(best, x * layers / (k * time) if time > 0 else float("inf"))
    return best


def _rightmost_within(x0: float, x1: float, y0: float, y1: float, limit: float) -> float | None:
    """The largest x in [x0, x1] where the line through (x0, y0), (x1, y1) is at most limit."""
    if y1 <= limit:
        return x1
    if y0 > limit:
        return None
    return x0 + (limit - y0) * (x1 - x0) / (y1 - y0)


CELL_BOUND_GAP = 0.05  # the cell bound is computed when the others leave a plan more than this gap
PRICE_BOUND_GAP = 0.01  # the price bound is computed when the first two leave a plan more than this gap


def first_two_bounds(cache: CostCache, classes: tuple[ServerClass, ...], tpot_slo_s: float) -> float:
    """The least of the MILP over concurrency levels and the one over concurrency and micro-batch
    levels (bound_batches): they need no plan (llm_planner.serving.aside computes them beside one)."""
    return min(concurrency_level_bound(cache, classes, tpot_slo_s), batch_level_bound(cache, classes, tpot_slo_s))


def tokens_upper_bound(
    cache: CostCache,
    classes: tuple[ServerClass, ...],
    tpot_slo_s: float,
    links: ClassLinks | LinkSpec | None = None,
    tokens_per_s: float | None = None,
    prices: dict[str, float] | None = None,
    first_two: float | None = None,
) -> float:
    """Output tokens/s no plan exceeds: the least of the MILP over concurrency levels (module
    docstring), the one over concurrency and micro-batch levels (bound_batches), Farley's bound at
    the device `prices` when given (bound_prices) and the one over cells of whole replicas
    (bound_cells; `links` those between classes, llm_planner.serving.links); each holds. The price
    bound is computed only when a plan's `tokens_per_s` (when given) is more than PRICE_BOUND_GAP below the first two,
    the cell bound, the slowest, when it is still more than CELL_BOUND_GAP below: a plan and its
    `verify` make the same choices. `first_two`: the least of the first two, when already known
    (llm_planner.serving.aside)."""
    bound = first_two_bounds(cache, classes, tpot_slo_s) if first_two is None else first_two
    return _later_bounds(cache, classes, tpot_slo_s, links, tokens_per_s, prices, bound)[0]


def _later_bounds(cache, classes, tpot_slo_s, links, tokens_per_s, prices, bound, *, cells: bool = True):
    """tokens_upper_bound from `bound` (the first two, or a bound as good), and whether it computed
    the cell bound (`cells` False: never)."""
    if prices is not None and (tokens_per_s is None or tokens_per_s < (1 - PRICE_BOUND_GAP) * bound):
        bound = min(bound, price_bound(cache, classes, tpot_slo_s, links, prices, tokens_per_s or 0.0))
    if not cells or (tokens_per_s is not None and tokens_per_s >= (1 - CELL_BOUND_GAP) * bound):
        return bound, False
    return min(bound, cell_bound(cache, classes, tpot_slo_s, links, stop_above=bound)), True


def exportable_bounds(
    cache: CostCache,
    classes: tuple[ServerClass, ...],
    tpot_slo_s: float,
    links: ClassLinks | LinkSpec | None,
    plan: tuple[float, dict[str, float] | None],
    unrestricted: tuple[float, dict[str, float] | None] | None,
    first_two: float | None = None,
) -> tuple[float, float | None]:
    """The bound a plan states, and the unrestricted plan's (None without one). `plan` and
    `unrestricted` are (tokens/s, device prices) of the plan and of the best plan the search found
    without --exportable. Each tokens_upper_bound holds for every plan of the model, exportable ones
    included, so an exportable plan states the smaller of its own and the unrestricted one's (its
    own computed from the unrestricted one, without a second cell bound)."""
    first_two = first_two_bounds(cache, classes, tpot_slo_s) if first_two is None else first_two
    if unrestricted is None:
        return tokens_upper_bound(cache, classes, tpot_slo_s, links, plan[0], plan[1], first_two), None
    free, cells = _later_bounds(cache, classes, tpot_slo_s, links, *unrestricted, first_two)
    if tuple(unrestricted) == tuple(plan):  # the exportable plan was the best found: the same bound
        return free, free
    # the plan's own from the unrestricted one (a bound too): its price bound only where it may
    # still tighten it, and the cell bound, which no price changes, not twice
    own, _ = _later_bounds(cache, classes, tpot_slo_s, links, *plan, min(first_two, free), cells=not cells)
    return min(own, free), free


def concurrency_level_bound(cache: CostCache, classes: tuple[ServerClass, ...], tpot_slo_s: float) -> float:
    """The MILP over concurrency levels (module docstring)."""
    options = _level_options(cache, classes, tpot_slo_s)
    if not options:
        return 0.0
    if any(o[4] == float("inf") for o in options):
        return float("inf")
    by_level: dict[int, list[int]] = {}
    for i, o in enumerate(options):
        by_level.setdefault(o[1], []).append(i)
    n_y, n_u = len(options), len(by_level)
    rows = SparseRows()
    for sc in classes:  # each device in at most one stage
        rows.add([(i, 1.0) for i, o in enumerate(options) if o[0] == sc.name], -np.inf, sc.num_devices)
    per_layer_s = tpot_slo_s / cache.tasks.num_layers
    for q, idx in enumerate(by_level.values()):
        u = n_y + q  # a level in use holds at least one copy of the model
        rows.add([(i, options[i][3]) for i in idx] + [(u, -float(cache.tasks.num_layers))], 0.0, np.inf)
        rows.add([(i, options[i][5] - per_layer_s * options[i][3]) for i in idx], -np.inf, 0.0)  # round trips
        for sc in classes:  # no device at an unused level
            mine = [(i, 1.0) for i in idx if options[i][0] == sc.name]
            if mine:
                rows.add(mine + [(u, -float(sc.num_devices))], -np.inf, 0.0)
    best = maximise_with_binaries(np.array([o[4] for o in options]), rows, n_u)
    if best is not None:
        return best / cache.tasks.num_layers
    return sum(sc.num_devices * device_rate_bound(cache, sc, tpot_slo_s) for sc in classes) / cache.tasks.num_layers


LEVEL_RATIO = 1.25  # concurrency levels of the bound: 1, 1.25, 1.5625, ...


def _level_options(cache: CostCache, classes: tuple[ServerClass, ...], tpot_slo_s: float) -> list[tuple]:
    """(class, level j, degree k, device-layers l / k, rate, round-trip share) for every stage a
    device may sit in when its replica's concurrency is in [C_j, C_{j+1}): memory must hold C_j,
    the rate is taken at C_{j+1} (it grows with C); the round-trip share is (step + l t_min) / k."""
    out = []
    for sc in classes:
        for costs in cache.shapes(sc):
            k, rate_of = costs.degree, _rate_of(costs)
            block_min = costs.layer_time.least()
            for layers in range(1, cache.tasks.num_layers + 1):
                c_fit = costs.concurrency_held(layers)
                if c_fit < 1:
                    break
                assert c_fit < float("inf"), "a layer's KV cache grows with the sequences in flight"
                j, c = 0, 1.0
                while c <= c_fit:
                    rate = rate_of(costs, k, layers, tpot_slo_s, c * LEVEL_RATIO)
                    if rate > 0:
                        out.append((sc.name, j, k, layers / k, rate, (costs.step_s + layers * block_min) / k))
                    j, c = j + 1, c * LEVEL_RATIO
    return out
