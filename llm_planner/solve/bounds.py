"""Lower bounds on the optimum of a PlacementProblem, valid for both objectives.

Every function returns a bound in the units of the problem's objective: seconds
of makespan for "latency", seconds per sample for "throughput" (the busiest
device's load per batch divided by the batch size Q). No plan, whatever its
shards, placement and order, can do better. docs/objectives.md explains them.

Notation: t(i, k, b) = max_j (f_ijk + s_ijk * b) for b >= 1 (and 0 for b = 0),
the time of task i on device k for b samples, with f >= 0 and s >= 0 (roofline
pieces and explicit per-sample times both have them; see llm_planner.cost). A
plan splits the batch into shards of sizes b_1..b_S >= 1 with sum Q and S at most
the problem's max_shards.

Two facts the proofs use:

(F1) t(i, k, b) is non-decreasing in b >= 1: every piece has a slope s >= 0.

(F2) t(i, k, b) / b is non-increasing in b >= 1 when every intercept f >= 0:
     t(b) / b = max_j (f_j / b + s_j), and each f_j / b is non-increasing in b,
     and a maximum of non-increasing functions is non-increasing. Hence for
     1 <= b <= Q, t(b) >= b * t(Q) / Q: a sub-batch costs at least its share of
     the full batch's time. (Convexity alone would not give this: an affine
     t(b) = f + s b with f < 0 has t(b) / b increasing. We never assume it: if a
     problem ever carries a negative intercept or slope, the bounds take the
     minimum over every sub-batch size instead (min over b in 1..Q of t(b) / b
     for the rates, min over b >= ceil(Q / S) for the path), valid always.)

Bounds:

* critical path (latency): some shard has b >= ceil(Q / S) samples (pigeonhole).
  Every task of that shard runs for at least min_k t(i, k, ceil(Q / S)) (F1),
  and a task starts after all its predecessors finish (transfers are >= 0), so
  the longest path of those minimal times is at most that shard's finish time,
  which is at most the makespan.
  (throughput): the device that runs task i of that shard has a load of at least
  min_k t(i, k, ceil(Q / S)), so max_i of it, divided by Q, bounds the objective.

* load balance (both): the LP
      min T  s.t.  sum_k x_ik = 1 (each task i),  sum_i Q r_ik x_ik <= T (each
      device k),  x_ik >= 0, x_ik = 0 where k cannot run i,
  with r_ik = t(i, k, Q) / Q. Any plan gives a feasible point: x_ik = (samples
  of task i that run on k) / Q; then sum_i Q r_ik x_ik = sum over (shard s,
  task i) on k of b_s t(i, k, Q) / Q <= sum of t(i, k, b_s) (F2) <= the time k
  is busy with tasks, which is at most both the makespan (tasks on one device
  do not overlap) and k's load per batch (loads add transfer terms >= 0). So
  T* <= makespan, and T* / Q <= max load / Q. Devices with identical cost
  columns (same kind) are merged into one with m times the capacity: spreading
  a merged solution evenly over the m copies is feasible for the full LP and
  has the same T, so the optimum is unchanged while the LP shrinks.
  Memory rows (a refinement): sum_i need_ik x_ik <= cap_k for every device with
  finite capacity, need_ik = weight_bytes_i + mem_bytes_per_sample_i * Q where
  task i's memory counts on k (else 0). Valid: the plan's point x has x_ik <= 1
  where k holds task i (and 0 elsewhere), so need_ik x_ik <= weight_bytes_i +
  mem_bytes_per_sample_i * (samples of i on k), and summed over i that is at
  most the memory the plan uses on k, which fits. Merging identical devices
  stays exact (capacity m * cap). If these rows make the LP infeasible, no
  plan fits in memory at all; the bound then drops them.

* shard count (both, when the batch may be split: min(Q, S) >= 2): the two
  bounds above pull in opposite directions as the number of shards grows (a
  smaller largest shard shortens the path; every shard pays each task's fixed
  cost again, e.g. reading the weights). Let s be the plan's number of non-empty
  shards, 1 <= s <= min(Q, S). Then the largest shard has >= ceil(Q / s) samples,
  so CP(s), the critical path above at that size, bounds the plan; and so does
  LP(s), the load-balance LP with shard counts:
      min T  s.t.  sum_k x_ik = 1,  sum_k z_ik = s,  z_ik >= x_ik  (each task i),
                   w_ik >= f_ijk z_ik + Q s_ijk x_ik  (each piece j),
                   sum_i w_ik <= T  (each device k),  memory rows as above,
  with z_ik the number of shards whose task i runs on k. Any plan with s shards
  gives a feasible point (x as above; z_ik counts those shards, >= 1 >= x_ik
  where k runs part of task i; w_ik = k's time on task i = sum over those
  shards of t(i, k, b) >= sum of (f_ijk + s_ijk b) for every piece j). Identical
  devices merge as before (sums over the copies). So every plan is at least
  min over s of max(CP(s), LP(s)). CP(s) falls and LP(s) rises with s (from a
  point for s + 1 shards, lower z where z > x by one in all: every task has
  slack sum z - sum x = s >= 1; w and T do not grow), so a bisection finds the
  first s* with LP(s*) >= CP(s*), and the minimum is LP(s*) or CP(s* - 1): a
  few LPs however large the batch. With one shard (s = 1, z = x)
  LP(1) is the load-balance LP, so this bound is only computed when min(Q, S) >= 2.

`lower_bound` is the maximum of the three and, for latency, of the path LP
(solve/bounds_path.py), which also stands in for CP(s) in the shard-count bound,
and of the partition bound (bounds_path.partition_bound: one copy of the graph per
shard of each partition of Q, sharing the devices).
"""

