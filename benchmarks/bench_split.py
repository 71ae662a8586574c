"""Benchmark: MILP-SPLIT against the exact MILP, the best baseline and the lower bound.

    .venv/bin/python benchmarks/bench_split.py [--quick] [--out DIR] [--time-limit S]
        [--split-time-limit S] [--max-module-tasks N] [--workers N] [--objectives latency,throughput]
        [--milp-max-tasks N] [--no-milp] [--big | --no-big] [--models NAME[,NAME...]] [--only TEXT[,TEXT...]]
        [--frontier [--frontier-time-limit S]]
    .venv/bin/python benchmarks/bench_split.py --from-csv A.csv B.csv [--milp-from C.csv] --out DIR
        (report earlier runs as one; a row of B replaces the same instance's row of A; rows with
        no MILP columns take those of C's same instance, with a note saying so)

Every instance is built with llm_planner.placement.inputs.problem_from_inputs (a model
preset on a cluster spec, batch 1 and 8, the latency objective by default;
`--objectives throughput` or `latency,throughput` for throughput rows) and
solved, in this one run, by

- the exact MILP (`solver="milp"`) under `--time-limit` seconds (default 60,
  10 with --quick), in a child process that is killed if it overruns the limit
  by more than a minute (model building can be slow on the largest graphs);
  skipped above `--milp-max-tasks` tasks; on the frontier series (`--frontier`:
  rwnn-ws-3x8 ... 6x8 on cpu-two-gpus, batch 1, one 8-node stage more per row)
  under `--frontier-time-limit` (default 1800), to find the largest graph the
  MILP still proves optimal;
- MILP-SPLIT (`solver="milp-split"`, `--split-time-limit` per subproblem,
  `--max-module-tasks`, `--workers`);
- the best baseline (`solver="best-baseline"`) and the single fastest device
  (`solver="single-device"`).

Solve times are wall-clock seconds of `solve(...)` with the verifier off; every
plan is then verified separately (column `verified`). The bound of a row is the
best valid lower bound known: the larger of MILP-SPLIT's (critical path,
load-balance LP, sum of per-module bounds) and the MILP's dual bound. Gaps are
objective / bound - 1; the speedup is MILP time / MILP-SPLIT time (a lower
bound on the true speedup when the MILP stopped at its time limit); the
improvements are 1 - MILP-SPLIT / baseline. The speedup target is read on the
largest graph of each series that the MILP proves optimal by a search (it beats
its warm start, the best baseline); where the best baseline is already optimal
both solvers return it as soon as a bound proves it, and those rows are listed
but not counted.

Writes DIR/bench_split.csv, DIR/bench_split.png (solve time against graph
size, log scale, both solvers) and DIR/targets.txt, and prints a table and the
targets of the MILP-SPLIT issue with the measured numbers. Timings are noisy
on a shared 2-core machine: compare rows of one run.
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import provenance  # noqa: E402 (benchmarks/provenance.py, beside this script)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]

RWNN = [f"rwnn-{g}-3x{n}" for g in ("ws", "er", "ba") for n in (32, 64, 128, 256)]
FULL_MODELS = ["resnet50", *RWNN, "gpt2-xl", "gpt3-175b"]
QUICK_MODELS = ["rwnn-ws-3x32", "rwnn-er-3x64", "gpt2-xl", "gpt3-175b"]
CLUSTERS = ["cpu-two-gpus", "four-gpus"]
BIG = ("rwnn-ws-4x2500", "cpu-two-gpus", 1)  # the 10,000-task RWNN, MILP-SPLIT only
# The exact MILP's frontier: randomly wired networks of 8-node stages, one stage more per row, until
# the MILP no longer proves optimality within --frontier-time-limit (the series of the speedup target).
FRONTIER = [f"rwnn-ws-{n}x8" for n in range(3, 7)]
FRONTIER_CLUSTER = "cpu-two-gpus"
MILP_GRACE_S = 60.0  # a MILP child may overrun its time limit by this much (model building) before it is killed


@dataclass
class Row:
    model: str
    cluster: str
    batch: int
    objective: str
    tasks: int = 0
    edges: int = 0
    note: str = ""
    milp_s: float = math.nan  # objective (latency s, or s per sample)
    milp_bound_s: float = math.nan
    milp_status: str = ""
    milp_time_s: float = math.nan
    milp_limit_s: float = math.nan
    split_s: float = math.nan
    split_bound_s: float = math.nan
    split_status: str = ""
    split_time_s: float = math.nan
    modules: int = 0
    distinct_modules: int = 0
    subproblems_solved: int = 0
    baseline_s: float = math.nan
    baseline_name: str = ""
    single_s: float = math.nan
    verified: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def instance(self) -> tuple[str, str, int, str]:
        """(model, cluster, batch, objective): what a row measures, the same across runs."""
        return (self.model, self.cluster, self.batch, self.objective)

    @property
    def bound_s(self) -> float:
        return max((b for b in (self.split_bound_s, self.milp_bound_s) if math.isfinite(b)), default=math.nan)

    def derived(self) -> dict[str, float]:
        def ratio(a: float, b: float) -> float:
            return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan

        return {
            "bound_s": self.bound_s,
            "split_gap": ratio(self.split_s, self.bound_s) - 1,
            "milp_gap": ratio(self.milp_s, self.bound_s) - 1,
            "split_vs_milp": ratio(self.split_s, self.milp_s) - 1,
            "speedup": ratio(self.milp_time_s, self.split_time_s),
            "vs_baseline": 1 - ratio(self.split_s, self.baseline_s),
            "vs_single": 1 - ratio(self.split_s, self.single_s),
        }


# -- solving -----------------------------------------------------------------------


def build(row: Row):
    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.inputs import problem_from_inputs

    return problem_from_inputs(
        cluster_path=str(REPO / "cluster_specs" / f"{row.cluster}.yaml"),
        model=ModelSpec(name=row.model),
        objective=row.objective,
        batch_size=row.batch,
    )


def timed_solve(problem, options):
    """(plan, wall seconds, verified) with the verifier run apart from the timing."""
    from llm_planner.placement.solve import solve
    from llm_planner.placement.verify import verify_plan

    started = time.perf_counter()
    plan = solve(problem, replace(options, verify=False))
    elapsed = time.perf_counter() - started
    return plan, elapsed, verify_plan(plan, problem).ok


def _milp_child(problem, time_limit_s: float, conn) -> None:
    from llm_planner.placement.options import SolveOptions

    try:
        plan, elapsed, ok = timed_solve(problem, SolveOptions(solver="milp", time_limit_s=time_limit_s))
        conn.send(
            {
                "objective_s": plan.objective_s,
                "bound_s": plan.lower_bound_s,
                "status": plan.solver.status,
                "time_s": elapsed,
                "verified": ok,
            }
        )
    except Exception as exc:  # report any failure (no plan in time, infeasible) to the parent as a row note
        conn.send({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"})


def run_milp(problem, time_limit_s: float) -> dict:
    """The exact MILP in a forked child process (which inherits the problem), killed if it
    overruns its time limit by MILP_GRACE_S."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_milp_child, args=(problem, time_limit_s, child))
    started = time.perf_counter()
    proc.start()
    child.close()
    result = None
    if parent.poll(time_limit_s + MILP_GRACE_S):
        try:
            result = parent.recv()
        except EOFError:
            result = None
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if result is None:
        code = proc.exitcode
        result = {
            "error": f"killed after {time.perf_counter() - started:.0f} s"
            if code in (None, -9)
            else f"exit code {code}"
        }
    return result


