"""An upper bound on the output tokens/s of *any* serving plan of the model on the cluster.

Take any plan (replicas of pipeline stages, each a device or a tensor-parallel group of k
devices of one class holding l >= 1 decoder layers, C sequences in flight, m micro-batches)
and one of its stages. Its block time on b sequences is max_j(f_j + s_j b) with f_j, s_j >= 0
(llm_planner.cost; collectives included), so over one cycle (every micro-batch once)

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
the step overhead on few layers; many layers amortise it but leave less memory for KV. Every output token needs L passes, so

    tokens/s <= sum over classes of (devices of the class) * rho_class / L.

It holds for every plan of the model the planner can express (any split, degrees, micro-batches,
concurrency, replicas mixing classes); what it leaves out (fixed costs, hand-offs, the m weight
reads, the last layer's head) only makes it larger. A single device of a profiled class uses
its measured block time b -> t(b), and since nothing says t is affine, rho there is the best
C / (k t(C)) over every C that one layer's memory and the target allow (without the step
overhead: looser, still valid).
"""

from __future__ import annotations

from llm_planner.serving.classes import ServerClass
from llm_planner.serving.layout import CostCache


def device_rate_bound(cache: CostCache, sc: ServerClass, tpot_slo_s: float) -> float:
    """rho: layer-token passes per second one device of the class can do in any plan."""
    best = 0.0
    for k in sc.degrees:
        costs = cache.get(sc.name, k)
        if getattr(costs, "layer_time", None) is not None:
            best = max(best, _measured_rate(costs, k, tpot_slo_s))
            continue
        for layers in range(1, cache.tasks.num_layers + 1):
            best = max(best, _roofline_rate(costs, k, layers, tpot_slo_s))
    return best


def _roofline_rate(costs, k: int, layers: int, tpot_slo_s: float) -> float:
    """C l / (k (step + l max_j (f_j + s_j C))) at the largest C that memory and the target allow."""
    block, step = costs.pieces["block"], costs.step_s
    room = costs.usable_bytes - layers * costs.weight_bytes["block"]
    if room < 0:
        return 0.0
    kv = costs.kv_bytes_per_seq
    c_max = room / (layers * kv) if kv > 0 else float("inf")
    for f, s in block:
        if s > 0:
            c_max = min(c_max, max(0.0, ((tpot_slo_s - step) / layers - f) / s))
    if c_max < 1 or c_max == float("inf"):
        return 0.0 if c_max < 1 else float("inf")
    return c_max * layers / (k * (step + layers * max(f + s * c_max for f, s in block)))


def _measured_rate(costs, k: int, tpot_slo_s: float) -> float:
    """A measured block time b -> t(b) need not be affine: the best C / (k t(C)) over every C that one
    layer's memory and the target allow (the step overhead left out)."""
    room = costs.usable_bytes - costs.weight_bytes["block"]
    if room < 0:
        return 0.0
    c_max = int(min(room / costs.kv_bytes_per_seq, MEASURED_SCAN))
    rates = [c / (k * t) for c in range(1, c_max + 1) if (t := costs.part_s("block", c)) <= tpot_slo_s and t > 0]
    return max(rates, default=0.0)


MEASURED_SCAN = 1 << 16  # concurrencies scanned for a measured block time


def tokens_upper_bound(cache: CostCache, classes: tuple[ServerClass, ...], tpot_slo_s: float) -> float:
    """Output tokens/s no plan exceeds (module docstring)."""
    layers = cache.tasks.num_layers
    return sum(sc.num_devices * device_rate_bound(cache, sc, tpot_slo_s) for sc in classes) / layers
