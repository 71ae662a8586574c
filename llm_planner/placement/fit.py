"""Whether a problem can fit in memory at all: the memory a task or colocation group needs
on a device, and a sentence on why no placement fits (a proof where there is one); and
whether a throughput plan's steady state fits.

The baselines place tasks with the same ledger (solve/baselines/); the pipeline refuses a
problem that provably cannot fit before any solver runs.

Steady state. A throughput plan keeps B = plan.batches_in_flight batches in flight,
ceil(makespan / max_load) (llm_planner.core.plan.batches_in_flight: the launcher runs that many),
and every device holds the per-sample memory (KV cache) of each of them:

    sum_i W_i [k holds i] + B * sum_{(s, i) on k} m_i b_s  <=  mem_capacity[k]

(weights once, per-sample memory once per batch in flight, the workspace reserved in
mem_capacity as for one batch: it is transient, one task runs at a time). A latency plan has
B = 1, so this is the one-batch check. Solvers keep only throughput plans that pass it
(`solve_in_flight` re-solves a problem whose per-sample memory is scaled by B until one does).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Callable

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.placement.problem import PlacementProblem

log = logging.getLogger(__name__)

MAX_IN_FLIGHT_RESOLVES = 8  # solve_in_flight: re-solves with more batches' memory before giving up


def topo_order(problem: PlacementProblem) -> list[int]:
    return [problem.graph.index(n) for n in problem.graph.topological_order()]


def colocation_units(problem: PlacementProblem) -> dict[int, list[int]]:
    """Task -> the members of its colocation group (itself alone if none)."""
    unit = {i: [i] for i in range(problem.num_tasks)}
    for group in problem.colocate_groups():
        for i in group:
            unit[i] = group
    return unit


def runs_all(problem: PlacementProblem, members: list[int], k: int) -> bool:
    return bool(problem.supported[members, k].all())


class MemoryLedger:
    """Memory in use per device while a greedy places tasks for one shard of `batch` samples."""

    def __init__(self, problem: PlacementProblem, batch: int):
        self.p, self.batch = problem, batch
        self.used = np.zeros(problem.num_devices)
        self.each = problem.task_memory_bytes(batch)

    def need(self, members: list[int], k: int) -> float:
        return float(sum(self.each[i] for i in members if self.p.mem_counts[i, k]))

    def room(self, members: list[int], k: int) -> bool:
        return self.used[k] + self.need(members, k) <= self.p.mem_capacity[k]

    def add(self, members: list[int], k: int) -> None:
        self.used[k] += self.need(members, k)


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB"


def _unit_shortfalls(problem: PlacementProblem) -> list[tuple[float, str]]:
    """(shortfall bytes, sentence) for every task or colocation group too big for every device that runs it."""
    batch = math.ceil(problem.batch_size / problem.max_shards)  # some shard is at least this big
    ledger, units = MemoryLedger(problem, batch), colocation_units(problem)
    seen: set[int] = set()
    out = []
    for i in topo_order(problem):
        members = units[i]
        if i in seen:
            continue
        seen.update(members)
        what = (
            f"task {problem.graph.tasks[i].name!r}"
            if len(members) == 1
            else f"colocation group {problem.graph.tasks[i].colocate_group!r}"
        )
        able = [k for k in range(problem.num_devices) if runs_all(problem, members, k)]
        if not able and len(members) > 1:  # not a memory problem: placement_conflict names it
            continue
        if not able:
            out.append((math.inf, f"no device can run {what}"))
            continue
        k = min(able, key=lambda d: ledger.need(members, d) - problem.mem_capacity[d])
        short = ledger.need(members, k) - problem.mem_capacity[k]
        if short > 0:
            out.append(
                (
                    short,
                    f"{what} needs {_gb(ledger.need(members, k))} for a shard of {batch} samples but the best device "
                    f"that can run it, {problem.device_names[k]!r}, holds {_gb(problem.mem_capacity[k])} "
                    f"(short by {_gb(short)})",
                )
            )
    return out


def placement_conflict(problem: PlacementProblem) -> str | None:
    """A sentence when a colocation group's tasks run on no one device together (each may run
    somewhere, but the group must share a device); else None."""
    for group in problem.colocate_groups():
        if any(runs_all(problem, group, k) for k in range(problem.num_devices)):
            continue
        name = problem.graph.tasks[group[0]].colocate_group
        return (
            f"colocate_group {name!r}: its tasks must run on one device, but no device runs all of them: "
            f"{'; '.join(_where_each_runs(problem, group))}"
        )
    return None


def _where_each_runs(problem: PlacementProblem, group: list[int], most: int = 3) -> list[str]:
    """'task' on its devices (in the cluster's order), one task for each distinct set of devices, so that the
    sets that share no device show."""
    shown: dict[tuple[int, ...], int] = {}
    for i in group:
        shown.setdefault(tuple(int(k) for k in np.flatnonzero(problem.supported[i])), i)
    out = []
    for devices, i in list(shown.items())[:most]:
        names = [problem.device_names[k] for k in devices]
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out.append(f"{problem.graph.tasks[i].name!r} on {listed or 'none'}")
    if len(shown) > most:
        out.append(f"{len(shown) - most} more sets of devices")
    return out


def memory_shortfall(problem: PlacementProblem) -> str | None:
    """A sentence when no placement can fit in memory, provably (a task or colocation group
    fits no device that runs it, or the tasks need more than all devices hold); else None."""
    units = _unit_shortfalls(problem)
    if units:
        units.sort(key=lambda u: -u[0])
        more = f" ({len(units) - 1} more task(s) do not fit either)" if len(units) > 1 else ""
        return units[0][1] + more
    need = _total_need(problem)
    capacity = float(problem.mem_capacity.sum())
    if need > capacity:
        return (
            f"the tasks need at least {_gb(need)} of device memory in all "
            f"but the devices hold {_gb(capacity)} (short by {_gb(need - capacity)})"
        )
    return None


def _total_need(problem: PlacementProblem) -> float:
    each = problem.task_memory_bytes(problem.batch_size)
    need = 0.0
    for i in range(problem.num_tasks):
        able = problem.supported[i]
        if (problem.mem_counts[i] | ~able).all():  # memory counts wherever it can run
            need += each[i]
    return need


def infeasibility_reason(problem: PlacementProblem) -> str:
    """A sentence on why no placement fits in memory (or why the heuristics found none)."""
    provable = placement_conflict(problem) or memory_shortfall(problem)
    if provable is not None:
        return provable
    need, capacity = _total_need(problem), float(problem.mem_capacity.sum())
    whole = [k for k in range(problem.num_devices) if problem.supported[:, k].all()]
    single = ""
    if whole:
        ledger = MemoryLedger(problem, problem.batch_size)
        all_tasks = list(range(problem.num_tasks))
        k = min(whole, key=lambda d: ledger.need(all_tasks, d) - problem.mem_capacity[d])
        short = ledger.need(all_tasks, k) - problem.mem_capacity[k]
        if short > 0:
            single = (
                f"; on one device the model needs {_gb(ledger.need(all_tasks, k))} but the roomiest, "
                f"{problem.device_names[k]!r}, holds {_gb(problem.mem_capacity[k])} (short by {_gb(short)})"
            )
    else:
        single = "; no single device can run every task"
    total = _gb(capacity) if math.isfinite(capacity) else "unlimited"
    steady = (
        " (throughput: with the per-sample memory of every batch its steady state keeps in flight)"
        if problem.objective == "throughput"
        else ""
    )
    return (
        f"every task fits on some device that can run it and the total need ({_gb(need)}) is within the total capacity "
        f"({total}), but the greedy heuristics found no placement that fits{steady}{single}; "
        "the MILP solver may still find one"
    )


def plan_arrays(problem: PlacementProblem, plan: Plan) -> tuple[list[int], list[list[int]]]:
    """(shard sizes, per shard the device index of every task) of a plan of `problem`."""
    dev = {name: k for k, name in enumerate(problem.device_names)}
    assigns = [[dev[a[t.name]] for t in problem.graph.tasks] for a in plan.shard_assignments]
    return list(plan.shard_sizes), assigns


def steady_state_memory(problem: PlacementProblem, plan: Plan) -> np.ndarray:
    """[K] bytes on each device in the plan's steady state (module docstring): weights once,
    per-sample memory once per batch in flight; the workspace is reserved in mem_capacity."""
    sizes, assigns = plan_arrays(problem, plan)
    return problem.device_memory_used(sizes, assigns, batches=plan.batches_in_flight)


def steady_state_shortfall(problem: PlacementProblem, plan: Plan) -> str | None:
    """A sentence on the device most over its capacity in the plan's steady state; None when it fits."""
    used = steady_state_memory(problem, plan)
    over = used - problem.mem_capacity
    k = int(np.argmax(over))
    if over[k] <= 0:
        return None
    return (
        f"device {problem.device_names[k]!r} needs {_gb(used[k])} for {plan.batches_in_flight} batch(es) in flight "
        f"but holds {_gb(problem.mem_capacity[k])} (short by {_gb(over[k])})"
    )


def fits_steady_state(problem: PlacementProblem, plan: Plan) -> bool:
    return steady_state_shortfall(problem, plan) is None


def in_flight_problem(problem: PlacementProblem, batches: int) -> PlacementProblem:
    """The problem with every task's per-sample memory counted `batches` times: a plan of it fits
    `batches` batches in flight (times, devices and inputs unchanged, so it is a plan of `problem`)."""
    return replace(problem, mem_bytes_per_sample=problem.mem_bytes_per_sample * batches)


def solve_in_flight(
    problem: PlacementProblem,
    solve_once: Callable[[PlacementProblem], Plan | None],
    fallback: Callable[[], Plan | None] | None = None,
) -> Plan | None:
    """A plan of solve_once whose steady state fits (module docstring); None when none is found.

    Latency: solve_once(problem) as it is. Throughput: when the plan needs B batches in flight and
    their memory does not fit, solve_once again on in_flight_problem(problem, B') with B' the larger
    of B and one more than the last B' tried, until the plan fits (a plan of the scaled problem
    fits whenever it needs at most B' batches) or MAX_IN_FLIGHT_RESOLVES re-solves fail. Scaling
    every task's memory by B' also charges plans that need fewer batches, so after a repair the
    better of its plan and `fallback()` (a plan known to fit, e.g. the best baseline) is returned.
    The plan's lower_bound_s comes from the first solve (a bound over plans that fit one batch
    bounds the plans whose steady state fits: they are fewer); a re-solve's own bound is not kept.
    """
    plan = solve_once(problem)
    if plan is None or problem.objective != "throughput" or fits_steady_state(problem, plan):
        return plan
    first_bound, assumed = plan.lower_bound_s, 1
    for _ in range(MAX_IN_FLIGHT_RESOLVES):
        log.info(
            "%s: %s; solving again with the memory of more batches",
            plan.solver.name,
            steady_state_shortfall(problem, plan),
        )
        assumed = max(assumed + 1, plan.batches_in_flight)
        plan = solve_once(in_flight_problem(problem, assumed))
        if plan is None or fits_steady_state(problem, plan):
            break
    found = [
        p
        for p in (plan, fallback() if fallback is not None else None)
        if p is not None and fits_steady_state(problem, p)
    ]
    if not found:
        return None
    best = min(found, key=lambda p: p.objective_s)
    details = {**best.solver.details, "memory_of_batches": assumed} if best is plan else dict(best.solver.details)
    status = "feasible" if best.solver.status == "optimal" else best.solver.status  # optimal for a scaled problem only
    return replace(
        best,
        lower_bound_s=min(first_bound, best.objective_s),
        solver=replace(best.solver, status=status, details=details),
    )
