"""Symmetry of identical hardware and the constraints that break it.

Classes. Two devices are interchangeable when they have the same kind and
tensor-parallel degree, sit in the same server and have the same links: in a
cluster spec the links inside a server depend only on the kinds and the server
template, so every device of one class (llm_planner.core.tensor_groups.device_class: template,
kind, degree) in one server is interchangeable with the others (a *device class*).
Two servers are interchangeable when they are copies of one template (the
spec's `count`): same contents, same links inside, the same network between
them (a *server class*). Any permutation of a class maps a plan onto a plan
with the same objective and memory use, so a solver that explores both wastes
its time.

Criteria (`--symmetry`). With m(k) a measure of device k's share of the work,
members of a device class k_1 < k_2 < ... (spec order) must satisfy
m(k_1) >= m(k_2) >= ..., and the servers of a class, in spec order, must
satisfy M(n_1) >= M(n_2) >= ... with M(n) = sum of m over server n's devices.
    batch:  m(k) = sum_{s,i} y[s,i,k], the sample-tasks k processes (b_s per task of
            shard s placed on k; Q x when the batch is not split)
    task:   m(k) = sum_{s,i} x[s,i,k], the number of tasks k holds
    time:   m(k) = sum_{s,i} time_k(s,i), k's busy time
Rows: (members - 1) per device class plus (servers - 1) per server class.
Every criterion keeps an optimal plan: sort the servers of each class by M (a
permutation of servers keeps the objective), then the devices of each class by
m (this does not change any server's M). So the optimum never changes, only
the search (tested against brute force in tests/test_symmetry.py).

A measure leaves the mirrored plans whose members have equal measures (two
GPUs with the same number of tasks), and its rows are aggregates that the LP
relaxation satisfies easily. One more criterion removes every mirror:
    first:  order the members by the first item they hold, items (s, i) taken in
            a fixed order (shard-major, then task index): a member may hold item j
            only if the member before it holds an item before j,
                x[j, k_b] <= sum_{j' < j} x[j', k_a]   for consecutive members a, b,
            and the same for server sums (a server's first item is the minimum of
            its devices'). It is the classic ordering for identical machines in
            assignment models (Jans, "Solving lot-sizing problems on parallel
            identical machines using symmetry-breaking constraints", INFORMS J.
            Computing 2009). Rows: one per item and consecutive pair, through a
            running sum per member (one continuous column and one row per item),
            so its size grows linearly with the items.

Classes of a problem, not only of a cluster. A subproblem of MILP-SPLIT pins
its input and output tasks to given devices, and memory repair forbids some
devices: members of a cluster class are interchangeable in such a problem only
if they can hold the same tasks. `problem_classes` splits the cluster's
classes by each device's column of `supported` (a server class by its servers'
columns, aligned), so the rows are only ever stated among devices the problem
really treats alike.
    none:   no rows, and the backend's own symmetry detection off;
    solver: no rows, the backend's symmetry detection on (HiGHS
            mip_detect_symmetry, Gurobi Symmetry=2), as a reference.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from llm_planner.core.spec import ClusterSpec, DeviceSpec
from llm_planner.core.tensor_groups import DeviceClass, device_class
from llm_planner.placement.problem import PlacementProblem

CRITERIA = ("batch", "task", "time", "first")


@dataclass(frozen=True, kw_only=True)
class SymmetryClasses:
    devices: tuple[tuple[int, ...], ...]  # device classes of 2+ members, members in spec order
    servers: tuple[tuple[tuple[int, ...], ...], ...]  # server classes: per server its devices, aligned

    @property
    def num_rows(self) -> int:
        return sum(len(c) - 1 for c in self.devices) + sum(len(c) - 1 for c in self.servers)


def symmetry_classes(cluster: ClusterSpec) -> SymmetryClasses:
    """Device classes (same server, same kind) and server classes (same template)."""
    devices = cluster.devices()
    return _classes(devices, list(range(len(devices))))


def _classes(devices: tuple[DeviceSpec, ...], units: list[int]) -> SymmetryClasses:
    """Classes among the devices `units` (same server and device_class; same template)."""
    by_node_kind: dict[tuple[str, DeviceClass], list[int]] = defaultdict(list)
    by_template: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for k in units:
        d = devices[k]
        by_node_kind[(d.node, device_class(d))].append(k)
        by_template[d.node_template][d.node].append(k)
    device_classes = tuple(tuple(ks) for ks in by_node_kind.values() if len(ks) > 1)
    server_classes = tuple(
        tuple(tuple(ks) for ks in nodes.values()) for nodes in by_template.values() if len(nodes) > 1
    )
    return SymmetryClasses(devices=device_classes, servers=server_classes)


def problem_classes(problem: PlacementProblem) -> SymmetryClasses:
    """The cluster's classes, split so that members can hold the same tasks in this problem."""
    # units: the devices a plan uses one by one; a problem's groups (members of 2+) are ordered
    # by group_use_rows instead, so they are left out here
    base = _classes(problem.devices, [k for k in range(problem.num_devices) if problem.degree(k) == 1])
    column = {k: problem.supported[:, k].tobytes() for k in range(problem.num_devices)}

    def split(groups, key):
        out: dict[bytes, list] = defaultdict(list)
        for g in groups:
            out[key(g)].append(g)
        return [tuple(v) for v in out.values() if len(v) > 1]

    devices = tuple(c for members in base.devices for c in split(members, lambda k: column[k]))
    servers = tuple(c for nodes in base.servers for c in split(nodes, lambda devs: b"|".join(column[k] for k in devs)))
    return SymmetryClasses(devices=devices, servers=servers)


