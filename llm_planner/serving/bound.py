"""An upper bound on the output tokens/s of *any* serving plan of the model on the cluster.

Take any plan (replicas of pipeline stages, each a device or a tensor-parallel group of k
devices of one class holding l >= 1 decoder layers, C sequences in flight, m micro-batches)
and one of its stages. Its block time on b sequences is max_j(f_j + s_j b) with f_j, s_j >= 0
(llm_planner.cost; collectives included), so over one cycle (every micro-batch once)

    TPOT = cycle >= busy period >= l * sum_j' max_j (f_j + s_j b_j') >= l * max_j (f_j + s_j C)

(dropping the step overhead, the embedding and head, and m - 1 weight reads). The stage does
R l layer-token passes per second, R = C / TPOT the replica's tokens/s, so each of its k
devices does

    R l / k  <=  g_k(C) = C / (k max_j (f_j + s_j C)),  increasing in C,

and C is bounded on that stage by memory, l (w_k + C kv_k) <= M, and by the target,
l max_j (f_j + s_j C) <= TPOT target; with l >= 1 both give C <= C_max(k). So a device of the
class does at most rho = max over offered degrees k of g_k(C_max(k)) layer-token passes per
second, whatever plan it is in (0 if it is in none). Every output token needs L passes, so

    tokens/s <= sum over classes of (devices of the class) * rho_class / L.

It holds for every plan of the model the planner can express (any split, degrees, micro-batches,
concurrency, replicas mixing classes); what it leaves out (fixed costs, hand-offs, the m weight
reads, the last layer's head) only makes it larger. A single device of a profiled class uses
its measured block time b -> t(b), and since nothing says t is affine, rho there is the best
C / (k t(C)) over every C up to its C_max.
"""

from __future__ import annotations

from llm_planner.serving.classes import ServerClass
from llm_planner.serving.layout import CostCache


def device_rate_bound(cache: CostCache, sc: ServerClass, tpot_slo_s: float) -> float:
    """rho: layer-token passes per second one device of the class can do in any plan."""
    best = 0.0
    for k in sc.degrees:
        costs = cache.get(sc.name, k)
        block = costs.pieces["block"]
        kv, w, room = costs.kv_bytes_per_seq, costs.weight_bytes["block"], costs.usable_bytes - costs.weight_bytes["block"]
        if room < 0:
            continue
        c_max = room / kv if kv > 0 else float("inf")
        for f, s in block:
            if s > 0:
                c_max = min(c_max, max(0.0, (tpot_slo_s - f) / s))
        if c_max < 1:
            continue
        if getattr(costs, "layer_time", None) is not None:  # measured: scan every C
            rate = max(c / (k * costs.part_s("block", c)) for c in range(1, int(min(c_max, 1 << 16)) + 1))
        else:
            rate = c_max / (k * max(f + s * c_max for f, s in block))
        best = max(best, rate)
    return best


def tokens_upper_bound(cache: CostCache, classes: tuple[ServerClass, ...], tpot_slo_s: float) -> float:
    """Output tokens/s no plan exceeds (module docstring)."""
    layers = cache.tasks.num_layers
    return sum(sc.num_devices * device_rate_bound(cache, sc, tpot_slo_s) for sc in classes) / layers