from __future__ import annotations

import functools
import logging
import math
import weakref

import numpy as np
import scipy.optimize
import scipy.sparse

from llm_planner.solve.problem import PlacementProblem

log = logging.getLogger(__name__)

# The LP optimum is shrunk by this relative amount so that the solver's own
# feasibility and optimality tolerances can never push the bound above the true optimum.
LP_SAFETY = 1e-7

Triplets = list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # sparse (row indices, column indices, values)


def task_times(problem: PlacementProblem, batch: int) -> np.ndarray:
    """t(i, k, batch) for every task and device as an [N, K] array (+inf where unsupported)."""
    if batch <= 0:
        return np.where(problem.supported, 0.0, np.inf)
    pieces = problem.time_pieces
    times = np.max(pieces[..., 0] + pieces[..., 1] * batch, axis=2)
    return np.where(problem.supported, times, np.inf)


def _pieces_nonnegative(problem: PlacementProblem) -> bool:
    return bool(np.all(problem.time_pieces >= 0))


def fastest_task_times(problem: PlacementProblem, batch: int) -> np.ndarray:
    """min over devices k and sub-batches b in [batch, Q] of t(i, k, b), for every task.

    With non-negative slopes (F1) that is min_k t(i, k, batch).
    """
    if _pieces_nonnegative(problem):
        return task_times(problem, batch).min(axis=1)
    log.warning("negative cost intercepts or slopes: bounds take minima over every sub-batch size")
    return np.min([task_times(problem, b).min(axis=1) for b in range(batch, problem.batch_size + 1)], axis=0)


def largest_shard_floor(problem: PlacementProblem) -> int:
    """ceil(Q / S): some shard of every plan holds at least this many samples."""
    return math.ceil(problem.batch_size / max(1, problem.max_shards))


def critical_path_bound(problem: PlacementProblem, *, shards: int | None = None) -> float:
    """Longest path of fastest task times at the smallest possible largest shard
    (of `shards` non-empty shards; default: at most the problem's max_shards).

    Latency: that path length (s). Throughput: the longest single such task
    divided by the batch size (s per sample). See the module docstring.
    """
    floor = largest_shard_floor(problem) if shards is None else math.ceil(problem.batch_size / shards)
    times = fastest_task_times(problem, floor)
    if problem.objective == "throughput":
        return float(times.max()) / problem.batch_size
    return longest_path(problem, times)


def longest_path(problem: PlacementProblem, times: np.ndarray) -> float:
    """The longest path of the graph with task i taking times[i] and transfers free."""
    finish = np.zeros(problem.num_tasks)
    in_edges = problem.in_edges()
    for name in problem.graph.topological_order():
        i = problem.graph.index(name)
        ready = max((finish[int(problem.edge_src[e])] for e in in_edges[i]), default=0.0)
        finish[i] = ready + times[i]
    return float(finish.max())


def per_sample_rates(problem: PlacementProblem) -> np.ndarray:
    """r_ik, a valid lower bound on t(i, k, b) / b for every 1 <= b <= Q ([N, K], +inf unsupported)."""
    q = problem.batch_size
    if _pieces_nonnegative(problem):
        return task_times(problem, q) / q  # (F2)
    rates = np.full(problem.supported.shape, np.inf)
    for b in range(1, q + 1):
        rates = np.minimum(rates, task_times(problem, b) / b)
    return rates