def first_items(problem: PlacementProblem, sizes: list[int], assignments: list[list[int]]) -> np.ndarray:
    """The index (s * N + i) of the first item each device holds; S * N for a device with none."""
    n = problem.num_tasks
    first = np.full(problem.num_devices, len(assignments) * n)
    for s, a in enumerate(assignments):
        for i, k in enumerate(a):
            first[k] = min(first[k], s * n + i)
    return first


def device_measure(
    problem: PlacementProblem, criterion: str, sizes: list[int], assignments: list[list[int]]
) -> np.ndarray:
    """m(k) of a plan for every device (the pure form of the MILP's measure)."""
    if criterion == "first":  # larger first: the earlier the first item, the larger
        return -first_items(problem, sizes, assignments).astype(float)
    m = np.zeros(problem.num_devices)
    for b, a in zip(sizes, assignments):
        if b <= 0:
            continue
        for i, k in enumerate(a):
            if criterion == "batch":
                m[k] += b
            elif criterion == "task":
                m[k] += 1
            elif criterion == "time":
                m[k] += problem.task_time(i, k, b)
            else:
                raise ValueError(f"unknown symmetry criterion {criterion!r}")
    return m


def satisfies(
    problem: PlacementProblem,
    classes: SymmetryClasses,
    criterion: str,
    sizes: list[int],
    assignments: list[list[int]],
    tol: float = 1e-9,
) -> bool:
    """Whether a plan satisfies the symmetry-breaking rows of `criterion`."""
    if criterion not in CRITERIA:
        return True
    m = device_measure(problem, criterion, sizes, assignments)
    scale = tol * max(1.0, float(np.abs(m).max()))
    for members in classes.devices:
        if any(m[a] < m[b] - scale for a, b in zip(members, members[1:])):
            return False
    for servers in classes.servers:
        totals = _server_values(m, servers, criterion)
        if any(x < y - scale for x, y in zip(totals, totals[1:])):
            return False
    return True


def _server_values(m: np.ndarray, servers, criterion: str) -> list[float]:
    """M(n): the sum of the members' measures, or for `first` the earliest first item."""
    return [float(m[list(devs)].max() if criterion == "first" else m[list(devs)].sum()) for devs in servers]


def canonical_permutation(
    problem: PlacementProblem, classes: SymmetryClasses, criterion: str, sizes: list[int], assignments: list[list[int]]
) -> np.ndarray:
    """perm[k] = new device of k, so that the permuted plan satisfies `criterion`'s rows."""
    perm = np.arange(problem.num_devices)
    m = device_measure(problem, criterion, sizes, assignments)
    for servers in classes.servers:
        totals = _server_values(m, servers, criterion)
        order = sorted(range(len(servers)), key=lambda n: (-totals[n], n))  # the server to put in slot n
        for slot, src in enumerate(order):
            for a, b in zip(servers[src], servers[slot]):
                perm[a] = b
    moved = np.zeros_like(m)
    moved[perm] = m
    for members in classes.devices:
        order = sorted(members, key=lambda k: (-moved[k], k))  # device (after the server step) for each slot
        inverse = {k: n for n, k in enumerate(perm)}
        for slot, k in zip(members, order):
            perm[inverse[k]] = slot
    return perm


def apply_permutation(assignments: list[list[int]], perm: np.ndarray) -> list[list[int]]:
    return [[int(perm[k]) for k in a] for a in assignments]


def measure_terms(form, k: int, criterion: str) -> list[tuple[int, float]]:
    """m(k) as MILP terms over the Formulation's variables (x, y, durations)."""
    p = form.p
    terms: list[tuple[int, float]] = []
    for s in range(form.S):
        for i in range(form.N):
            if not p.supported[i, k]:
                continue
            x = int(form.x[s, i, k])
            if criterion == "task":
                terms.append((x, 1.0))
            elif criterion == "batch":
                terms.append((x, float(form.Q)) if form.fixed else (int(form.y[s, i, k]), 1.0))
            else:
                terms += form.dur[(s, i, k)]
    return terms


