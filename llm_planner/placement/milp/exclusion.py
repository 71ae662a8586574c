"""No-good rows: the MILP of a Formulation without some given plans, and only without them.

solve.milp.milp uses them for throughput plans whose steady state does not fit (problem.fit):
such a plan is cut off and the model solved again, so the first plan that fits is the optimum
over the plans that fit (every better one was cut off, one at a time, for not fitting).

A plan is (shard sizes, per shard the device of every task), as problem.fit.plan_arrays gives it.
Its shards are put in the model's order (sizes non-increasing, empty shards last), x* is its
assignment and b* its sizes; the row asks for any difference:

    sum_{x* = 1} (1 - x) + sum_{x* = 0} x + sum_s (up_s + down_s) >= 1,
    b_s >= (b*_s + 1) up_s,   b_s <= b*_s - 1 + (Q + 1) (1 - down_s)     (up, down binary; S > 1 only)

so up_s (down_s) may be 1 only where shard s is larger (smaller) than in the plan. With S = 1 the
size is the constant Q and the first sum alone cuts off the assignment.
"""

from __future__ import annotations

import numpy as np

from llm_planner.placement.milp.model import Formulation

Excluded = tuple[list[int], list[list[int]]]


def exclude_plans(form: Formulation, plans: list[Excluded]) -> None:
    """Add to `form` (before form.build()) one no-good row per plan of `plans` (module docstring)."""
    for n, (sizes, assignments) in enumerate(plans):
        order = sorted(range(len(sizes)), key=lambda s: -sizes[s])
        chosen = np.zeros((form.S, form.N, form.K), dtype=bool)
        size_star = [0] * form.S
        for new, old in enumerate(order):
            size_star[new] = sizes[old]
            chosen[new, np.arange(form.N), assignments[old]] = True
        terms = [(int(c), -1.0 if on else 1.0) for c, on in zip(form.x.ravel(), chosen.ravel())]
        rows = []
        if not form.fixed:
            up = form.mb.add_vars(f"exclude{n}_up", form.S, upper=1, integer=True)
            down = form.mb.add_vars(f"exclude{n}_down", form.S, upper=1, integer=True)
            for s in range(form.S):
                b = int(form.size[s])
                rows.append(([(b, 1.0), (int(up[s]), -float(size_star[s] + 1))], 0.0, np.inf))
                rows.append(([(b, 1.0), (int(down[s]), float(form.Q + 1))], -np.inf, size_star[s] + form.Q))
                terms += [(int(up[s]), 1.0), (int(down[s]), 1.0)]
        rows.append((terms, 1.0 - float(chosen.sum()), np.inf))
        form.mb.add_row_list(f"exclude{n}", rows)
