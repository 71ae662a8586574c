"""The exact MILP for placement, data parallelism and scheduling: `solve_milp(problem, options)`.

Sets and data (all from the PlacementProblem): tasks i in V, edges e = (u, v) in E,
devices k in K, K_i the devices that can run i; a batch of Q samples cut into at
most S shards s; t(i,k,b) = max_j (f_ikj + g_ikj b) for b >= 1 (0 for b = 0), the
task time; c(e,k,l,b) = F_ekl + G_ekl b the transfer time (0 when k = l); W_i
weight bytes, m_i bytes per sample, cap_k device memory.

Variables: x[s,i,k] in {0,1} (task i of shard s on device k, only k in K_i);
b_s in {0..Q} shard size and u_s in {0,1} shard used (S > 1 only; with S = 1,
b_1 = Q is a constant); y[s,i,k] = b_s x[s,i,k]; latency: start[s,i] >= 0,
o_pq in {0,1}, makespan C; throughput: max load T.

 (1) assignment     sum_{k in K_i} x[s,i,k] = u_s                          for all s, i
 (2) shard sizes    sum_s b_s = Q;  u_s <= b_s <= Q u_s;  b_1 >= b_2 >= ... >= b_S
                    (empty shards allowed, sizes ordered to break shard symmetry)
 (3) McCormick      y <= Q x;  y <= b_s;  y >= b_s - Q (1 - x);  y >= 0
                    (exact because x is binary: y = b_s when x = 1, else 0)
 (4) task time      time_k(s,i) = t(i,k,Q) x[s,i,k]                          if S = 1,
                    time_k(s,i) = d[s,i,k] >= f_ikj x[s,i,k] + g_ikj y[s,i,k]  for all j otherwise
                    (one inequality per roofline piece; exact since t is the max of its pieces and
                    d only pushes the objective up); time(s,i) = sum_k time_k(s,i)
 (5) precedence     start[s,v] >= start[s,u] + time(s,u) + w[s,e]           for all s, e = (u, v)
                    w[s,e] >= F_ekG (x[s,u,k] + X - 1) + G_ekG (b_s - Q (2 - x[s,u,k] - X)),
                    X = sum_{l in G} x[s,v,l], for each device k and group G of devices l != k that
                    e reaches from k at one cost (F_ekG, G_ekG): exact, since X is 0 or 1; a cluster
                    has a few such groups per device, not K - 1 (one link class each). When c is the
                    same on every link this is
                    w[s,e] >= F (x[s,u,k] - x[s,v,k]) + G (b_s - Q (1 - x[s,u,k] + x[s,v,k])) for all k
 (6) no overlap     for items p = (s,i), q = (s',j) that share a device and are not ordered by a
                    path (i.e. not s = s' with i ->* j or j ->* i), for each common device k:
                    start_q >= start_p + time_k(p) - H (1 - o_pq) - H (2 - x_pk - x_qk)
                    start_p >= start_q + time_k(q) - H o_pq       - H (2 - x_pk - x_qk)
                    with H an upper bound on the optimal makespan (the warm start's, else the
                    serial time); C <= H
 (7) makespan       C >= start[s,i] + time(s,i)                             for every sink i
 (8) memory         sum_i W_i h[i,k] + sum_{s,i} m_i y[s,i,k] <= cap_k,  h[i,k] >= x[s,i,k]
                    (weights once per device whatever the number of shards, per-sample memory per
                    shard; only where memory counts on k; h = x when S = 1)
 (9) colocation     x[s,i,k] = x[s,j,k] for tasks i, j of one colocation group
(10) loads          T >= sum_{s,i} time_k(s,i) + charges_k                  for all k
                    direct model: every cut edge's transfer time is charged to both its ends
                    (one charge per sending device and group of receivers at one cost, one per
                    receiving device and group of senders, each linearised as in (5));
                    host-staged model (imported workloads): an accelerator pays hop_u b_s once for
                    each of its tasks u with a successor elsewhere, and once for each outside task u
                    with a successor on it; a CPU pays no transfers. Each charge is a variable
                    bounded below by the (5)-style linearisation of "u on k and v not on k".
(11) contiguity     (throughput, --contiguous) z[s,i,k] >= x[s,i,k]; z[s,w,k] >= z[s,v,k] and
                    x[s,w,k] <= x[s,v,k] + 1 - z[s,v,k] for every edge (v, w): z marks what is
                    reachable from device k's tasks, and nothing reachable that left k may come
                    back, so each device's task set is contiguous (Tarnawski et al., NeurIPS 2020).
(12) objective      latency: min C;  throughput: min T (objective_s = T / Q seconds per sample)
(13) symmetry       (solve/milp/symmetry.py) identical devices and servers ordered by the criterion
(14) exclusivity    (tensor-parallel groups) use[k] binary for each group and each device in one;
                    x[s,i,k] <= use[k];  use[d] + sum_{G containing d} use[G] <= 1 for each such d

Throughput models have no start times and no ordering variables (only (1)-(4),
(8)-(11)): that is what makes graphs of hundreds of tasks solvable.

Solution path: the best baseline plan is the warm start. When it already meets
L = bounds.combined.lower_bound within rel_gap it is returned as proven optimal and
no model is built (except with --contiguous, which the baselines need not obey).
Otherwise the backend (HiGHS by default, Gurobi on request,
llm_planner.mip.backends) returns the incumbent and its dual bound; the
assignment and, for latency, each device's order (by
start time) go to schedule.make_plan, which recomputes start times as soon as
possible, so the plan's objective can only be <= the MILP's; when the solver
proved optimality the two must agree (an internal invariant). The plan carries
the better of the solver's dual bound and L, and is `optimal` when it meets
either within rel_gap. L is not given to the solver as a cut on C (T): tried, it
flattens the objective of every node LP below L, and the MILP proved
rwnn-ws-5x8 in 417 s instead of 94 s.

Ctrl-C during the backend's solve (solve.milp.backends) stops it within a second and
keeps its incumbent: the plan then has the status `interrupted` (or `optimal`
when a bound proves it), its bound the better of the solver's and L. Without an
incumbent of the solver's own, the warm start is that plan; without either,
SolveInterrupted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from llm_planner.core.fmt import fmt_bytes
from llm_planner.core.plan import Plan
from llm_planner.mip.backends import BackendError, BackendOptions, BackendResult, solve_model
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.errors import SolveError, SolveInterrupted
from llm_planner.placement.fit import (
    fits_steady_state,
    infeasibility_reason,
    plan_arrays,
    solve_in_flight,
    steady_state_shortfall,
)
from llm_planner.placement.milp.exclusion import Excluded, exclude_plans
from llm_planner.placement.milp.model import Formulation
from llm_planner.placement.milp.solution import read_solution, warm_start_values
from llm_planner.placement.milp.symmetry import CRITERIA, canonical_plan
from llm_planner.placement.milp.warm import contiguous_split
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem, ProblemError, restrict_devices
from llm_planner.placement.schedule import make_plan, with_bound
from llm_planner.placement.session import SolveSession

log = logging.getLogger(__name__)

OBJECTIVE_SCALE = 100.0  # the model's time unit makes the reference objective about this...
MAX_SCALED_TIME = 1e7  # ...unless that would make some task or transfer time larger than this
# Relative tolerance, on top of the solver's gap, between the MILP's objective and the schedule's:
# the backends accept binaries within 1e-6 of integral, and the big-M rows multiply that by
# a few times the objective.
AGREEMENT_TOL = 1e-4
# Throughput plans whose steady state does not fit, cut off one at a time (_fitting_optimum) before
# solve_in_flight re-solves with the memory of more batches.
MAX_EXCLUDED = 8


def solve_milp(problem: PlacementProblem, options: SolveOptions, session: SolveSession | None = None) -> Plan:
    """Solve the MILP of the module docstring; SolveError for an infeasible instance or unusable backend.

    Throughput: the memory rows (8) count one batch, but the plan keeps plan.batches_in_flight
    batches in flight; when their memory does not fit, the MILP is solved again without that plan
    (_fitting_optimum: the first plan that fits is the optimum over those that fit), and past
    MAX_EXCLUDED such plans, with the per-sample
    memory of more batches (problem.fit.solve_in_flight), the warm start (which fits) taken when it is
    better, and the plan keeps the first solve's bound. `session`: the problem's baselines and bound,
    computed once (solve.session); a new one otherwise.
    """

    started = time.perf_counter()
    options = options.check()
    session = session or SolveSession(problem, options)
    if options.contiguous and problem.objective != "throughput":
        raise ProblemError("the contiguous restriction (--contiguous) applies to the throughput objective only")
    first = True

    def once(posed: PlacementProblem) -> Plan | None:
        nonlocal first
        posed_session = session if posed is problem else SolveSession(posed, options)
        if first:
            first = False
            return _fitting_optimum(posed_session)
        try:
            return _solve_milp_once(posed_session)
        except SolveInterrupted:
            raise
        except SolveError as exc:  # no plan fits that many batches; one that needs fewer may still exist
            log.info("milp: solving again for the batches in flight: %s", exc)
            return None

    # with --contiguous the warm start (a baseline) need not be contiguous, so it is no fallback
    fallback = None if options.contiguous else lambda: _warm_start_plan(session)
    plan = solve_in_flight(problem, once, fallback=fallback)
    if plan is None:
        raise SolveError(
            "the MILP's plans keep more batches in flight than device memory holds, and no plan it found "
            "with the memory of more batches fits its own steady state (docs/objectives.md, Memory)"
        )
    if plan.solver.name != "milp":  # the warm start, which fits, beat the re-solves
        details = {
            "warm_start": plan.solver.name,
            "warm_start_objective_s": plan.objective_s,
            "contiguous": False,
            "stopped": "the MILP's plan keeps more batches in flight than memory holds; the warm start fits",
        }
        plan = replace(
            plan,
            solver=replace(
                plan.solver,
                name="milp",
                status="feasible",
                time_s=time.perf_counter() - started,
                backend=options.backend,
                details=details,
            ),
        )
    return plan


def _fitting_optimum(session: SolveSession) -> Plan:
    """_solve_milp_once; then, while its throughput plan's steady state does not fit (problem.fit), the
    same MILP without that plan (solve.milp.exclusion), at most MAX_EXCLUDED times. The first plan that
    fits is the optimum over the plans that fit: every better one was cut off for not fitting. A plan
    that still does not fit goes to solve_in_flight's repair (the memory of more batches)."""
    problem = session.problem
    plan = _solve_milp_once(session)
    excluded: list[Excluded] = []
    while problem.objective == "throughput" and len(excluded) < MAX_EXCLUDED and not fits_steady_state(problem, plan):
        log.info("milp: %s; solving again without that plan", steady_state_shortfall(problem, plan))
        excluded.append(plan_arrays(problem, plan))
        try:
            plan = _solve_milp_once(session, excluded)
        except SolveError as exc:  # no other plan fits one batch: none fits its steady state
            log.info("milp: no plan left: %s", exc)
            break
    if excluded and fits_steady_state(problem, plan):
        details = {**plan.solver.details, "excluded_plans": len(excluded)}
        plan = replace(plan, solver=replace(plan.solver, details=details))
    return plan