def symmetry_rows(form, classes: SymmetryClasses, criterion: str) -> list[tuple[list[tuple[int, float]], float, float]]:
    """m(k_a) - m(k_b) >= 0 for consecutive members of each device class, and the same
    for the server sums of each server class.  Rows: classes.num_rows (`first`: see first_item_rows)."""
    if criterion == "first":
        return first_item_rows(form, classes)
    measure = {k: measure_terms(form, k, criterion) for k in range(form.K)}
    rows = []
    for members in classes.devices:
        for a, b in zip(members, members[1:]):
            rows.append((measure[a] + [(c, -v) for c, v in measure[b]], 0.0, float("inf")))
    for servers in classes.servers:
        for first, second in zip(servers, servers[1:]):
            terms = [t for k in first for t in measure[k]] + [(c, -v) for k in second for c, v in measure[k]]
            rows.append((terms, 0.0, float("inf")))
    return rows


def first_item_rows(form, classes: SymmetryClasses) -> list[tuple[list[tuple[int, float]], float, float]]:
    """x_B[j] <= R_A[j-1] for consecutive groups A, B (class members, or servers as the sum of
    their devices), with R_A[j] = x_A[0] + ... + x_A[j] a running-sum column per item of A.
    Items j = s * N + i.  Adds J columns and 2 J rows per consecutive pair (J = S * N items)."""
    J = form.S * form.N
    x = form.x.reshape(J, form.K)
    pairs = [((a,), (b,)) for members in classes.devices for a, b in zip(members, members[1:])]
    pairs += [(first, second) for servers in classes.servers for first, second in zip(servers, servers[1:])]
    rows = []
    for n, (group_a, group_b) in enumerate(pairs):
        running = form.mb.add_vars(f"first{n}", J, upper=float(J))
        for j in range(J):  # R_A[j] = R_A[j-1] + x_A[j]
            terms = [(int(running[j]), 1.0)] + [(int(x[j, k]), -1.0) for k in group_a]
            rows.append((terms + ([(int(running[j - 1]), -1.0)] if j else []), 0.0, 0.0))
            # x_B[j] <= R_A[j-1] (= 0 for the first item)
            rows.append(
                ([(int(x[j, k]), 1.0) for k in group_b] + ([(int(running[j - 1]), -1.0)] if j else []), -math.inf, 0.0)
            )
    return rows


def canonical_plan(problem: PlacementProblem, criterion: str, plan):
    """The same plan with its devices permuted so that it obeys `criterion`'s rows (with
    tensor-parallel groups: unchanged, as a permutation of single devices would not carry
    the groups along; the solver then may not take it as its warm start)."""

    if problem.has_groups:
        return plan
    classes = problem_classes(problem)
    index = {name: k for k, name in enumerate(problem.device_names)}
    tasks = [t.name for t in problem.graph.tasks]
    sizes = list(plan.shard_sizes)
    assignments = [[index[a[t]] for t in tasks] for a in plan.shard_assignments]
    perm = canonical_permutation(problem, classes, criterion, sizes, assignments)
    rename = {name: problem.device_names[perm[k]] for name, k in index.items()}
    return replace(
        plan,
        shard_assignments=tuple({t: rename[d] for t, d in a.items()} for a in plan.shard_assignments),
        schedule=tuple(replace(s, device=rename[s.device]) for s in plan.schedule),
    )


def group_use_rows(
    problem: PlacementProblem, use: dict[int, int]
) -> list[tuple[list[tuple[int, float]], float, float]]:
    """use[L] <= use[H] for the two halves L < H (groups of size k) of every aligned block of
    2k identical devices. Valid with the device rows: any plan has an image, under a
    permutation of identical devices, with its single devices at the bottom of the class in
    the criterion's order and its groups packed from the top, larger first (llm_planner.core.tensor_groups);
    there the lower half of a block is used only if the upper one is.  Rows: one per block."""
    by_first: dict[tuple[str, str, int, int], int] = {}
    for k in range(problem.num_devices):
        d = problem.devices[k]
        if problem.degree(k) > 1:
            by_first[(d.node, d.kind, d.degree, d.index)] = k
    rows = []
    for (node, kind, degree, first), low in by_first.items():
        high = by_first.get((node, kind, degree, first + degree))
        if first % (2 * degree) == 0 and high is not None:
            rows.append(([(use[low], 1.0), (use[high], -1.0)], -math.inf, 0.0))
    return rows