def run_row(row: Row, args) -> Row:
    from llm_planner.placement.inputs import InputError
    from llm_planner.placement.options import SolveOptions
    from llm_planner.placement.solve import SolveError

    try:
        problem = build(row)
    except InputError as exc:  # e.g. a model that no placement on the cluster can hold: refused before any solve
        row.note = "no plan: " + str(exc).split(": ", 2)[-1][:100]
        return row
    row.tasks, row.edges = problem.num_tasks, problem.num_edges
    checks = []
    try:
        options = SolveOptions(
            solver="milp-split",
            time_limit_s=args.split_time_limit,
            workers=args.workers,
            max_module_tasks=args.max_module_tasks,
        )
        plan, row.split_time_s, ok = timed_solve(problem, options)
    except SolveError as exc:
        row.note = f"no plan: {str(exc)[:100]}"
        return row
    checks.append(ok)
    d = plan.solver.details
    row.split_s, row.split_bound_s, row.split_status = plan.objective_s, plan.lower_bound_s, plan.solver.status
    row.modules, row.distinct_modules, row.subproblems_solved = (
        d.get("modules", 0),
        d.get("distinct_modules", 0),
        d.get("subproblems_solved", 0),
    )
    if d.get("baseline_won"):
        row.note = f"baseline won ({d['baseline_won']})"
    for solver, attr in (("best-baseline", "baseline"), ("single-device", "single")):
        try:
            base, _, ok = timed_solve(problem, SolveOptions(solver=solver))
        except SolveError:
            continue
        checks.append(ok)
        setattr(row, f"{attr}_s", base.objective_s)
        if attr == "baseline":
            row.baseline_name = base.solver.name.removeprefix("baseline:")
    if row.tasks > args.milp_max_tasks:
        row.milp_status = "skipped"
    elif not args.no_milp:
        row.milp_limit_s = args.frontier_time_limit if row.model in FRONTIER else args.time_limit
        result = run_milp(problem, row.milp_limit_s)
        if "error" in result:
            row.milp_status, row.note = "no plan", (row.note + "; " if row.note else "") + "milp: " + result["error"]
        else:
            row.milp_s, row.milp_bound_s, row.milp_status = result["objective_s"], result["bound_s"], result["status"]
            row.milp_time_s = result["time_s"]
            checks.append(result["verified"])
    row.verified = "yes" if all(checks) else "NO"
    return row