def _solve_milp_once(session: SolveSession, excluded: list[Excluded] | None = None) -> Plan:
    """solve_milp for one batch's memory (the session's problem), without the plans `excluded`."""

    problem, options = session.problem, session.options
    started = time.perf_counter()
    warm = _warm_start_plan(session)
    bound_s = session.bound_s
    if warm is not None and options.symmetry in CRITERIA:
        warm = canonical_plan(problem, options.symmetry, warm)  # a warm start that obeys the symmetry rows
    if warm is not None and not options.contiguous and session.proven(warm.objective_s):
        return _proven_warm_start(warm, bound_s, started, options)
    unit_s, horizon = _scales(problem, warm)
    form = Formulation(
        problem, contiguous=options.contiguous, unit_s=unit_s, horizon=horizon, symmetry=options.symmetry
    )
    exclude_plans(form, excluded or [])
    model = form.build()
    log.info(
        "milp: %d variables (%d integer), %d rows, %d nonzeros",
        model.num_cols,
        model.num_integer,
        model.num_rows,
        model.matrix.nnz,
    )
    backend_options = BackendOptions(
        time_limit_s=options.time_limit_s,
        rel_gap=options.rel_gap,
        threads=options.threads,
        seed=options.seed,
        allow_fallback=options.allow_backend_fallback,
        detect_symmetry=options.symmetry == "solver",
    )
    start_values = warm_start_values(form, warm) if warm is not None else None
    try:
        result = solve_model(model, options.backend, backend_options, start_values)
    except BackendError as exc:
        raise SolveError(str(exc)) from None
    if result.status == "infeasible":
        assert warm is None or options.contiguous, "the MILP rejects a feasible warm start: formulation bug"
        raise SolveError(_infeasible_message(problem, options))
    if result.values is None:
        return _without_incumbent(result, warm, bound_s, started, options)
    plan = with_bound(_plan_from_solution(problem, form, result, model, started, options, warm), bound_s)
    if plan.solver.status in ("time_limit", "interrupted") and session.proven(plan.objective_s):
        # the solver could not prove it, the bounds of bounds do
        plan = replace(
            plan,
            solver=replace(plan.solver, status="optimal", details={**plan.solver.details, "proven_by": "lower bound"}),
        )
    return plan