def _device_classes(problem: PlacementProblem) -> list[list[int]]:
    """Devices grouped by identical columns (time pieces, support, memory rules and capacity)."""
    classes: dict[bytes, list[int]] = {}
    for k in range(problem.num_devices):
        key = b"".join(
            a.tobytes()
            for a in (problem.time_pieces[:, k], problem.supported[:, k], problem.mem_counts[:, k], problem.mem_capacity[k : k + 1])
        )
        classes.setdefault(key, []).append(k)
    return list(classes.values())


Family = tuple[np.ndarray, np.ndarray, float, float]  # (classes, degree of each, physical devices, memory of one)


def physical_families(problem: PlacementProblem, classes: list[list[int]]) -> list[Family]:
    """Tensor-parallel groups: the sets of device classes whose devices share physical devices
    (a kind in some servers: its single devices and its groups of every degree), each as
    (class indices, the degree of each class, physical devices n_F, usable memory of one).
    A physical device works for, and holds the memory of, at most one device that contains it
    (exclusivity), and a group busy for t keeps its k members busy for t, so every plan has
        sum_c degree_c * (busy time of class c) <= n_F * T                  (time)
        sum_c (bytes of the tasks on class c)   <= n_F * cap                (memory)
    (a group's members hold at least 1/k of its tasks' bytes each: llm_planner.cost.shard_of).
    The per-class rows alone would let a server's devices work once as singles and again in
    every group. [] for a problem without groups."""
    if not problem.has_groups:
        return []
    members = problem.device_members
    owner: dict[int, int] = {}  # physical device -> family id (union of the classes touching it)
    parent = list(range(len(classes)))

    def find(c: int) -> int:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for c, devices in enumerate(classes):
        for k in devices:
            for d in members[k]:
                if d in owner:
                    parent[find(c)] = find(owner[d])
                else:
                    owner[d] = c
    out = []
    for root in sorted({find(c) for c in range(len(classes))}):
        fam = [c for c in range(len(classes)) if find(c) == root]
        if len(fam) < 2:
            continue
        physical = sorted({d for c in fam for k in classes[c] for d in members[k]})
        degree = np.array([problem.degree(classes[c][0]) for c in fam], dtype=float)
        out.append((np.array(fam), degree, float(len(physical)), float(problem.mem_capacity[physical[0]])))
    return out


def family_time_rows(families: list[Family], cols: np.ndarray, work: np.ndarray, t_col: int, first_row: int,
                     num_classes: int, col_offset: int = 0) -> tuple[Triplets, list[np.ndarray]]:
    """sum_c degree_c sum_{x in c} work_x - n_F T <= 0 per family (physical_families), over
    columns col_offset + j whose class is cols[j]."""
    parts: Triplets = []
    for f, (fam, degree, count, _) in enumerate(families):
        weight = np.zeros(num_classes)
        weight[fam] = degree
        idx = np.flatnonzero(weight[cols] > 0)
        parts.append((np.full(len(idx), first_row + f), col_offset + idx, weight[cols[idx]] * work[idx]))
        parts.append((np.array([first_row + f]), np.array([t_col]), np.array([-count])))
    return parts, [np.zeros(len(families))]


def memory_pools(problem: PlacementProblem, reps: list[int] | np.ndarray, counts: np.ndarray,
                 families: list[Family] = ()) -> list[tuple[np.ndarray, float, float]]:
    """(classes, memory of one device, devices) of every class and every family (physical_families)
    with finite memory: each pool's tasks' bytes fit in devices * memory."""
    caps = problem.mem_capacity[np.asarray(reps, dtype=int)]
    out = [(np.array([c]), float(caps[c]), float(counts[c])) for c in range(len(caps))]
    out += [(fam, cap, count) for fam, _, count, cap in families]
    return [p for p in out if np.isfinite(p[1])]


