"""The fleet problem: how many copies of each evaluated replica pattern to run.

Given patterns p (a layout and its operating point) with tokens/s v_p and devices u_pc taken
from each class c, and a class's devices N_c:

    maximise  sum_p v_p n_p
    s.t.      sum_p u_pc n_p <= N_c          for every class c           (one row per class)
              n_p >= 0 integer                                           (one column per pattern)

Identical servers are counts here, never copies: the problem has one column per distinct
pattern and one row per class, however many servers a class has. Any solution packs into the
servers (llm_planner.serving.classes), so the assignment of concrete devices is done after.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llm_planner.mip.backends import BackendOptions, ModelBuilder, solve_model
from llm_planner.serving.layout import Pattern


@dataclass(frozen=True, kw_only=True)
class FleetChoice:
    """Patterns with their copy counts, and how the fleet problem was solved."""

    chosen: tuple[tuple[Pattern, int], ...]
    status: str = "optimal"
    prices: dict[str, float] | None = None  # the fleet LP's dual prices per device of each class (the bound's)

    @property
    def tokens_per_s(self) -> float:
        return sum(p.ev.tokens_per_s * n for p, n in self.chosen)


def solve_fleet(
    patterns: list[Pattern], capacity: dict[str, int], *, time_limit_s: float = 30.0, backend: str = "highs"
) -> FleetChoice:
    if not patterns:
        return FleetChoice(chosen=())
    b = ModelBuilder()
    upper = [min(capacity[c] // u for c, u in p.usage.items()) for p in patterns]
    n = b.add_vars(
        "n",
        len(patterns),
        lower=0.0,
        upper=np.asarray(upper, dtype=float),
        integer=True,
        cost=np.asarray([-p.ev.tokens_per_s for p in patterns]),
    )
    names = sorted(capacity)
    rows = []
    for c in names:
        terms = [(int(n[j]), float(p.usage[c])) for j, p in enumerate(patterns) if c in p.usage]
        rows.append((terms, -np.inf, float(capacity[c])))
    b.add_row_list("devices", rows)
    result = solve_model(b.build(), backend, BackendOptions(time_limit_s=time_limit_s, rel_gap=1e-6))
    if result.values is None:
        return FleetChoice(chosen=(), status=result.status)
    counts = np.rint(result.values[n]).astype(int)
    chosen = tuple((p, int(k)) for p, k in zip(patterns, counts) if k > 0)
    return FleetChoice(chosen=chosen, status=result.status)