def _without_incumbent(
    result: BackendResult, warm: Plan | None, bound_s: float, started: float, options: SolveOptions
) -> Plan:
    """Stopped before the solver had a plan of its own: the warm start if there is one (status
    `interrupted`), else SolveInterrupted (Ctrl-C) or SolveError (time limit)."""

    if result.status != "interrupted":
        raise SolveError(
            f"the MILP found no feasible plan within the time limit of {options.time_limit_s:g} s "
            f"(status {result.status}); raise --time-limit"
        )
    if warm is None or options.contiguous:  # a warm start need not be contiguous
        raise SolveInterrupted(
            f"interrupted after {time.perf_counter() - started:.1f} s, before the MILP found any plan"
        )
    details = {
        "warm_start": warm.solver.name,
        "warm_start_objective_s": warm.objective_s,
        "nodes": result.nodes,
        "contiguous": False,
        "stopped": "interrupted before the solver improved on the warm start",
    }
    return replace(
        warm,
        lower_bound_s=float(min(bound_s, warm.objective_s)),
        solver=replace(
            warm.solver,
            name="milp",
            status="interrupted",
            time_s=time.perf_counter() - started,
            backend=result.backend,
            details=details,
        ),
    )


def _proven_warm_start(warm: Plan, bound_s: float, started: float, options: SolveOptions) -> Plan:
    """The warm start as the MILP's plan when it already meets the lower bound within rel_gap:
    no plan is better by more than that, so no model is built."""
    details = {
        "warm_start": warm.solver.name,
        "warm_start_objective_s": warm.objective_s,
        "nodes": 0,
        "contiguous": False,
        "stopped": "the warm start meets the lower bound",
    }
    log.info(
        "milp: the warm start (%s, %.6g s) meets the lower bound %.6g s: no model built",
        warm.solver.name,
        warm.objective_s,
        bound_s,
    )
    return replace(
        warm,
        lower_bound_s=float(min(bound_s, warm.objective_s)),
        solver=replace(
            warm.solver,
            name="milp",
            status="optimal",
            time_s=time.perf_counter() - started,
            backend=options.backend,
            details=details,
        ),
    )


