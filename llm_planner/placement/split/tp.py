"""MILP-SPLIT with tensor-parallel groups: a search over group layouts, each solved exactly as
far as MILP-SPLIT goes.

A *layout* cuts every class of identical devices (a device kind in a server template;
identical servers share it, as they are interchangeable) into aligned groups of given
sizes (1: a device used alone), packed from the class's last device down, larger first. Under a layout the devices left
share no physical device, so the problem restricted to them (problem.restrict_devices)
has no exclusivity to keep and MILP-SPLIT solves it as it is, with pipelines, replicas
and data parallelism over the groups. The search:

1. uniform layouts: for each degree d offered, every class at the largest degree <= d
   it offers (d = 1: no groups);
2. from the best, one class at a time, every other cut of that class (each degree on
   its own, and, for a class the best plan uses, one group of each degree beside single
   devices), kept when better, until no change improves (coordinate descent);

each layout skipped when a cheap lower bound of its restricted problem (critical path,
load balance) cannot beat the best plan so far. The baselines with groups (megatron,
tp-replicas) are candidates too, so the plan is never worse than they are.

The plan's lower bound is that of the whole problem (every group, every layout, mixed
ones included: bounds on the problem with groups), never a layout's own.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from llm_planner.core.gap import gap
from llm_planner.core.gap import status as gap_status
from llm_planner.core.plan import Plan
from llm_planner.placement.bounds.load import load_balance_bound
from llm_planner.placement.bounds.times import critical_path_bound
from llm_planner.placement.errors import SolveError
from llm_planner.placement.fit import infeasibility_reason
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem, restrict_devices
from llm_planner.placement.session import SolveSession
from llm_planner.placement.split.split import solve_split

log = logging.getLogger(__name__)

Layout = tuple[tuple[int, ...], ...]  # per class (in class order): its group sizes, descending


def solve_split_tp(problem: PlacementProblem, options: SolveOptions, session: SolveSession | None = None) -> Plan:
    """MILP-SPLIT; over the group layouts (module docstring) when the problem has groups. `session`:
    the problem's baselines and bound, computed once (solve.session); a new one otherwise."""
    session = session or SolveSession(problem, options)
    if not problem.has_groups:
        return solve_split(problem, options, session)
    started = time.perf_counter()
    # the whole problem's bound does not depend on the search: computed beside it (its LPs leave
    # the interpreter free while they solve, so the two share the cores)
    with ThreadPoolExecutor(max_workers=1) as pool:
        bound = pool.submit(lambda: session.bound_s)
        search = _Search(problem, options)
        for layout in search.uniform():
            search.try_layout(layout)
        search.descend()
        for name, plan in session.baselines.items():
            if plan is not None and (search.best is None or plan.objective_s < search.best.objective_s * (1 - 1e-12)):
                search.best, search.label = plan, f"baseline:{name}"
        if search.best is None:
            raise SolveError(f"milp-split found no plan that fits: {infeasibility_reason(problem)}")
        return _finish(options, search, bound.result(), started)


class _Search:
    """The layouts tried so far and the best plan among them."""

    def __init__(self, problem: PlacementProblem, options: SolveOptions):
        self.p, self.options = problem, replace(options, bound=False, verify=False)
        self.classes = _device_classes(problem)
        self.tried: dict[Layout, float | None] = {}  # layout -> its plan's objective (None: no plan or skipped)
        self.best: Plan | None = None
        self.label = ""
        self.best_layout: Layout | None = None
        self.in_classes = {k for c in self.classes for k in c.singles}

    def uniform(self) -> list[Layout]:
        offered = sorted({d for c in self.classes for d in c.degrees}, reverse=True)
        layouts = [tuple(c.uniform(max(x for x in c.degrees if x <= d)) for c in self.classes) for d in offered]
        return list(dict.fromkeys(layouts))

    def try_layout(self, layout: Layout) -> None:
        if layout in self.tried:
            return
        self.tried[layout] = None
        sub = restrict_devices(self.p, self.devices(layout))
        if not sub.supported.any(axis=1).all():
            return  # some task runs on none of these devices
        if self.best is not None:
            cheap = max(critical_path_bound(sub), load_balance_bound(sub))
            if cheap >= self.best.objective_s:
                log.info(
                    "layout %s skipped: its bound %.4g s is no better than %.4g s",
                    self.describe(layout),
                    cheap,
                    self.best.objective_s,
                )
                return
        try:
            plan = solve_split(sub, self.options)
        except SolveError as exc:
            log.info("layout %s: %s", self.describe(layout), exc)
            return
        self.tried[layout] = plan.objective_s
        if self.best is None or plan.objective_s < self.best.objective_s * (1 - 1e-12):
            self.best, self.best_layout, self.label = plan, layout, self.describe(layout)

    def descend(self) -> None:
        """Coordinate descent from the best layout (module docstring, step 2): the classes the best
        plan uses first; a class it does not use gets its uniform cuts only (a first use of it is
        a group of some degree, which its uniform cut of that degree offers)."""
        improved = self.best_layout is not None
        while improved:
            improved, start = False, self.best_layout
            used = set(self.best.physical_devices_used())
            names = [d.name for d in self.p.devices]
            used_classes = {c for c, cls in enumerate(self.classes) if cls.is_used(used, names)}
            order = sorted(range(len(self.classes)), key=lambda c: c not in used_classes)
            for c in order:
                for sizes in self.classes[c].layouts(mixed=c in used_classes):
                    self.try_layout(start[:c] + (sizes,) + start[c + 1 :])
                if self.best_layout != start:
                    improved = True
                    break

    def devices(self, layout: Layout) -> list[int]:
        """The devices of a layout: every class cut as its sizes say, devices outside any class as they are."""
        chosen = {k for c, sizes in zip(self.classes, layout) for k in c.devices(sizes)}
        return [
            k for k in range(self.p.num_devices) if k in chosen or (self.p.degree(k) == 1 and k not in self.in_classes)
        ]

    def describe(self, layout: Layout) -> str:
        return ", ".join(f"{c.name}: {_sizes(sizes)}" for c, sizes in zip(self.classes, layout))


