"""Studies that run several solver configurations on one instance: the symmetry comparison.

`compare_symmetry` solves one PlacementProblem with the exact MILP and with
MILP-SPLIT under every symmetry criterion (none, batch, task, time, first,
and the backend's own detection) and collects objective, bound, gap, time, status and
branch-and-bound nodes; `write_csv` and `write_bar_chart` save them.
"""

from __future__ import annotations

import csv
import io
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from llm_planner.core.atomic import write_atomic, write_figure
from llm_planner.core.fmt import fmt_s
from llm_planner.placement.options import SYMMETRY_CHOICES, SolveOptions
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.solve import SolveError, solve

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class StudyRow:
    criterion: str
    solver: str
    objective_s: float
    lower_bound_s: float
    gap: float
    time_s: float
    status: str
    nodes: int | None
    solver_status: str = ""  # the backend's own status (the exact MILP's: optimal when it proved its optimum)
    solver_bound_s: float = float("nan")  # the backend's dual bound (the plan's lower bound is the verifiable one)


STUDY_SOLVERS = ("milp", "milp-split")  # the solvers whose models symmetry breaking changes


def compare_symmetry(
    problem: PlacementProblem,
    *,
    time_limit_s: float,
    solvers: tuple[str, ...] = STUDY_SOLVERS,
    criteria: tuple[str, ...] = SYMMETRY_CHOICES,
    backend: str = "highs",
    progress=None,
) -> list[StudyRow]:
    """One row per (solver, criterion); a solve that finds no plan gets status 'no plan'."""
    rows = []
    for solver in solvers:
        for criterion in criteria:
            if progress is not None:
                progress(f"{solver}, symmetry {criterion}")
            options = SolveOptions(solver=solver, symmetry=criterion, time_limit_s=time_limit_s, backend=backend)
            try:
                plan = solve(problem, options)
            except SolveError as exc:
                log.warning("%s with symmetry %s: %s", solver, criterion, exc)
                rows.append(
                    StudyRow(
                        criterion=criterion,
                        solver=solver,
                        objective_s=float("nan"),
                        lower_bound_s=float("nan"),
                        gap=float("nan"),
                        time_s=float("nan"),
                        status="no plan",
                        nodes=None,
                    )
                )
                continue
            details = plan.solver.details
            nodes = details.get("nodes")
            rows.append(
                StudyRow(
                    criterion=criterion,
                    solver=solver,
                    objective_s=plan.objective_s,
                    lower_bound_s=plan.lower_bound_s,
                    gap=plan.gap,
                    time_s=plan.solver.time_s,
                    status=plan.solver.status,
                    nodes=int(nodes) if nodes is not None else None,
                    solver_status=str(details.get("solver_status", "")),
                    solver_bound_s=float(details.get("solver_bound_s", float("nan"))),
                )
            )
    return rows


def write_csv(rows: list[StudyRow], path: str | Path) -> None:
    """Write the rows atomically (llm_planner.core.atomic: WriteError naming the path if it cannot be)."""

    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(asdict(rows[0])))
    writer.writeheader()
    for row in rows:
        writer.writerow(asdict(row))
    write_atomic(path, text.getvalue())


def write_bar_chart(rows: list[StudyRow], path: str | Path, title: str) -> None:
    """Solve time per criterion, one group of bars per solver; the objective is printed on each bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    solvers = sorted({r.solver for r in rows}, key=[r.solver for r in rows].index)
    criteria = sorted({r.criterion for r in rows}, key=[r.criterion for r in rows].index)
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(criteria), 4.5))
    width = 0.8 / len(solvers)
    for n, solver in enumerate(solvers):
        xs, heights, labels = [], [], []
        for c, criterion in enumerate(criteria):
            row = next((r for r in rows if r.solver == solver and r.criterion == criterion), None)
            if row is None or row.status == "no plan":
                continue
            xs.append(c + n * width)
            heights.append(row.time_s)
            labels.append(f"{fmt_s(row.objective_s)}\n{row.status}")  # as the table prints it
        bars = ax.bar(xs, heights, width=width, label=solver)
        for bar, label in zip(bars, labels):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), label, ha="center", va="bottom", fontsize=7)
    ax.set_xticks([c + width * (len(solvers) - 1) / 2 for c in range(len(criteria))], criteria)
    ax.set_ylabel("solve time (s)")
    ax.set_xlabel("symmetry breaking")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, 1.3 * max((r.time_s for r in rows if r.status != "no plan"), default=1.0))  # room for the labels
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=len(solvers), frameon=False
    )  # below the axes, off the bars
    fig.tight_layout()

    try:
        write_figure(fig, path)
    finally:
        plt.close(fig)
