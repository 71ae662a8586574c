"""The decode loop's token hand-off in the exact MILP (PlacementProblem.token_time): the ids
sampled on lm_head's device go back to embed's device every step, so

    latency:    C >= start[s,h] + time(s,h) + w[s],   w[s] >= c(k, l, b_s) when h on k and e on l != k
    throughput: the same cost charged to both ends' loads, as a cut edge of the direct model

with h = lm_head, e = embed and c the token's transfer cost, linearised as the precedence and
load rows of llm_planner.placement.milp.model ((5), (10)) over groups of partners at one cost.
"""

from __future__ import annotations

import math

from llm_planner.placement.milp.cost_terms import cost_groups


def token_makespan_rows(f) -> list:
    """(7') rows C >= start[s,h] + time(s,h) + w[s] and w[s]'s lower bounds, for a Formulation `f`
    with start times; [] without a decode loop."""
    p = f.p
    if p.token_loop is None:
        return []
    head, embed = p.token_loop
    groups = cost_groups(p.token_fixed, p.token_slope, f.devices(head), f.devices(embed))
    w = f.mb.add_vars("token", f.S)
    rows = []
    for s in range(f.S):
        ws = int(w[s])
        rows += [f._cut_rows(ws, s, head, embed, k, ls, fixed, slope) for k, fixed, slope, ls in groups]
        terms = [(f.obj, 1.0), (int(f.start[s, head]), -1.0), (ws, -1.0)] + [(c, -a) for c, a in f.duration(s, head)]
        rows.append((terms, 0.0, math.inf))
    return rows


def token_charges(f) -> list[tuple[int, list[int], list]]:
    """(charge column, the device that pays it, its rows) for the token of every shard: the sender's
    charge per group of receivers at one cost, the receiver's per group of senders (model._direct_charges)."""
    p = f.p
    if p.token_loop is None:
        return []
    head, embed = p.token_loop
    ends = [
        (k, fixed, slope, ls, head, embed)
        for k, fixed, slope, ls in cost_groups(p.token_fixed, p.token_slope, f.devices(head), f.devices(embed))
    ]
    ends += [
        (l, fixed, slope, ks, embed, head)
        for l, fixed, slope, ks in cost_groups(p.token_fixed.T, p.token_slope.T, f.devices(embed), f.devices(head))
    ]
    g = f.mb.add_vars("token_charge", (f.S, len(ends)))
    out = []
    for s in range(f.S):
        for n, (k, fixed, slope, partners, mine, theirs) in enumerate(ends):
            col = int(g[s, n])
            out.append((col, [k], [f._cut_rows(col, s, mine, theirs, k, partners, fixed, slope)]))
    return out