def _warm_start_plan(session: SolveSession) -> Plan | None:
    """The better of the session's best baseline and (throughput) the contiguous split; None if
    neither fits (throughput: in its steady state, problem.fit)."""

    problem = session.problem
    physical = restrict_devices(problem, list(range(problem.num_physical))) if problem.has_groups else problem
    found = (session.best_baseline, contiguous_split(physical))
    plans = [p for p in found if p is not None and fits_steady_state(problem, p)]
    return min(plans, key=lambda p: p.objective_s, default=None)


def _scales(problem: PlacementProblem, warm: Plan | None) -> tuple[float, float]:
    """(model time unit in seconds, horizon H in model units)."""

    full = np.where(problem.supported, task_times(problem, problem.batch_size), 0.0)
    comm = problem.comm_fixed + problem.comm_slope * problem.batch_size
    serial_s = problem.max_shards * (
        full.max(axis=1).sum() + (comm.max(axis=(1, 2)).sum() if problem.num_edges else 0.0)
    )
    warm_s = None
    if warm is not None:
        warm_s = warm.objective_s * (problem.batch_size if problem.objective == "throughput" else 1.0)
    reference = warm_s if warm_s else serial_s
    largest_s = max(float(full.max(initial=0.0)), float(comm.max(initial=0.0)))
    unit_s = max(reference / OBJECTIVE_SCALE, largest_s / MAX_SCALED_TIME)
    if not (np.isfinite(unit_s) and unit_s > 1e-300):  # all times zero (or denormal): any unit will do
        unit_s = 1.0
    horizon_s = (
        min(serial_s, warm_s * (1 + 1e-6)) if warm_s is not None and problem.objective == "latency" else serial_s
    )
    return unit_s, max(horizon_s / unit_s, 1e-9)