# -- output --------------------------------------------------------------------------

COLUMNS = [
    "model",
    "cluster",
    "batch",
    "objective",
    "tasks",
    "edges",
    "modules",
    "distinct_modules",
    "subproblems_solved",
    "milp_s",
    "milp_bound_s",
    "milp_status",
    "milp_time_s",
    "milp_limit_s",
    "split_s",
    "split_bound_s",
    "split_status",
    "split_time_s",
    "baseline_s",
    "baseline_name",
    "single_s",
    "verified",
    "note",
]
DERIVED = ["bound_s", "split_gap", "milp_gap", "split_vs_milp", "speedup", "vs_baseline", "vs_single"]


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(COLUMNS + DERIVED)
        for r in rows:
            derived = r.derived()
            out.writerow([getattr(r, c) for c in COLUMNS] + [derived[c] for c in DERIVED])


def read_csv(paths: list[str]) -> list[Row]:
    """Rows of earlier runs (this script's CSV), e.g. two runs over different instances to report as one.
    A row of a later file replaces the same instance's (model, cluster, batch, objective) row of an earlier one."""
    types = {f.name: f.type for f in Row.__dataclass_fields__.values()}
    rows: dict[tuple, Row] = {}
    for path in paths:
        with open(path, newline="") as fh:
            for rec in csv.DictReader(fh):
                values = {}
                for name in COLUMNS:
                    kind, text = types[name], rec.get(name, "")
                    if kind in ("int", int):
                        values[name] = int(text or 0)
                    elif kind in ("float", float):
                        values[name] = float(text) if text not in ("", None) else math.nan
                    else:
                        values[name] = text
                row = Row(**values)
                rows[row.instance] = row
    return list(rows.values())


MILP_COLUMNS = ("milp_s", "milp_bound_s", "milp_status", "milp_time_s", "milp_limit_s")


def take_milp_columns(rows: list[Row], earlier: list[Row]) -> None:
    """Copy the exact MILP's columns of an earlier run into the rows of the same instances that
    have none (a MILP-SPLIT-only run joined with the MILP of a run whose MILP and bound code
    were the same for those instances). The note says where they came from."""
    found = {r.instance: r for r in earlier if r.milp_status}
    for row in rows:
        old = found.get(row.instance)
        if old is None or row.milp_status:
            continue
        for name in MILP_COLUMNS:
            setattr(row, name, getattr(old, name))
        row.note = "; ".join(n for n in (row.note, "MILP columns from an earlier run") if n)


def _pct(x: float) -> str:
    return "" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _ms(x: float) -> str:
    return "" if not math.isfinite(x) else f"{1e3 * x:.4g}"


def _sec(x: float) -> str:
    return "" if not math.isfinite(x) else f"{x:.2f}"


