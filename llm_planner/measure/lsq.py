"""Bounded linear least squares over the columns the rows can determine; the others keep a prior.

Calibration (llm_planner.measure.calibrate for placement runs, llm_planner.measure.serving_fit for
serving measurements) fits a linear model a @ p = target, rows already weighted, with p >= lower.
Not every column can be fitted: a column no row depends on, more columns than the rows minus one
(a fit must leave a residual to show a poor fit), columns that are collinear, or a column whose
term explains under WEAK_SHARE of every row at its fitted value and at its prior alike, or one
fitted at its bound that lowers the error by under BOUND_GAIN against its prior (the rows' scatter
pushed it there).
`bounded_fit` finds the largest set of columns the rows determine and fits it; the others keep
their prior and a reason.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import combinations

import numpy as np
from scipy.optimize import lsq_linear

WEAK_SHARE = 0.01  # a factor whose term explains less than this share of every measurement is not fitted
BOUND_GAIN = 0.1  # a factor fitted at its bound must lower the rows' error by this share of it, held at its prior


def bounded_fit(
    a: np.ndarray,
    target: np.ndarray,
    prior: np.ndarray,
    lower: np.ndarray,
    order: Sequence[int],
    *,
    figures: int | None = None,
    exempt: Collection[int] = (0,),
    what: str = "observation",
):
    """Fit a @ p = target (rows already weighted) over the identifiable columns; the others keep `prior`.

    Returns (p, fitted column indices, {column: reason kept}). The fitted set is the largest set
    of columns that the rows determine (fewer columns than `figures`, the independent measured
    figures among the rows, by default every row; linearly independent; each but the `exempt`
    ones explaining at least WEAK_SHARE of some row); among sets of that size, the one with the
    smallest residual, ties going to the set that gives up the columns early in `order`.
    """
    figures = a.shape[0] if figures is None else figures
    kept = {j: f"no {what} depends on it" for j in range(a.shape[1]) if not np.any(a[:, j])}
    candidates = [j for j in range(a.shape[1]) if j not in kept]
    rank_of = {j: n for n, j in enumerate(order)}
    best = None
    for size in range(min(len(candidates), figures - 1), 0, -1):
        for subset in sorted(
            combinations(candidates, size), key=lambda c: sorted(rank_of[j] for j in candidates if j not in c)
        ):
            if not independent(a[:, subset]):
                continue
            p, free, weak = _solve(a, target, prior, lower, list(subset), exempt)
            residual = float(np.linalg.norm(a @ p - target))
            if best is None or residual < best[0] * (1 - 1e-9):
                best = (residual, p, free, weak)
        if best is not None:
            break
    why = _why_kept(figures, candidates, what)
    if best is None:
        return prior.astype(float).copy(), [], {**kept, **dict.fromkeys(candidates, why)}
    _, p, free, weak = best
    reasons = {j: weak.get(j) or why for j in candidates if j not in free}
    return p, free, {**kept, **reasons}


def _why_kept(figures: int, candidates: list[int], what: str) -> str:
    if len(candidates) >= figures:
        return f"{figures} {what}(s) cannot fit more than {figures - 1} factor(s)"
    return "not separable from the other factors with these observations"


def independent(cols: np.ndarray) -> bool:
    """Whether the columns are linearly independent (relative to their norms)."""
    cols = cols / np.linalg.norm(cols, axis=0)
    s = np.linalg.svd(cols, compute_uv=False)
    return bool(s[-1] > 1e-6 * s[0])


def _weak(column: np.ndarray, fitted: float, prior: float, target: np.ndarray) -> bool:
    """Whether a factor's term explains under WEAK_SHARE of every row at its fitted value and at its
    prior alike (a factor the rows drive from a prior that matters to its bound is not weak: see
    `_bound_unearned`)."""
    scale = max(abs(fitted), abs(prior))
    return bool(np.max(np.abs(column)) * scale < WEAK_SHARE * np.max(np.abs(target)))


def _fit(a, target, prior, lower, free: list[int]) -> np.ndarray:
    """Bounded least squares over `free`, the other columns at `prior`."""
    p = prior.astype(float).copy()
    fixed = [j for j in range(a.shape[1]) if j not in free]
    rhs = target - a[:, fixed] @ p[fixed] if fixed else target
    if free:
        p[free] = lsq_linear(a[:, free], rhs, bounds=(lower[free], np.full(len(free), np.inf))).x
    return p


def _bound_unearned(a, target, prior, lower, free: list[int], p: np.ndarray, j: int) -> bool:
    """Whether column j sits at its lower bound without the rows asking for it: held at its prior
    (the others refitted), the rows' error is under BOUND_GAIN larger. Such a bound fits the rows'
    scatter, not the factor."""
    if prior[j] <= lower[j] or p[j] - lower[j] > 1e-9 * max(1.0, abs(prior[j])):
        return False
    held = _fit(a, target, prior, lower, [k for k in free if k != j])
    fitted_error = float(np.linalg.norm(a @ p - target))
    return float(np.linalg.norm(a @ held - target)) <= fitted_error * (1 + BOUND_GAIN) + 1e-15


def _solve(a, target, prior, lower, free: list[int], exempt) -> tuple[np.ndarray, list[int], dict[int, str]]:
    """Bounded least squares over `free` (the rest at `prior`), giving up columns whose term is
    negligible or whose bound the rows do not ask for."""
    weak: dict[int, str] = {}
    while True:
        p = _fit(a, target, prior, lower, free)
        small = [j for j in free if j not in exempt and _weak(a[:, j], p[j], prior[j], target)]
        why = f"its term explains under {WEAK_SHARE:.0%} of every measurement, so the data does not determine it"
        if not small:
            small = [j for j in free if j not in exempt and _bound_unearned(a, target, prior, lower, free, p, j)]
            why = (
                f"at its bound it lowers the error by under {BOUND_GAIN:.0%} of the error held at the "
                "spec's value, so the data does not tell the two apart"
            )
        if not small:
            return p, free, weak
        free = [j for j in free if j != small[0]]
        weak[small[0]] = why