def load_balance_bound(problem: PlacementProblem, *, memory: bool = True) -> float:
    """Optimum of the fractional load-balancing LP (module docstring), in objective units.

    With `memory`, the LP also keeps each device within its capacity (valid, see
    the module docstring); should that make it infeasible (then no plan fits at
    all) the bound falls back to the LP without memory rows.
    """
    classes = _device_classes(problem)
    reps = [c[0] for c in classes]
    work = per_sample_rates(problem)[:, reps] * problem.batch_size  # [N, C]: Q r_ik
    finite = np.isfinite(work)
    scale = float(work[finite].max()) if finite.any() else 0.0
    if scale <= 0:
        return 0.0
    rows, cols = np.nonzero(finite)  # one variable x_ic per (task, device class) that can run it
    num_x, num_c = len(rows), len(classes)
    counts = np.array([len(c) for c in classes], dtype=float)
    # variables [x_0 .. x_{num_x-1}, T]; min T
    cost = np.zeros(num_x + 1)
    cost[-1] = 1.0
    a_eq = scipy.sparse.csr_matrix((np.ones(num_x), (rows, np.arange(num_x))), shape=(problem.num_tasks, num_x + 1))
    # work of class c: sum_i (Q r_ic / scale) x_ic - m_c T <= 0   (m_c identical devices share it)
    ub = [(cols, np.arange(num_x), work[rows, cols] / scale), (np.arange(num_c), np.full(num_c, num_x), -counts)]
    rhs = [np.zeros(num_c)]
    families = physical_families(problem, classes)
    fam_ub, fam_rhs = family_time_rows(families, cols, work[rows, cols] / scale, num_x, num_c, num_c)
    ub += fam_ub
    rhs += fam_rhs
    if memory:
        ub_mem, rhs_mem = _memory_rows(problem, reps, counts, rows, cols, first_row=num_c + len(families), families=families)
        ub += ub_mem
        rhs += rhs_mem
    b_ub = np.concatenate(rhs)
    a_ub = scipy.sparse.csr_matrix(_coo(ub), shape=(len(b_ub), num_x + 1))
    res = scipy.optimize.linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(problem.num_tasks), bounds=(0, None), method="highs")
    if res.status == 2 and memory:
        log.info("load-balance LP with memory is infeasible: no plan fits in memory; bounding without memory")
        return load_balance_bound(problem, memory=False)
    if res.status != 0:
        log.warning("load-balance LP not solved (%s); using 0 as its bound", res.message)
        return 0.0
    bound = max(0.0, float(res.fun)) * scale * (1 - LP_SAFETY)
    return bound / problem.batch_size if problem.objective == "throughput" else bound


def _coo(parts: Triplets) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    r, c, v = (np.concatenate(x) for x in zip(*parts))
    return v, (r, c)


def per_capacity(need: np.ndarray, cap: float) -> np.ndarray:
    """need / cap for a row `sum need x <= m cap`, scaled to O(1); a device with no memory
    (cap 0) gets a coefficient so large that any need of a byte or more cannot fit."""
    return need / cap if cap > 0 else np.where(need > 0, 1e12, 0.0)


def _memory_rows(
    problem: PlacementProblem, reps: list[int], counts: np.ndarray, rows: np.ndarray, cols: np.ndarray, *, first_row: int,
    families: list[Family] = (),
) -> tuple[Triplets, list[np.ndarray]]:
    """Capacity rows: sum_i need_ic x_ic / cap_c <= m_c for each class with finite capacity,
    need_ic = weight_bytes_i + mem_bytes_per_sample_i * Q where memory counts, else 0; and
    the same over each family of `families` (physical_families)."""
    need = (problem.weight_bytes + problem.mem_bytes_per_sample * problem.batch_size)[rows]
    need = need * problem.mem_counts[rows, np.array(reps)[cols]]
    parts: Triplets = []
    rhs: list[np.ndarray] = []
    row = first_row
    for pool, cap, count in memory_pools(problem, reps, counts, families):
        idx = np.flatnonzero(np.isin(cols, pool) & (need > 0))
        if not len(idx):
            continue
        parts.append((np.full(len(idx), row), idx, per_capacity(need[idx], cap)))
        rhs.append(np.array([count]))
        row += 1
    return parts, rhs


