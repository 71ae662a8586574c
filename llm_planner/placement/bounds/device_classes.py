"""What the LP bounds share: device classes (devices with identical cost columns,
merged into one of m times the capacity), tensor-parallel families (classes that
share physical devices) and the memory rows over both.
"""

from __future__ import annotations

import numpy as np

from llm_planner.placement.problem import PlacementProblem

# The LP optimum is shrunk by this relative amount so that the solver's own
# feasibility and optimality tolerances can never push the bound above the true optimum.
LP_SAFETY = 1e-7

Triplets = list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # sparse (row indices, column indices, values)


def device_classes(problem: PlacementProblem) -> list[list[int]]:
    """Devices grouped by identical columns (time pieces, support, memory rules and capacity)."""
    classes: dict[bytes, list[int]] = {}
    for k in range(problem.num_devices):
        key = b"".join(
            a.tobytes()
            for a in (
                problem.time_pieces[:, k],
                problem.supported[:, k],
                problem.mem_counts[:, k],
                problem.mem_capacity[k : k + 1],
            )
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
    (a group's members hold at least 1/k of its tasks' bytes each: llm_planner.cost.roofline.shard_of).
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


def family_time_rows(
    families: list[Family],
    cols: np.ndarray,
    work: np.ndarray,
    t_col: int,
    first_row: int,
    num_classes: int,
    col_offset: int = 0,
) -> tuple[Triplets, list[np.ndarray]]:
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


def memory_pools(
    problem: PlacementProblem, reps: list[int] | np.ndarray, counts: np.ndarray, families: list[Family] = ()
) -> list[tuple[np.ndarray, float, float]]:
    """(classes, memory of one device, devices) of every class and every family (physical_families)
    with finite memory: each pool's tasks' bytes fit in devices * memory."""
    caps = problem.mem_capacity[np.asarray(reps, dtype=int)]
    out = [(np.array([c]), float(caps[c]), float(counts[c])) for c in range(len(caps))]
    out += [(fam, cap, count) for fam, _, count, cap in families]
    return [p for p in out if np.isfinite(p[1])]


def coo(parts: Triplets) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    r, c, v = (np.concatenate(x) for x in zip(*parts))
    return v, (r, c)


def per_capacity(need: np.ndarray, cap: float) -> np.ndarray:
    """need / cap for a row `sum need x <= m cap`, scaled to O(1); a device with no memory
    (cap 0) gets a coefficient so large that any need of a byte or more cannot fit."""
    return need / cap if cap > 0 else np.where(need > 0, 1e12, 0.0)


def memory_rows(
    problem: PlacementProblem,
    reps: list[int],
    counts: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    *,
    first_row: int,
    families: list[Family] = (),
) -> tuple[Triplets, list[np.ndarray]]:
    """Capacity rows: sum_i need_ic x_ic / cap_c <= m_c for each class with finite capacity,
    need_ic = weight_bytes_i + mem_bytes_per_sample_i * Q where memory counts, else 0; and
    the same over each family of `families` (physical_families)."""
    need = problem.task_memory_bytes(problem.batch_size)[rows]
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