def _sizes(sizes: tuple[int, ...]) -> str:
    """(8,) -> "tp8"; (2, 2, 2, 2) -> "4 x tp2"; (4, 1, 1, 1, 1) -> "tp4 + 4 x tp1"."""
    runs: list[tuple[int, int]] = []
    for d in sizes:
        if runs and runs[-1][0] == d:
            runs[-1] = (d, runs[-1][1] + 1)
        else:
            runs.append((d, 1))
    return " + ".join(f"tp{d}" if n == 1 else f"{n} x tp{d}" for d, n in runs)


class _Class:
    """Identical devices of one kind in every server of one template: `count` per server, and
    each server's devices and groups by (first index, degree)."""

    def __init__(self, name: str):
        self.name = name
        self.count = 0
        self.nodes: dict[str, dict[tuple[int, int], int]] = defaultdict(dict)  # node -> (first index, degree) -> device

    @property
    def degrees(self) -> list[int]:
        return sorted({d for units in self.nodes.values() for _, d in units})

    @property
    def singles(self) -> list[int]:
        return [k for units in self.nodes.values() for (_, d), k in units.items() if d == 1]

    def uniform(self, d: int) -> tuple[int, ...]:
        return (d,) * (self.count // d)

    def layouts(self, mixed: bool = True) -> list[tuple[int, ...]]:
        """Every degree on its own, and (`mixed`) one group of each degree beside single devices."""
        out = [self.uniform(d) for d in self.degrees]
        out += [(d,) + (1,) * (self.count - d) for d in self.degrees if mixed and 1 < d < self.count]
        return list(dict.fromkeys(out))

    def is_used(self, used: set[str], names: list[str]) -> bool:
        """Whether a plan that uses the physical devices `used` runs anything on this class."""
        return any(names[k] in used for k in self.singles)

    def devices(self, sizes: tuple[int, ...]) -> list[int]:
        """Each server cut into groups of `sizes` (descending), packed from its last device down:
        aligned, since every size divides the larger ones and the count (llm_planner.core.tensor_groups)."""
        out = []
        for units in self.nodes.values():
            top = self.count
            for d in sizes:
                top -= d
                out.append(units[(top, d)])
        return out


def _device_classes(problem: PlacementProblem) -> list[_Class]:
    """Classes (template, kind) that have groups; devices of other kinds stay as they are."""
    classes: dict[tuple[str, str], _Class] = {}
    for k, d in enumerate(problem.devices):
        cls = classes.setdefault((d.node_template, d.kind), _Class(f"{d.node_template}/{d.kind}"))
        cls.nodes[d.node][(d.index, problem.degree(k))] = k
        if problem.degree(k) == 1 and d.node == next(iter(cls.nodes)):
            cls.count += 1
    return [c for c in classes.values() if len(c.degrees) > 1]


def _finish(options: SolveOptions, search: _Search, bound: float, started: float) -> Plan:
    """The best plan with the whole problem's bound, its status and the layouts tried."""
    best = search.best
    assert best is not None
    bound = min(bound, best.objective_s)
    status = gap_status(gap(best.objective_s, bound, maximize=False), options.rel_gap)
    details = dict(best.solver.details) if best.solver.name == "milp-split" else {"baseline_won": best.solver.name}
    details.update(
        tp_layout=search.label, tp_layouts_tried={search.describe(l): obj for l, obj in search.tried.items()}
    )
    return replace(
        best,
        lower_bound_s=float(bound),
        solver=replace(
            best.solver,
            name="milp-split",
            status=status,
            time_s=time.perf_counter() - started,
            backend=options.backend,
            details=details,
        ),
    )