def shard_lp_bound(problem: PlacementProblem, shards: int, *, memory: bool = True) -> float:
    """LP(s) of the module docstring: load balance with `shards` non-empty shards, each paying
    every task's fixed costs on the device that runs it. In objective units."""
    classes = _device_classes(problem)
    reps = [c[0] for c in classes]
    q = problem.batch_size
    ok = problem.supported[:, reps]
    rows, cols = np.nonzero(ok)  # one (x, z, w) triple per (task, device class) that can run it
    n, num_c = len(rows), len(classes)
    pieces = problem.time_pieces[rows, np.array(reps)[cols]]  # [n, P, 2]
    scale = float(np.max(pieces[..., 0] * shards + pieces[..., 1] * q, initial=0.0))
    if scale <= 0:
        return 0.0
    counts = np.array([len(c) for c in classes], dtype=float)
    idx = np.arange(n)
    x, z, w, t = idx, n + idx, 2 * n + idx, 3 * n  # column blocks
    cost = np.zeros(3 * n + 1)
    cost[t] = 1.0
    eq = [(rows, x, np.ones(n)), (problem.num_tasks + rows, z, np.ones(n))]
    b_eq = np.concatenate([np.ones(problem.num_tasks), np.full(problem.num_tasks, float(shards))])
    ub = [(idx, x, np.ones(n)), (idx, z, -np.ones(n))]  # x - z <= 0
    r = n
    for j in range(pieces.shape[1]):  # f z + Q s x - w <= 0, in units of `scale`
        ub += [(r + idx, z, pieces[:, j, 0] / scale), (r + idx, x, pieces[:, j, 1] * q / scale), (r + idx, w, -np.ones(n))]
        r += n
    ub += [(r + cols, w, np.ones(n)), (r + np.arange(num_c), np.full(num_c, t), -counts)]  # sum_i w - m T <= 0
    rhs = [np.zeros(r + num_c)]
    families = physical_families(problem, classes)
    fam_ub, fam_rhs = family_time_rows(families, cols, np.ones(n), t, r + num_c, num_c, col_offset=2 * n)
    ub += fam_ub
    rhs += fam_rhs
    r += len(families)
    if memory:
        mem, mem_rhs = _memory_rows(problem, reps, counts, rows, cols, first_row=r + num_c, families=families)
        ub += mem
        rhs += mem_rhs
    b_ub = np.concatenate(rhs)
    a_ub = scipy.sparse.csr_matrix(_coo(ub), shape=(len(b_ub), 3 * n + 1))
    a_eq = scipy.sparse.csr_matrix(_coo(eq), shape=(2 * problem.num_tasks, 3 * n + 1))
    res = scipy.optimize.linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status == 2 and memory:
        return shard_lp_bound(problem, shards, memory=False)
    if res.status != 0:
        log.warning("shard-count LP not solved (%s); using 0 as its bound", res.message)
        return 0.0
    bound = max(0.0, float(res.fun)) * scale * (1 - LP_SAFETY)
    return bound / q if problem.objective == "throughput" else bound


def shard_count_bound(problem: PlacementProblem, load=None) -> float:
    """min over s of max(CP(s), LP(s)) (module docstring); 0 when the batch cannot be split."""
    most = min(problem.batch_size, problem.max_shards)
    if most < 2:
        return 0.0
    from llm_planner.solve.bounds_path import path_lp_at_shards

    if problem.objective == "latency":
        path = functools.lru_cache(maxsize=None)(lambda s: path_lp_at_shards(problem, s))
    else:
        path = functools.lru_cache(maxsize=None)(lambda s: critical_path_bound(problem, shards=s))
    load = load or functools.lru_cache(maxsize=None)(lambda s: shard_lp_bound(problem, s))
    # CP falls and LP rises with s: find the first s* with LP(s*) >= CP(s*) by bisection; the
    # minimum of max(CP, LP) is then LP(s*) or CP(s* - 1)
    lo, hi = 1, most
    if load(most) < path(most):
        return path(most)
    while lo < hi:
        mid = (lo + hi) // 2
        if load(mid) >= path(mid):
            hi = mid
        else:
            lo = mid + 1
    return min(load(lo), path(lo - 1)) if lo > 1 else load(1)


_computed: dict[int, tuple[weakref.ref, float]] = {}  # id(problem) -> (the problem, its lower_bound)


def lower_bound(problem: PlacementProblem) -> float:
    """The best valid bound for the problem's objective (max of the bounds above; for latency
    also the path LP of solve/bounds_path.py at the smallest possible largest shard, and its
    partition bound).

    Remembered per problem object while it lives (a solver and solve() both ask for it)."""
    key = id(problem)
    hit = _computed.get(key)
    if hit is not None and hit[0]() is problem:
        return hit[1]
    value = _lower_bound(problem)
    _computed[key] = (weakref.ref(problem, lambda _, key=key: _computed.pop(key, None)), value)
    return value


def forget_lower_bounds() -> None:
    """Drop every remembered lower_bound (for timing one solver apart from another on one problem)."""
    _computed.clear()


def _lower_bound(problem: PlacementProblem) -> float:
    from llm_planner.solve.bounds_path import partition_bound, path_lp_bound

    load = functools.lru_cache(maxsize=None)(lambda s: shard_lp_bound(problem, s))  # LP(s), shared by the two bounds
    bounds = [critical_path_bound(problem), load_balance_bound(problem), shard_count_bound(problem, load)]
    if problem.objective == "latency":
        bounds.append(path_lp_bound(problem, largest_shard_floor(problem)))
        bounds.append(partition_bound(problem, max(bounds), load))
    return max(bounds)
