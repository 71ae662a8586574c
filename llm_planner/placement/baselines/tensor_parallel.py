"""The layouts an LLM-serving engineer writes by hand, with tensor-parallel groups.

- "megatron": Megatron-LM's layout. Tensor parallelism over all accelerators of one
  kind in a server (the whole class as one group; without such a group, each device
  alone), pipeline
  stages over the fewest such servers, fastest first, that hold the model, the layers
  (tasks in topological order) cut into contiguous stages balanced by speed (the cut
  that minimises the slowest stage's time, within memory); then more pipelines from
  the servers left, and the batch split over the fastest m of them (every m tried) in
  proportion to their speed.
- "tp-replicas": vLLM's data-parallel layout. In every server, the accelerators of a
  kind cut into the smallest aligned groups (or single devices) that hold the whole
  model for one sample; each is a replica, and the batch is split over the fastest m
  replicas (every m tried) with the shard sizes of the `data-parallel` baseline
  (least makespan, each shard whole on its replica).

Both use only disjoint devices, so they keep the exclusivity of groups. Without
accelerators, the CPUs take their place. A colocation group cut by a stage boundary
goes whole to its first member's stage (as in the other baselines). docs/objectives.md describes them.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import numpy as np

from llm_planner.core.plan import Plan
from llm_planner.placement.baselines.common import balanced_split, fastest_first, fits, follow_groups
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.fit import solve_in_flight, topo_order
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.schedule import make_plan

TP_BASELINES = ("megatron", "tp-replicas")


def run_tp_baseline(name: str, problem: PlacementProblem) -> Plan | None:
    """The plan of `name` (one of TP_BASELINES), or None when nothing fits."""
    started = time.perf_counter()

    def once(posed: PlacementProblem) -> Plan | None:
        result = {"megatron": _megatron, "tp-replicas": _tp_replicas}[name](posed)
        if result is None:
            return None
        sizes, assigns = result
        return make_plan(
            posed, sizes, assigns, solver=f"baseline:{name}", status="heuristic", started_at=started, lower_bound_s=0.0
        )

    return solve_in_flight(problem, once)  # throughput: a steady state that fits (problem.fit)


def _classes(problem: PlacementProblem) -> dict[tuple[str, str], list[int]]:
    """(node, kind) -> every device of the problem (single or group) of that kind in that node,
    accelerators only unless the cluster has none."""
    accel = bool((~problem.is_cpu).any())
    out: dict[tuple[str, str], list[int]] = defaultdict(list)
    for k, d in enumerate(problem.devices):
        if not accel or not problem.is_cpu[k]:
            out[(d.node, d.kind)].append(k)
    return out


def runs_all(problem: PlacementProblem, k: int) -> bool:
    return bool(problem.supported[:, k].all())


# -- tp-replicas -----------------------------------------------------------------------


def _replicas(problem: PlacementProblem) -> list[int]:
    """Per (node, kind): the groups of the smallest degree that run and hold the whole model."""
    n = problem.num_tasks
    out = []
    for devices in _classes(problem).values():
        able = [k for k in devices if runs_all(problem, k) and fits(problem, [1], [[k] * n])]
        if able:
            degree = min(problem.devices[k].degree for k in able)
            out += [k for k in able if problem.devices[k].degree == degree]
    return out


def _tp_replicas(problem: PlacementProblem) -> tuple[list[int], list[list[int]]] | None:
    q, n = problem.batch_size, problem.num_tasks
    ranked = fastest_first(problem, _replicas(problem))
    best, found = math.inf, None
    for m in range(1, min(problem.max_shards, q, len(ranked)) + 1):
        sizes = balanced_split(problem, ranked[:m])
        if sizes is None:
            continue
        busiest = max(float(task_times(problem, b)[:, k].sum()) for b, k in zip(sizes, ranked[:m]))
        if busiest < best:
            best, found = busiest, (sizes, [[k] * n for k in ranked[:m]])
    return found


# -- megatron --------------------------------------------------------------------------


def _server_units(problem: PlacementProblem) -> list[int]:
    """Per (node, kind): the group of all its devices if it runs every task, else each of its
    single devices that does (without groups: pipeline parallelism alone)."""
    out = []
    for devices in _classes(problem).values():
        whole = max(devices, key=lambda k: problem.devices[k].degree)
        if problem.devices[whole].degree > 1 and runs_all(problem, whole):
            out.append(whole)
        else:
            out += [k for k in devices if problem.degree(k) == 1 and runs_all(problem, k)]
    return fastest_first(problem, out)


def _stages(problem: PlacementProblem, units: list[int], batch: int) -> list[int] | None:
    """Tasks (topological order) cut into contiguous stages on `units` (in order) minimising the
    slowest stage's time for `batch` samples, each stage within its unit's memory; None if no
    cut fits. Bisection on the bottleneck with a greedy fill (exact for a chain cut in order)."""
    topo = topo_order(problem)
    t = task_times(problem, batch)
    need = problem.task_memory_bytes(batch)
    lo, hi = 0.0, float(sum(max(t[i, k] for k in units) for i in topo))

    def fill(limit: float) -> list[int] | None:
        assign, stage, load, used = [0] * problem.num_tasks, 0, 0.0, 0.0
        for i in topo:
            while stage < len(units):
                k = units[stage]
                mem = need[i] if problem.mem_counts[i, k] else 0.0
                if load + t[i, k] <= limit and used + mem <= problem.mem_capacity[k]:
                    assign[i], load, used = k, load + t[i, k], used + mem
                    break
                stage, load, used = stage + 1, 0.0, 0.0
            else:
                return None
        return assign

    if fill(hi) is None:
        return None
    for _ in range(60):  # bisect to a relative 1e-9 of the bottleneck
        mid = (lo + hi) / 2
        if fill(mid) is not None:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * hi:
            break
    return fill(hi)


def _pipelines(problem: PlacementProblem) -> list[list[int]]:
    """Stage assignments of the pipelines, fastest servers first: each takes the fewest next
    servers whose stages hold the model for one sample."""
    units, out = _server_units(problem), []
    while units:
        for p in range(1, len(units) + 1):
            assign = _stages(problem, units[:p], 1)
            if assign is not None:
                out.append(units[:p])
                units = units[p:]
                break
        else:
            break
    return out


def _megatron(problem: PlacementProblem) -> tuple[list[int], list[list[int]]] | None:
    q = problem.batch_size
    pipelines = _pipelines(problem)
    best, found = math.inf, None
    for m in range(1, min(problem.max_shards, q, len(pipelines)) + 1):
        times = np.array([_pipeline_time(problem, units, math.ceil(q / m)) for units in pipelines[:m]])
        if not np.isfinite(times).all():
            continue  # some pipeline cannot hold its share of the batch
        sizes = _proportional(q, 1.0 / np.maximum(times, 1e-30))
        stages = [_stages(problem, units, b) for units, b in zip(pipelines[:m], sizes)]
        assigns = [_colocated(problem, a) for a in stages]
        if any(a is None for a in assigns) or not fits(problem, sizes, assigns):
            continue
        plan_time = max(_pass_time(problem, a, b) for a, b in zip(stages, sizes))
        if plan_time < best:
            best, found = plan_time, (sizes, assigns)
    return found


def _colocated(problem: PlacementProblem, assign: list[int] | None) -> list[int] | None:
    """The stages with each colocation group moved onto its first member's device (None if none fits)."""
    return None if assign is None else follow_groups(problem, assign)


def _pipeline_time(problem: PlacementProblem, units: list[int], batch: int) -> float:
    """Task time of one pass of `batch` samples through the pipeline's stages (transfers aside)."""
    assign = _stages(problem, units, batch)
    return math.inf if assign is None else _pass_time(problem, assign, batch)


def _pass_time(problem: PlacementProblem, assign: list[int], batch: int) -> float:
    """Task time of one pass of `batch` samples through the stages `assign` (transfers aside)."""
    t = task_times(problem, batch)
    return float(sum(t[i, k] for i, k in enumerate(assign)))


def _proportional(total: int, speed: np.ndarray) -> list[int]:
    """Sizes >= 1 summing to total, in proportion to speed (largest remainders)."""
    share = speed / speed.sum() * (total - len(speed))
    sizes = np.floor(share).astype(int) + 1
    for j in np.argsort(-(share - np.floor(share)))[: total - int(sizes.sum())]:
        sizes[j] += 1
    return [int(b) for b in sizes]
