"""The cost terms the MILP's rows share: the undominated affine pieces of a task's time, and
transfer costs grouped by link class (a cluster has few), so a device's rows go to a few
groups of partners, not to each of K - 1 devices.
"""

from __future__ import annotations

import numpy as np

from llm_planner.placement.problem import PlacementProblem


def useful_pieces(pieces: np.ndarray) -> list[tuple[float, float]]:
    """The affine pieces (fixed, slope) that are not dominated by another one."""
    unique = sorted({(float(f), float(g)) for f, g in pieces})
    return [p for p in unique if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in unique)]


def uniform_cost(problem: PlacementProblem, e: int) -> tuple[float, float] | None:
    """(fixed_s, slope_s) of edge e if it is the same between every pair of distinct devices."""
    off = ~np.eye(problem.num_devices, dtype=bool)
    fixed, slope = problem.comm_fixed[e][off], problem.comm_slope[e][off]
    if fixed.size == 0 or (np.ptp(fixed) == 0 and np.ptp(slope) == 0):
        return (float(fixed[0]), float(slope[0])) if fixed.size else (0.0, 0.0)
    return None


def cost_groups(
    fixed: np.ndarray, slope: np.ndarray, ends: list[int], others: list[int]
) -> list[tuple[int, float, float, list[int]]]:
    """(k, fixed_s, slope_s, [l, ...]) for each k in `ends` and each set of devices l in `others`, l != k,
    with the same cost (fixed[k, l], slope[k, l]); free pairs are left out.

    With an edge's cost matrices this groups a sender's receivers; with their transposes, a receiver's
    senders. A cluster has few link classes, so a device has a few groups, not K - 1 partners.
    """
    groups = []
    for k in ends:
        by_cost: dict[tuple[float, float], list[int]] = {}
        for l in others:
            if l != k and (fixed[k, l] or slope[k, l]):
                by_cost.setdefault((float(fixed[k, l]), float(slope[k, l])), []).append(l)
        groups += [(k, f, g, ls) for (f, g), ls in by_cost.items()]
    return groups