def table_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    head = [
        "model",
        "cluster",
        "b",
        "obj",
        "tasks",
        "MILP ms",
        "MILP status",
        "MILP s",
        "SPLIT ms",
        "SPLIT s",
        "bound ms",
        "SPLIT gap",
        "SPLIT vs MILP",
        "speedup",
        "vs best baseline",
        "vs single device",
        "note",
    ]
    body = []
    for r in rows:
        d = r.derived()
        speed = (
            ""
            if not math.isfinite(d["speedup"])
            else f"{'>=' if r.milp_status == 'time_limit' else ''}{d['speedup']:.0f}x"
        )
        body.append(
            [
                r.model,
                r.cluster,
                str(r.batch),
                r.objective[:3],
                str(r.tasks),
                _ms(r.milp_s),
                r.milp_status,
                _sec(r.milp_time_s),
                _ms(r.split_s),
                _sec(r.split_time_s),
                _ms(d["bound_s"]),
                _pct(d["split_gap"]),
                _pct(d["split_vs_milp"]),
                speed,
                _pct(d["vs_baseline"]),
                _pct(d["vs_single"]),
                r.note,
            ]
        )
    return head, body


def print_table(rows: list[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    head, body = table_rows(rows)
    table = Table(title="MILP-SPLIT against the exact MILP (objective in ms; throughput rows: ms per sample)")
    for h in head:
        table.add_column(h, justify="left" if h in ("model", "cluster", "MILP status", "note", "obj") else "right")
    for line in body:
        table.add_row(*line)
    console = Console()
    if not console.is_terminal:
        console = Console(width=250)  # a log file: no wrapping
    console.print(table)


def markdown_table(rows: list[Row]) -> str:
    head, body = table_rows(rows)
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if h in ("model", "cluster", "note") else "---:" for h in head) + "|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    done = [r for r in rows if math.isfinite(r.split_time_s)]
    ax.scatter([r.tasks for r in done], [r.split_time_s for r in done], marker="o", label="MILP-SPLIT")
    for status, marker, label in (
        ("optimal", "s", "exact MILP, optimal"),
        ("time_limit", "x", "exact MILP, stopped at the time limit"),
    ):
        sel = [r for r in rows if r.milp_status == status and math.isfinite(r.milp_time_s)]
        if sel:
            ax.scatter([r.tasks for r in sel], [r.milp_time_s for r in sel], marker=marker, label=label)
    others = [
        r
        for r in rows
        if r.milp_status not in ("optimal", "time_limit", "", "skipped") and math.isfinite(r.milp_time_s)
    ]
    if others:
        ax.scatter(
            [r.tasks for r in others], [r.milp_time_s for r in others], marker="^", label="exact MILP, other status"
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tasks in the graph")
    ax.set_ylabel("solve time (s)")
    ax.set_title("Solve time against graph size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- targets ---------------------------------------------------------------------------


def targets(rows: list[Row]) -> list[tuple[str, bool | None, str]]:
    """(target, met: True/False/None = not measured, measured numbers) for each target of the issue."""
    out: list[tuple[str, bool | None, str]] = []
    optimal = [r for r in rows if r.milp_status == "optimal" and math.isfinite(r.split_s)]
    worst = max(optimal, key=lambda r: r.derived()["split_vs_milp"], default=None)
    out.append(
        (
            "MILP-SPLIT within 1% of the MILP wherever the MILP proves optimality",
            None if worst is None else worst.derived()["split_vs_milp"] <= 0.01,
            "no row with a proven MILP optimum"
            if worst is None
            else (
                f"{len(optimal)} rows; worst {_pct(worst.derived()['split_vs_milp'])} "
                f"({worst.model}, {worst.cluster}, batch {worst.batch})"
            ),
        )
    )
    gaps = [r.derived()["split_gap"] for r in rows if r.model not in FRONTIER]  # the instances only
    gaps = [g for g in gaps if math.isfinite(g)]
    geo = math.exp(sum(math.log1p(max(g, 0.0)) for g in gaps) / len(gaps)) - 1 if gaps else math.nan
    out.append(
        (
            "geometric-mean gap of MILP-SPLIT to the lower bound at most 5%",
            None if not gaps else geo <= 0.05,
            f"{_pct(geo)} over {len(gaps)} rows, the frontier series left out "
            f"(max {_pct(max(gaps, default=math.nan))})",
        )
    )
    worse = [r for r in rows if r.derived()["vs_baseline"] < -1e-9]
    compared = sum(1 for r in rows if math.isfinite(r.derived()["vs_baseline"]))
    out.append(
        (
            "never worse than the best baseline",
            not worse if compared else None,
            f"{compared} rows compared; worse in {len(worse)}"
            + (f": {', '.join(r.model for r in worse)}" if worse else ""),
        )
    )
    frontier = frontier_rows(rows)
    instant = sorted((r for r in optimal if not searched(r)), key=lambda r: -r.tasks)[:3]
    out.append(
        (
            "at least 100x faster than the MILP on the largest graphs it still solves (to optimality)",
            None if not frontier else all(r.derived()["speedup"] >= 100 for r in frontier),
            (
                "no series with a graph the MILP proves optimal by a search"
                if not frontier
                else "largest graph the MILP proves optimal by a search, per series: "
                + "; ".join(
                    f"{r.model} ({r.tasks} tasks, {r.cluster}, batch {r.batch}): MILP {r.milp_time_s:.1f} s, "
                    f"MILP-SPLIT {r.split_time_s:.2f} s, {r.derived()['speedup']:.0f}x"
                    for r in frontier
                )
            )
            + (
                ""
                if not instant
                else "; not counted, proven at once because the best baseline is optimal: "
                + "; ".join(
                    f"{r.model} ({r.tasks} tasks, {r.cluster}, batch {r.batch}): {r.derived()['speedup']:.0f}x"
                    for r in instant
                )
            ),
        )
    )
    big = [r for r in rows if (r.model, r.cluster, r.batch) == BIG[:3] and math.isfinite(r.split_time_s)]
    out.append(
        (
            f"a {BIG[0]} plan in under 60 s",
            None if not big else big[0].split_time_s < 60,
            "not run"
            if not big
            else f"{big[0].tasks} tasks in {big[0].split_time_s:.1f} s, gap {_pct(big[0].derived()['split_gap'])}",
        )
    )
    return out


def searched(row: Row) -> bool:
    """Whether the MILP had to search for its plan: it beats the best baseline (its warm start) by more
    than its gap tolerance. Where the baseline is already optimal, the MILP and MILP-SPLIT both return
    it as soon as a bound proves it (a fraction of a second each): no 100x is to be had there."""
    return row.milp_status == "optimal" and math.isfinite(row.baseline_s) and row.milp_s < row.baseline_s * (1 - 1e-4)


def frontier_rows(rows: list[Row]) -> list[Row]:
    """Per series (model family: resnet50, gpt2-xl, rwnn-<generator>; cluster; batch; objective), the largest
    graph the MILP proves optimal by a search: where the issue's "largest graphs the MILP can still solve" are."""
    best: dict[tuple, Row] = {}
    for r in rows:
        if searched(r) and math.isfinite(r.split_time_s):
            family = "-".join(r.model.split("-")[:2]) if r.model.startswith("rwnn-") else r.model
            key = (family, r.cluster, r.batch, r.objective)
            if key not in best or r.tasks > best[key].tasks:
                best[key] = r
    return list(best.values())


def targets_text(rows: list[Row]) -> str:
    word = {True: "MET", False: "NOT MET", None: "not measured"}
    return "\n".join(f"- {name}: **{word[met]}** ({numbers})" for name, met, numbers in targets(rows))


# -- main ------------------------------------------------------------------------------


def instances(args) -> list[Row]:
    models = args.models.split(",") if args.models else QUICK_MODELS if args.quick else FULL_MODELS
    objectives = args.objectives.split(",")
    rows = [
        Row(model=m, cluster=c, batch=b, objective=o)
        for o in objectives
        for c in CLUSTERS
        for m in models
        for b in (1, 8)
    ]
    if args.big:
        rows.append(Row(model=BIG[0], cluster=BIG[1], batch=BIG[2], objective="latency"))
    if args.frontier:
        rows += [Row(model=m, cluster=FRONTIER_CLUSTER, batch=1, objective="latency") for m in FRONTIER]
    if args.only:
        wanted = args.only.split(",")
        rows = [r for r in rows if any(w in f"{r.model} {r.cluster} {r.batch} {r.objective}" for w in wanted)]
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from llm_planner.placement.options import SolveOptions

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer instances, MILP limited to 10 s (unless --time-limit)")
    ap.add_argument(
        "--out",
        default=str(REPO / "benchmarks" / "results" / "split"),
        help="directory for the CSV, the figure, the targets, table.md and meta.json",
    )
    ap.add_argument(
        "--time-limit", type=float, default=None, help="exact MILP time limit, s (default 60; 10 with --quick)"
    )
    ap.add_argument("--split-time-limit", type=float, default=10.0, help="MILP-SPLIT time limit per subproblem, s")
    ap.add_argument(
        "--max-module-tasks",
        type=int,
        default=SolveOptions.max_module_tasks,
        help="MILP-SPLIT: larger modules go to HEFT + local search instead of the exact MILP",
    )
    ap.add_argument("--workers", type=int, default=0, help="MILP-SPLIT subproblem processes (0: all cores)")
    ap.add_argument(
        "--frontier",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=f"add the MILP's frontier series ({FRONTIER[0]} ... {FRONTIER[-1]} on {FRONTIER_CLUSTER}, batch 1)",
    )
    ap.add_argument(
        "--frontier-time-limit", type=float, default=1800.0, help="exact MILP time limit on the frontier series, s"
    )
    ap.add_argument("--milp-max-tasks", type=int, default=1000, help="skip the exact MILP on larger graphs")
    ap.add_argument("--no-milp", action="store_true", help="skip the exact MILP everywhere")
    ap.add_argument("--objectives", default="latency", help="comma-separated: latency, throughput (default: latency)")
    ap.add_argument(
        "--big",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"add the {BIG[0]} row (default: on, off with --quick)",
    )
    ap.add_argument("--models", default="", help="comma-separated model presets instead of the default set")
    ap.add_argument(
        "--only",
        default="",
        help="keep instances whose 'model cluster batch objective' contains one of these comma-separated texts",
    )
    ap.add_argument(
        "--from-csv",
        nargs="+",
        default=[],
        metavar="CSV",
        help="solve nothing: report (table, figure, targets) the rows of these earlier runs' CSVs as one",
    )
    ap.add_argument(
        "--milp-from",
        nargs="+",
        default=[],
        metavar="CSV",
        help="with --from-csv: take the exact MILP's columns of rows that have none from these earlier CSVs",
    )
    args = ap.parse_args(argv)
    if args.milp_from and not args.from_csv:
        ap.error("--milp-from joins earlier runs: use it with --from-csv")
    if not args.objectives or set(args.objectives.split(",")) - {"latency", "throughput"}:
        ap.error(f"--objectives: a comma-separated list of latency and throughput, got {args.objectives!r}")
    if args.time_limit is None:
        args.time_limit = 10.0 if args.quick else 60.0
    if args.big is None:
        args.big = not args.quick
    return args


def warm_up() -> None:
    """Import what the solvers import lazily, so that no row's time includes it."""
    import scipy.optimize  # noqa: F401

    import llm_planner.placement.baselines.single  # noqa: F401
    import llm_planner.placement.milp.milp  # noqa: F401
    import llm_planner.placement.split.split  # noqa: F401
    import llm_planner.placement.verify  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    facts = provenance.start(sys.argv if argv is None else [sys.argv[0], *argv])
    warm_up()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_csv(args.from_csv) if args.from_csv else []
    if args.milp_from:
        take_milp_columns(rows, read_csv(args.milp_from))
    if args.from_csv:
        write_csv(rows, out / "bench_split.csv")
    for row in [] if args.from_csv else instances(args):
        started = time.perf_counter()
        rows.append(run_row(row, args))
        d = row.derived()
        print(
            f"[{time.perf_counter() - started:6.1f} s] {row.model} {row.cluster} b={row.batch} {row.objective}: "
            f"tasks {row.tasks}, split {_ms(row.split_s)} ms in {_sec(row.split_time_s)} s, "
            f"milp {_ms(row.milp_s)} ms ({row.milp_status}) in {_sec(row.milp_time_s)} s, "
            f"gap {_pct(d['split_gap'])}, vs milp {_pct(d['split_vs_milp'])} {row.note}",
            flush=True,
        )
        write_csv(rows, out / "bench_split.csv")  # after every row: a long run leaves its rows behind if stopped
    plot(rows, out / "bench_split.png")
    print_table(rows)
    text = targets_text(rows)
    (out / "targets.txt").write_text(text + "\n\n" + markdown_table(rows) + "\n")
    (out / "table.md").write_text(markdown_table(rows) + "\n\n" + text + "\n")
    provenance.record(out, facts)
    print(text)
    print(f"wrote {out / 'bench_split.csv'}, {out / 'bench_split.png'}, {out / 'targets.txt'}")
    return 1 if any(r.verified == "NO" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
