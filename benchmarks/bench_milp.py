"""Benchmark of the exact MILP against the best baseline, one table row per instance.

Two suites:
  models     ResNet-50, randomly wired networks of 22 to 202 tasks and GPT-2 blocks
             on a cluster spec (default: the CPU + two GPUs node), batch 1 and 8;
  workloads  the dnn-partitioning throughput inputs (their own accelerators, CPUs and
             memory), with and without --contiguous.

Columns: MILP objective, bound, gap, status, solve time (the whole solve_milp call,
warm start included), model size (variables / integer / rows), branch-and-bound
nodes, best baseline and its objective. The table is printed and written as CSV and
markdown, with meta.json (benchmarks/provenance.py).

    .venv/bin/python benchmarks/bench_milp.py models [--time-limit 60]     # writes benchmarks/results/milp-models/
    .venv/bin/python benchmarks/bench_milp.py workloads --time-limit 600   # writes benchmarks/results/milp-workloads/
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import provenance  # noqa: E402 (benchmarks/provenance.py, beside this script)

from llm_planner.core.spec import load_cluster  # noqa: E402
from llm_planner.graph.models import ModelSpec, build_model_graph  # noqa: E402
from llm_planner.placement.inputs import load_graph_file  # noqa: E402
from llm_planner.placement.options import SolveOptions  # noqa: E402
from llm_planner.placement.problem import build_problem  # noqa: E402
from llm_planner.placement.session import SolveSession  # noqa: E402
from llm_planner.placement.solve import SolveError, solve  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODELS = (
    ("resnet50", ModelSpec(name="resnet50")),
    ("rwnn-ws-1x16", ModelSpec(name="rwnn-ws-1x16")),
    ("rwnn-ws-3x16", ModelSpec(name="rwnn-ws-3x16")),
    ("rwnn-ws-3x32", ModelSpec(name="rwnn-ws-3x32")),
    ("rwnn-ws-3x64", ModelSpec(name="rwnn-ws-3x64")),
    ("gpt2 prefill 1024", ModelSpec(name="gpt2", phase="prefill", seq_len=1024)),
)
COLUMNS = (
    "instance",
    "objective",
    "batch",
    "tasks",
    "contiguous",
    "milp_s",
    "bound_s",
    "gap",
    "status",
    "time_s",
    "vars",
    "integer",
    "rows",
    "nodes",
    "baseline",
    "baseline_s",
    "vs_baseline",
)


def run_one(name: str, problem, options: SolveOptions) -> dict:
    """Solve one instance; a row of the table (an infeasible one keeps the solver's message)."""
    base = SolveSession(problem).best_baseline  # every baseline, tensor-parallel ones included
    row = {
        "instance": name,
        "objective": problem.objective,
        "batch": problem.batch_size,
        "tasks": problem.num_tasks,
        "contiguous": options.contiguous,
        "baseline": base.solver.name.removeprefix("baseline:") if base else "none",
        "baseline_s": base.objective_s if base else float("nan"),
    }
    started = time.perf_counter()
    try:
        plan = solve(problem, options)
    except SolveError as exc:
        return {**row, "status": f"error: {exc}", "time_s": time.perf_counter() - started}
    d = plan.solver.details
    row.update(
        milp_s=plan.objective_s,
        bound_s=plan.lower_bound_s,
        gap=plan.gap,
        status=plan.solver.status,
        time_s=time.perf_counter() - started,
        vars=d.get("num_vars", "-"),
        integer=d.get("num_integer", "-"),
        rows=d.get("num_rows", "-"),
        nodes=d.get("nodes", "-"),
    )  # "-": a bound proved the warm start before any model
    if base is not None and base.objective_s > 0:
        row["vs_baseline"] = plan.objective_s / base.objective_s
    return row


def model_rows(args) -> list[dict]:
    cluster = load_cluster(args.cluster)
    rows = []
    for name, spec in MODELS:
        if args.only and not any(o in name for o in args.only):
            continue
        graph = build_model_graph(spec)
        for objective in args.objectives:
            for batch in args.batches:
                problem = build_problem(graph, cluster, objective=objective, batch_size=batch, dtype=spec.dtype)
                rows.append(run_one(name, problem, _options(args)))
                print_row(rows[-1])
    return rows


def workload_rows(args) -> list[dict]:
    rows = []
    for path in sorted(Path(args.workloads).glob("*/*.json")):
        name = f"{path.parent.name}/{path.name}"
        if args.only and not any(o in name for o in args.only):
            continue
        graph, cluster = load_graph_file(path)
        problem = build_problem(graph, cluster, objective="throughput", batch_size=1)
        for contiguous in (True, False):
            rows.append(run_one(name, problem, _options(args, contiguous=contiguous)))
            print_row(rows[-1])
    return rows


def _options(args, *, contiguous: bool = False) -> SolveOptions:
    return SolveOptions(
        solver="milp",
        backend=args.backend,
        time_limit_s=args.time_limit,
        rel_gap=args.gap,
        threads=args.threads,
        contiguous=contiguous,
    )


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def print_row(row: dict) -> None:
    if not getattr(print_row, "header", False):
        print(" | ".join(COLUMNS))
        print_row.header = True
    print(" | ".join(_fmt(row.get(c, "")) for c in COLUMNS), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", choices=("models", "workloads"))
    parser.add_argument(
        "--cluster", default=str(REPO / "cluster_specs" / "cpu-two-gpus.yaml"), help="models suite: cluster spec"
    )
    published = os.environ.get("LLM_PLANNER_WORKLOADS") or REPO.parent / "shared" / "workloads" / "dnn-partitioning"
    parser.add_argument(
        "--workloads",
        default=str(Path(published) / "throughput-inputs"),
        help="workloads suite: the throughput-inputs folder",
    )
    parser.add_argument("--objectives", nargs="+", choices=("latency", "throughput"), default=["latency", "throughput"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--only", nargs="*", default=[], help="run only instances whose name contains one of these")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per MILP solve")
    parser.add_argument("--gap", type=float, default=1e-4, help="relative MIP gap")
    parser.add_argument("--threads", type=int, default=1, help="solver threads (default 1, for comparable timings)")
    parser.add_argument("--backend", choices=("highs", "gurobi"), default="highs")
    parser.add_argument(
        "--out",
        default=None,
        help="folder for results.csv, table.md and meta.json (default: benchmarks/results/milp-<suite>)",
    )
    args = parser.parse_args(argv)
    facts = provenance.start(sys.argv if argv is None else [sys.argv[0], *argv])
    rows = model_rows(args) if args.suite == "models" else workload_rows(args)
    out = Path(args.out or REPO / "benchmarks" / "results" / f"milp-{args.suite}")
    out.mkdir(parents=True, exist_ok=True)
    provenance.write_csv(out, COLUMNS, ({c: row.get(c, "") for c in COLUMNS} for row in rows))
    (out / "table.md").write_text(markdown(rows) + "\n")
    provenance.record(out, facts)
    print(f"wrote {out} ({len(rows)} rows)", file=sys.stderr)
    return 0


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(_fmt(row.get(c, "")) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