def _plan_from_solution(
    problem: PlacementProblem,
    form: Formulation,
    result: BackendResult,
    model,
    started: float,
    options: SolveOptions,
    warm: Plan | None,
) -> Plan:
    sizes, assignments, orders = read_solution(form, result.values)
    per = problem.batch_size if problem.objective == "throughput" else 1
    milp_s = result.objective * form.unit / per
    bound_s = result.dual_bound * form.unit / per
    details = {
        "num_vars": model.num_cols,
        "num_integer": model.num_integer,
        "num_rows": model.num_rows,
        "nonzeros": int(model.matrix.nnz),
        "nodes": result.nodes,
        "mip_gap": _gap(milp_s, max(0.0, bound_s)),  # no bound of the solver's own (-inf): against 0, as stated
        "milp_objective_s": milp_s,
        "solve_time_s": result.time_s,
        "contiguous": bool(options.contiguous),
        "warm_start": warm.solver.name if warm is not None else "",
        "warm_start_objective_s": warm.objective_s if warm is not None else None,
    }
    if result.note:
        details["backend_note"] = result.note
    plan = make_plan(
        problem,
        sizes,
        assignments,
        solver="milp",
        status=result.status,
        started_at=started,
        lower_bound_s=max(0.0, bound_s),
        backend=result.backend,
        details=details,
        device_orders=orders,
    )
    _check_agreement(problem, plan, milp_s, bound_s, result.status, options)
    if plan.lower_bound_s > plan.objective_s:  # above the plan by float noise only (checked above)
        plan = replace(plan, lower_bound_s=plan.objective_s)
    return plan


def _gap(objective: float, bound: float) -> float:
    return max(0.0, (objective - bound) / objective) if objective > 0 else 0.0


def _check_agreement(
    problem: PlacementProblem, plan: Plan, milp_s: float, bound_s: float, status: str, options: SolveOptions
) -> None:
    """The schedule's objective is never above the MILP's; at a proven optimum they agree."""
    tol = AGREEMENT_TOL * max(abs(milp_s), 1e-12)
    assert plan.objective_s <= milp_s + tol, (
        f"schedule objective {plan.objective_s} above the MILP's {milp_s}: formulation bug"
    )
    assert bound_s <= plan.objective_s + tol + 1e-9 * abs(bound_s), (
        f"dual bound {bound_s} above a feasible plan's {plan.objective_s}"
    )
    if status == "optimal":
        assert plan.objective_s >= milp_s * (1 - options.rel_gap) - tol, (
            f"schedule objective {plan.objective_s} below the proven optimum {milp_s}: formulation bug"
        )
    elif plan.objective_s < milp_s - tol:
        log.info("milp: the ASAP schedule improves the solver's incumbent %.6g s to %.6g s", milp_s, plan.objective_s)


def _infeasible_message(problem: PlacementProblem, options: SolveOptions) -> str:

    why = infeasibility_reason(problem)
    if "heuristics" in why:  # every task fits somewhere and the total suffices: the packing itself fails
        caps = ", ".join(f"{n} {fmt_bytes(c)}" for n, c in zip(problem.device_names, problem.mem_capacity))
        why = (
            f"each task fits on some device and the devices' total memory suffices, but no assignment "
            f"packs the tasks into the devices ({caps})"
        )
    extra = " with each device's tasks contiguous (--contiguous)" if options.contiguous else ""
    return f"the MILP proved that no placement fits in device memory{extra}: {why}"
