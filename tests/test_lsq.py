"""llm_planner.measure.lsq: a factor fitted at its bound is kept there only when the rows ask for it."""

from __future__ import annotations

import numpy as np

from llm_planner.measure.lsq import bounded_fit

ROWS = 8


def _rows(true_overhead: float, overhead_size: float, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of t = slope x + overhead: column 0 the slope's (x in 1..8), column 1 the overhead's
    (`overhead_size` each), relative noise on the targets."""
    x = np.arange(1.0, ROWS + 1)
    a = np.column_stack([x, np.full(ROWS, overhead_size)])
    return a, (a @ np.array([1.0, true_overhead])) * (1 + noise)


def test_an_overhead_the_rows_price_at_zero_is_fitted_at_zero():
    """The prior says 1, the rows say 0 and hold no scatter: the bound is the fit."""
    a, target = _rows(0.0, 1.0, np.zeros(ROWS))
    p, free, kept = bounded_fit(a, target, np.array([1.0, 1.0]), np.array([0.0, 0.0]), order=(1, 0), exempt=())
    assert free == [0, 1] and not kept and abs(p[1]) < 1e-9 and abs(p[0] - 1.0) < 1e-9


def test_scatter_that_pushes_a_small_term_to_its_bound_keeps_the_prior():
    """The truth is the prior, a term of 2% of the largest row; a tilt of 6% and scatter of 6% put
    it at 0, lowering the error by little: it keeps the prior and says why. A tilt of 5.5% leaves
    it just above 0: fitted."""
    scatter = np.array([0.06, -0.06] * (ROWS // 2))
    a, target = _rows(1.0, 0.16, np.linspace(-0.06, 0.06, ROWS) + scatter)
    p, free, kept = bounded_fit(a, target, np.array([1.0, 1.0]), np.array([0.0, 0.0]), order=(1, 0), exempt=())
    assert free == [0] and p[1] == 1.0 and "at its bound it lowers the error by under 10%" in kept[1]
    a, target = _rows(1.0, 0.16, np.linspace(-0.055, 0.055, ROWS) + scatter)
    p, free, kept = bounded_fit(a, target, np.array([1.0, 1.0]), np.array([0.0, 0.0]), order=(1, 0), exempt=())
    assert free == [0, 1] and 0 < p[1] < 0.1
