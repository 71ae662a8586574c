"""MILP-SPLIT with tensor-parallel groups: a search over group layouts, each solved exactly as
far as MILP-SPLIT goes.

A *layout* gives every class of identical devices (a device kind in a server template;
identical servers share it, as they are interchangeable) one degree d: its devices are
cut into aligned groups of d (d = 1: used one by one). Under a layout the devices left
share no physical device, so the problem restricted to them (problem.restrict_devices)
has no exclusivity to keep and MILP-SPLIT solves it as it is, with pipelines, replicas
and data parallelism over the groups. The search:

1. uniform layouts: for each degree d offered, every class at the largest degree <= d
   it offers (d = 1: no groups);
2. from the best, one class at a time, every other degree of that class, kept when
   better, until no change improves (coordinate descent);

each layout skipped when a cheap lower bound of its restricted problem (critical path,
load balance) cannot beat the best plan so far. The baselines with groups (megatron,
tp-replicas) are candidates too, so the plan is never worse than they are.

The plan's lower bound is that of the whole problem (every group, every layout, mixed
ones included: solve.bounds on the problem with groups), never a layout's own.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import replace

from llm_planner.plan import Plan
from llm_planner.solve.baseline_set import all_baselines
from llm_planner.solve.baselines import infeasibility_reason
from llm_planner.solve.bounds import critical_path_bound, load_balance_bound, lower_bound
from llm_planner.solve.errors import SolveError
from llm_planner.solve.options import SolveOptions
from llm_planner.solve.problem import PlacementProblem, restrict_devices
from llm_planner.solve.split import solve_split

log = logging.getLogger(__name__)

Layout = tuple[int, ...]  # one degree per class, in class order


def solve_split_tp(problem: PlacementProblem, options: SolveOptions) -> Plan:
    """MILP-SPLIT; over the group layouts (module docstring) when the problem has groups."""
    if not problem.has_groups:
        return solve_split(problem, options)
    started = time.perf_counter()
    search = _Search(problem, options)
    for layout in search.uniform():
        search.try_layout(layout)
    search.descend()
    for name, plan in all_baselines(problem).items():
        if plan is not None and (search.best is None or plan.objective_s < search.best.objective_s * (1 - 1e-12)):
            search.best, search.label = plan, f"baseline:{name}"
    if search.best is None:
        raise SolveError(f"milp-split found no plan that fits in memory: {infeasibility_reason(problem)}")
    return _finish(problem, options, search, started)


class _Search:
    """The layouts tried so far and the best plan among them."""

    def __init__(self, problem: PlacementProblem, options: SolveOptions):
        self.p, self.options = problem, replace(options, bound=False, verify=False)
        self.classes = _device_classes(problem)
        self.tried: dict[Layout, float | None] = {}  # layout -> its plan's objective (None: no plan or skipped)
        self.best: Plan | None = None
        self.label = ""
        self.best_layout: Layout | None = None
        self.in_classes = {k for c in self.classes for k in c.units[1]}

    def uniform(self) -> list[Layout]:
        offered = sorted({d for c in self.classes for d in c.degrees}, reverse=True)
        layouts = [tuple(max(x for x in c.degrees if x <= d) for c in self.classes) for d in offered]
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
                log.info("layout %s skipped: its bound %.4g s is no better than %.4g s", self.describe(layout), cheap, self.best.objective_s)
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
        """Coordinate descent from the best layout (module docstring, step 2)."""
        improved = self.best_layout is not None
        while improved:
            improved, start = False, self.best_layout
            for c, cls in enumerate(self.classes):
                for d in cls.degrees:
                    self.try_layout(start[:c] + (d,) + start[c + 1 :])
                if self.best_layout != start:
                    improved = True
                    break

    def devices(self, layout: Layout) -> list[int]:
        """The devices of a layout: every class at its degree, devices outside any class as they are."""
        chosen = {k for c, d in zip(self.classes, layout) for k in c.units[d]}
        return [k for k in range(self.p.num_devices) if k in chosen or (self.p.degree(k) == 1 and k not in self.in_classes)]

    def describe(self, layout: Layout) -> str:
        return ", ".join(f"{c.name}: tp{d}" for c, d in zip(self.classes, layout))


class _Class:
    """Identical devices of one kind in every server of one template, with their groups by degree."""

    def __init__(self, name: str):
        self.name = name
        self.units: dict[int, list[int]] = defaultdict(list)  # degree -> devices (groups) of that degree

    @property
    def degrees(self) -> list[int]:
        return sorted(self.units)


def _device_classes(problem: PlacementProblem) -> list[_Class]:
    """Classes (template, kind) that have groups; devices of other kinds stay as they are."""
    classes: dict[tuple[str, str], _Class] = {}
    for k, d in enumerate(problem.devices):
        cls = classes.setdefault((d.node_template, d.kind), _Class(f"{d.node_template}/{d.kind}"))
        cls.units[problem.degree(k)].append(k)
    return [c for c in classes.values() if len(c.units) > 1]


def _finish(problem: PlacementProblem, options: SolveOptions, search: _Search, started: float) -> Plan:
    """The best plan with the whole problem's bound, its status and the layouts tried."""
    best = search.best
    assert best is not None
    bound = min(lower_bound(problem), best.objective_s)
    status = "optimal" if best.objective_s <= bound * (1 + options.rel_gap) else "heuristic"
    details = dict(best.solver.details) if best.solver.name == "milp-split" else {"baseline_won": best.solver.name}
    details.update(tp_layout=search.label, tp_layouts_tried={search.describe(l): obj for l, obj in search.tried.items()})
    return replace(best, lower_bound_s=float(bound),
                   solver=replace(best.solver, name="milp-split", status=status, time_s=time.perf_counter() - started,
                                  backend=options.backend, details=details))
