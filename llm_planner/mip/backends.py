"""MILP backends: a model held as numpy arrays, solved by HiGHS or Gurobi.

A `LinearModel` is

    minimise  c . v   s.t.  row_lower <= A v <= row_upper,  col_lower <= v <= col_upper,
              v_j integer where integrality[j]

with A a scipy sparse matrix. `ModelBuilder` assembles one from blocks of named
variables and blocks of rows given as COO triplets, so a formulation never adds
rows one by one through a modelling API (for 100k rows that is about 100x
slower than handing HiGHS the arrays).

Backends, chosen by name:
- "highs" (default, no licence): highspy, the model passed whole as a HighsLp.
- "gurobi": gurobipy, imported only when asked for. The licence that ships with
  the pip wheel is size-limited (2000 variables, 2000 linear constraints) and
  says so only when optimize() runs (error 10010); `solve_model` turns that into
  a BackendError that names the model's size and the ways out, or solves with
  HiGHS instead when the caller allowed the fallback.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

import highspy
import numpy as np
import scipy.sparse as sp

log = logging.getLogger(__name__)

BACKENDS = ("highs", "gurobi")
GUROBI_SIZE_LIMIT = 2000  # variables and linear constraints of the pip licence
GUROBI_SIZE_LIMIT_ERRNO = 10010
INTEGRALITY_TOL = 1e-6  # both backends: how far from integral a binary may be (Gurobi's default is 1e-5)


class BackendError(RuntimeError):
    """A backend that cannot be used (not installed, licence too small); the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class LinearModel:
    col_cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integrality: np.ndarray  # bool per column
    matrix: sp.csr_matrix  # [num_rows, num_cols]
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_blocks: tuple[tuple[str, int, tuple[int, ...]], ...] = ()  # (name, first column, shape)
    row_blocks: tuple[tuple[str, int, int], ...] = ()  # (name, first row, count)

    @property
    def num_cols(self) -> int:
        return len(self.col_cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    @property
    def num_integer(self) -> int:
        return int(self.integrality.sum())

    def col_names(self) -> list[str]:
        """Readable names ("x[0,3,1]") for a model dump."""
        names = [f"v{j}" for j in range(self.num_cols)]
        for name, first, shape in self.col_blocks:
            for offset, idx in enumerate(np.ndindex(*shape)):
                names[first + offset] = f"{name}[{','.join(map(str, idx))}]"
        return names

    def row_names(self) -> list[str]:
        names = [f"r{j}" for j in range(self.num_rows)]
        for name, first, count in self.row_blocks:
            for j in range(count):
                names[first + j] = f"{name}[{j}]"
        return names


class ModelBuilder:
    """Collects variable blocks and row blocks, then freezes them into a LinearModel."""

    def __init__(self) -> None:
        self._cost: list[np.ndarray] = []
        self._lower: list[np.ndarray] = []
        self._upper: list[np.ndarray] = []
        self._integer: list[np.ndarray] = []
        self._col_blocks: list[tuple[str, int, tuple[int, ...]]] = []
        self._coo: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._row_lower: list[np.ndarray] = []
        self._row_upper: list[np.ndarray] = []
        self._row_blocks: list[tuple[str, int, int]] = []
        self.num_cols = 0
        self.num_rows = 0

    def add_vars(
        self, name: str, shape: tuple[int, ...] | int, *, lower=0.0, upper=math.inf, integer=False, cost=0.0
    ) -> np.ndarray:
        """A block of variables; returns their column indices with the block's shape."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = int(np.prod(shape)) if shape else 1
        first = self.num_cols
        self._cost.append(np.broadcast_to(np.asarray(cost, dtype=float), shape).ravel().copy())
        self._lower.append(np.broadcast_to(np.asarray(lower, dtype=float), shape).ravel().copy())
        self._upper.append(np.broadcast_to(np.asarray(upper, dtype=float), shape).ravel().copy())
        self._integer.append(np.full(count, bool(integer)))
        self._col_blocks.append((name, first, shape))
        self.num_cols += count
        return np.arange(first, first + count).reshape(shape)

    def add_rows(self, name: str, rows, cols, vals, lower, upper) -> int:
        """Rows lower[r] <= sum vals * v[cols] <= upper[r], given as COO triplets with
        local row numbers 0..len(lower)-1. Returns how many rows were added."""
        lower = np.atleast_1d(np.asarray(lower, dtype=float))
        upper = np.broadcast_to(np.asarray(upper, dtype=float), lower.shape).copy()
        rows, cols, vals = (np.asarray(a).ravel() for a in (rows, cols, vals))
        assert len(rows) == len(cols) == len(vals), f"{name}: COO arrays differ in length"
        assert rows.size == 0 or (rows.min() >= 0 and rows.max() < len(lower)), f"{name}: row index out of range"
        assert cols.size == 0 or (cols.min() >= 0 and cols.max() < self.num_cols), f"{name}: column index out of range"
        self._coo.append((rows.astype(np.int64) + self.num_rows, cols.astype(np.int64), vals.astype(float)))
        self._row_lower.append(lower)
        self._row_upper.append(upper)
        self._row_blocks.append((name, self.num_rows, len(lower)))
        self.num_rows += len(lower)
        return len(lower)

    def add_row_list(self, name: str, rows: list[tuple[list[tuple[int, float]], float, float]]) -> int:
        """Rows given as (terms [(column, coefficient)], lower, upper); for families built in loops."""
        r, c, v = [], [], []
        for j, (terms, _, _) in enumerate(rows):
            for col, coef in terms:
                r.append(j)
                c.append(col)
                v.append(coef)
        return self.add_rows(name, r, c, v, [lo for _, lo, _ in rows], [hi for _, _, hi in rows])

    def build(self) -> LinearModel:
        def cat(parts, dtype=float):
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

        rows = cat([p[0] for p in self._coo], np.int64)
        cols = cat([p[1] for p in self._coo], np.int64)
        vals = cat([p[2] for p in self._coo])
        matrix = sp.csr_matrix((vals, (rows, cols)), shape=(self.num_rows, self.num_cols))
        matrix.sum_duplicates()
        matrix.eliminate_zeros()
        return LinearModel(
            col_cost=cat(self._cost),
            col_lower=cat(self._lower),
            col_upper=cat(self._upper),
            integrality=cat(self._integer, bool),
            matrix=matrix,
            row_lower=cat(self._row_lower),
            row_upper=cat(self._row_upper),
            col_blocks=tuple(self._col_blocks),
            row_blocks=tuple(self._row_blocks),
        )


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    time_limit_s: float = 60.0
    rel_gap: float = 1e-4
    threads: int = 0  # 0 = the backend's default
    seed: int = 0
    allow_fallback: bool = False  # gurobi unusable -> solve with highs
    detect_symmetry: bool = False  # the backend's own symmetry detection (--symmetry solver)


@dataclass(frozen=True, kw_only=True)
class BackendResult:
    status: str  # "optimal", "time_limit", "interrupted" (Ctrl-C), "feasible", "infeasible", "no_solution"
    values: np.ndarray | None  # column values of the best solution found
    objective: float  # of `values`; nan when there is none
    dual_bound: float  # proven lower bound on the optimum; -inf when unknown
    nodes: int
    backend: str  # the backend that actually solved it
    time_s: float
    note: str = ""  # e.g. why gurobi fell back to highs


def solve_model(
    model: LinearModel, backend: str, options: BackendOptions, warm_start: dict[int, float] | None = None
) -> BackendResult:
    """Solve with the named backend; BackendError when it cannot be used and no fallback is allowed."""
    if backend not in BACKENDS:
        raise BackendError(f"unknown MILP backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "highs":
        return _solve_highs(model, options, warm_start)
    try:
        return _solve_gurobi(model, options, warm_start)
    except BackendError as exc:
        if not options.allow_fallback:
            raise
        log.warning("%s; falling back to highs", exc)
        result = _solve_highs(model, options, warm_start)
        return _replace_note(result, f"gurobi unusable, solved with highs instead: {exc}")


def _replace_note(result: BackendResult, note: str) -> BackendResult:

    return replace(result, note=note)


# -- HiGHS ---------------------------------------------------------------------------


def _solve_highs(model: LinearModel, options: BackendOptions, warm_start: dict[int, float] | None) -> BackendResult:

    started = time.perf_counter()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(options.time_limit_s))
    h.setOptionValue("mip_rel_gap", float(options.rel_gap))
    h.setOptionValue("random_seed", int(options.seed))
    h.setOptionValue("mip_feasibility_tolerance", INTEGRALITY_TOL)
    h.setOptionValue("mip_detect_symmetry", bool(options.detect_symmetry))
    if options.threads > 0:
        h.resetGlobalScheduler(True)  # HiGHS keeps one thread pool per process, sized by the first solve
        h.setOptionValue("threads", int(options.threads))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = model.num_cols, model.num_rows
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = model.col_cost, _inf(model.col_lower, h), _inf(model.col_upper, h)
    lp.row_lower_, lp.row_upper_ = _inf(model.row_lower, h), _inf(model.row_upper, h)
    csc = model.matrix.tocsc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = csc.indptr, csc.indices, csc.data
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = model.num_cols, model.num_rows
    if model.num_integer:
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous for b in model.integrality
        ]
    h.passModel(lp)
    if warm_start:
        idx = np.fromiter(warm_start.keys(), dtype=np.int32)
        h.setSolution(len(idx), idx, np.fromiter(warm_start.values(), dtype=float))
    interrupted = _run_interruptibly(h)
    status = h.getModelStatus()
    info = h.getInfo()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    values = np.asarray(h.getSolution().col_value, dtype=float) if has_solution else None
    objective = float(info.objective_function_value) if has_solution else math.nan
    mip = bool(model.num_integer)
    bound = float(info.mip_dual_bound) if mip else objective
    S = highspy.HighsModelStatus
    if status == S.kOptimal:
        name, bound = "optimal", (bound if mip else objective)
    elif status in (S.kInfeasible, S.kUnboundedOrInfeasible):  # our models are bounded below
        name = "infeasible"
    elif interrupted or status == S.kInterrupt:
        name = "interrupted"  # with values: the incumbent; without: none was found
    elif status in (S.kTimeLimit, S.kSolutionLimit, S.kIterationLimit):
        name = "time_limit" if has_solution else "no_solution"
    else:
        name = "feasible" if has_solution else "no_solution"
        log.warning("highs stopped with status %s", h.modelStatusToString(status))
    return BackendResult(
        status=name,
        values=values,
        objective=objective,
        dual_bound=bound if math.isfinite(bound) else -math.inf,
        nodes=int(info.mip_node_count) if mip else 0,
        backend="highs",
        time_s=time.perf_counter() - started,
    )


def _run_interruptibly(h) -> bool:
    """Run HiGHS; True if Ctrl-C interrupted it.

    While it runs, SIGINT (in the main thread) asks HiGHS to stop instead of raising
    KeyboardInterrupt: HiGHS checks the request in its interrupt callbacks (simplex, IPM and
    branch-and-bound, where Python also runs the signal handler) and returns at once with its
    incumbent and bound. A second SIGINT quits at once (exit 130, nothing written). HiGHS runs in
    the calling thread: run from a Python thread, its worker threads now and then abort the
    interpreter's exit after an interrupt.
    """
    if threading.current_thread() is not threading.main_thread():
        h.run()  # no signal reaches another thread
        return False
    h.HandleUserInterrupt = True
    count = [0]

    def on_sigint(signum, frame) -> None:
        count[0] += 1
        if count[0] > 1:
            sys.stderr.write("interrupted again: quitting at once, no plan written\n")
            os._exit(130)
        log.warning("interrupted: stopping the MILP solver and keeping its best plan (Ctrl-C again to quit at once)")
        h.cancelSolve()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        h.run()
    finally:
        signal.signal(signal.SIGINT, previous)
    return count[0] > 0


def _inf(a: np.ndarray, h) -> np.ndarray:
    inf = h.getInfinity()
    return np.clip(a, -inf, inf)


# -- Gurobi --------------------------------------------------------------------------


def _import_gurobi():
    try:
        import gurobipy
    except ImportError:
        raise BackendError(
            "the gurobi backend needs the gurobipy package, which is not installed "
            "(install the package's [gurobi] extra, or use the highs backend)"
        ) from None
    return gurobipy


def _solve_gurobi(model: LinearModel, options: BackendOptions, warm_start: dict[int, float] | None) -> BackendResult:
    gp = _import_gurobi()
    started = time.perf_counter()
    with gp.Env(empty=True) as env:
        env.setParam("OutputFlag", 0)
        env.start()
        with gp.Model("llm_planner", env=env) as m:
            v = m.addMVar(
                model.num_cols,
                lb=model.col_lower,
                ub=model.col_upper,
                obj=model.col_cost,
                vtype=np.where(model.integrality, gp.GRB.INTEGER, gp.GRB.CONTINUOUS),
            )
            _add_gurobi_rows(m, v, model)
            m.Params.TimeLimit = float(options.time_limit_s)
            m.Params.MIPGap = float(options.rel_gap)
            m.Params.Seed = int(options.seed)
            m.Params.IntFeasTol = INTEGRALITY_TOL
            m.Params.Symmetry = 2 if options.detect_symmetry else 0
            if options.threads > 0:
                m.Params.Threads = int(options.threads)
            if warm_start:
                start = np.full(model.num_cols, gp.GRB.UNDEFINED)
                start[list(warm_start)] = list(warm_start.values())
                v.Start = start
            try:
                m.optimize()
            except gp.GurobiError as exc:
                if exc.errno == GUROBI_SIZE_LIMIT_ERRNO:
                    raise BackendError(_licence_message(m.NumVars, m.NumConstrs)) from None
                raise BackendError(f"gurobi failed: {exc} (error {exc.errno})") from None
            return _gurobi_result(gp, m, v, model, started)


def _add_gurobi_rows(m, v, model: LinearModel) -> None:
    """Equalities, <= and >= rows; a ranged row becomes two constraints."""
    lo, hi, A = model.row_lower, model.row_upper, model.matrix
    eq = np.isfinite(lo) & np.isfinite(hi) & (lo == hi)
    le = np.isfinite(hi) & ~eq
    ge = np.isfinite(lo) & ~eq
    for mask, sense, rhs in ((eq, "=", lo), (le, "<", hi), (ge, ">", lo)):
        if mask.any():
            m.addMConstr(A[mask], v, sense, rhs[mask])


def _licence_message(num_vars: int, num_constrs: int) -> str:
    return (
        f"gurobi refused the model: it has {num_vars} variables and {num_constrs} linear constraints, "
        f"more than the size-limited licence that comes with the gurobipy package allows "
        f"({GUROBI_SIZE_LIMIT} variables, {GUROBI_SIZE_LIMIT} constraints). Install a full Gurobi licence, "
        f"use the highs backend, or allow the fallback to highs (--allow-backend-fallback)"
    )


def _gurobi_result(gp, m, v, model: LinearModel, started: float) -> BackendResult:
    GRB = gp.GRB
    has_solution = m.SolCount > 0
    values = np.asarray(v.X, dtype=float) if has_solution else None
    objective = float(m.ObjVal) if has_solution else math.nan
    mip = bool(model.num_integer)
    bound = float(m.ObjBound) if mip and m.Status != GRB.INFEASIBLE else (objective if has_solution else -math.inf)
    if m.Status == GRB.OPTIMAL:
        name = "optimal"
    elif m.Status in (GRB.INFEASIBLE, GRB.INF_OR_UNBD):
        name = "infeasible"
    elif m.Status == GRB.INTERRUPTED:  # Ctrl-C: gurobi stops optimize() itself and keeps its incumbent
        name = "interrupted"
    elif m.Status in (GRB.TIME_LIMIT, GRB.SOLUTION_LIMIT, GRB.NODE_LIMIT):
        name = "time_limit" if has_solution else "no_solution"
    else:
        name = "feasible" if has_solution else "no_solution"
        log.warning("gurobi stopped with status %s", m.Status)
    return BackendResult(
        status=name,
        values=values,
        objective=objective,
        dual_bound=bound if math.isfinite(bound) else -math.inf,
        nodes=int(m.NodeCount) if mip else 0,
        backend="gurobi",
        time_s=time.perf_counter() - started,
    )
