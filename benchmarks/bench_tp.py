"""Benchmark of tensor-parallel planning: MILP-SPLIT with groups against the layouts an
LLM-serving engineer writes by hand, on the example clusters.

One row per (model, cluster, objective, batch). Columns: MILP-SPLIT's plan (objective,
lower bound over every plan with groups, gap, solve time, the layout it chose, devices
used, the busiest device's memory against its usable memory), the `megatron` and
`tp-replicas` baselines, the best baseline on single devices (what the planner compared
with before groups), and MILP-SPLIT with --max-tp 1 (no groups). Every plan went through
the independent verifier (memory per device and per group member within its usable
memory included). The table is printed and written, as CSV and as the markdown that
docs/benchmarks.md quotes, to --out (default benchmarks/results/tp).

    .venv/bin/python benchmarks/bench_tp.py            # every row, about 3 minutes on 2 cores
    .venv/bin/python benchmarks/bench_tp.py --rows gpt3-175b/gpt3-six-servers/latency/32
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import provenance  # noqa: E402 (benchmarks/provenance.py, beside this script)

from llm_planner.core.fmt import fmt_s  # noqa: E402
from llm_planner.graph.models import ModelSpec  # noqa: E402
from llm_planner.placement.baselines.single import BASELINE_NAMES, run_baseline  # noqa: E402
from llm_planner.placement.baselines.tensor_parallel import run_tp_baseline  # noqa: E402
from llm_planner.placement.inputs import problem_from_inputs  # noqa: E402
from llm_planner.placement.options import SolveOptions  # noqa: E402
from llm_planner.placement.solve import solve  # noqa: E402
from llm_planner.placement.verify import verify_plan  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ROWS = [
    ("gpt3-175b", "gpt3-six-servers", objective, batch)
    for objective in ("latency", "throughput")
    for batch in (1, 8, 32)
]
ROWS += [
    ("llama2-70b", "four-gpus", "latency", 8),
    ("llama2-70b", "four-gpus", "throughput", 8),
    ("llama2-70b", "gpt3-six-servers", "latency", 8),
    ("llama3-8b", "four-gpus", "latency", 8),
    ("llama3-8b", "four-gpus", "throughput", 32),
    ("llama3-8b", "cpu-two-gpus", "latency", 4),
]
COLUMNS = (
    "row",
    "plan_s",
    "bound_s",
    "gap",
    "time_s",
    "layout",
    "devices",
    "memory",
    "megatron_s",
    "tp_replicas_s",
    "single_best",
    "single_best_s",
    "max_tp1_s",
    "vs_megatron",
    "vs_single",
)


def _name(row: tuple) -> str:
    return "/".join(map(str, row))


def _busiest_memory(plan, problem) -> str:
    """The fullest device (one member of a group) against its usable memory."""
    report = verify_plan(plan, problem)
    assert report.ok, report.violations
    shares = []
    for name, used in report.memory_per_device_bytes.items():
        device = next(d for d in problem.devices if d.name == name)
        shares.append(used / problem.cluster.kind(device.kind).usable_mem_bytes)
    return f"{max(shares):.1%}"


def _objective(plan) -> float:
    return plan.objective_s if plan is not None else float("nan")


def run_row(row: tuple) -> dict:
    model, cluster, objective, batch = row
    problem = problem_from_inputs(
        cluster_path=str(REPO / "cluster_specs" / f"{cluster}.yaml"),
        model=ModelSpec(name=model),
        objective=objective,
        batch_size=batch,
        max_tp=None,
    )
    started = time.perf_counter()
    plan = solve(problem, SolveOptions(solver="milp-split"))
    elapsed = time.perf_counter() - started
    megatron, replicas = run_tp_baseline("megatron", problem), run_tp_baseline("tp-replicas", problem)
    singles = {name: run_baseline(name, problem) for name in BASELINE_NAMES}
    best_single = min((p for p in singles.values() if p is not None), key=lambda p: p.objective_s, default=None)
    flat = problem_from_inputs(
        cluster_path=str(REPO / "cluster_specs" / f"{cluster}.yaml"),
        model=ModelSpec(name=model),
        objective=objective,
        batch_size=batch,
        max_tp=1,
    )
    no_groups = solve(flat, SolveOptions(solver="milp-split"))
    return {
        "row": _name(row),
        "plan_s": plan.objective_s,
        "bound_s": plan.lower_bound_s,
        "gap": plan.gap,
        "time_s": elapsed,
        "layout": plan.solver.details.get("tp_layout", "-"),
        "devices": len(plan.physical_devices_used()),
        "memory": _busiest_memory(plan, problem),
        "megatron_s": _objective(megatron),
        "tp_replicas_s": _objective(replicas),
        "single_best": best_single.solver.name.removeprefix("baseline:") if best_single else "none",
        "single_best_s": _objective(best_single),
        "max_tp1_s": no_groups.objective_s,
        "vs_megatron": _objective(megatron) / plan.objective_s,
        "vs_single": _objective(best_single) / plan.objective_s,
    }


def markdown(rows: list[dict]) -> str:
    head = (
        "row (model/cluster/objective/batch)",
        "plan",
        "bound",
        "gap",
        "solve",
        "devices",
        "fullest device",
        "megatron",
        "tp-replicas",
        "best single-device baseline",
        "milp-split --max-tp 1",
        "layout",
    )
    body = [
        [
            r["row"],
            fmt_s(r["plan_s"]),
            fmt_s(r["bound_s"]),
            f"{r['gap']:.1%}",
            f"{r['time_s']:.1f} s",
            str(r["devices"]),
            r["memory"],
            f"{fmt_s(r['megatron_s'])} ({r['vs_megatron']:.2f}x)",
            fmt_s(r["tp_replicas_s"]),
            f"{r['single_best']} {fmt_s(r['single_best_s'])} ({r['vs_single']:.2f}x)",
            fmt_s(r["max_tp1_s"]),
            r["layout"],
        ]
        for r in rows
    ]
    return provenance.markdown_table(head, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="*", help="only these rows (model/cluster/objective/batch)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tp"))
    args = parser.parse_args()
    facts = provenance.start(sys.argv)
    chosen = [r for r in ROWS if not args.rows or _name(r) in args.rows]
    rows = []
    for row in chosen:
        rows.append(run_row(row))
        r = rows[-1]
        print(
            f"{r['row']}: {fmt_s(r['plan_s'])} (bound {fmt_s(r['bound_s'])}, gap {r['gap']:.1%}, {r['time_s']:.1f} s); "
            f"megatron {fmt_s(r['megatron_s'])}, tp-replicas {fmt_s(r['tp_replicas_s'])}, "
            f"best single {fmt_s(r['single_best_s'])}, --max-tp 1 {fmt_s(r['max_tp1_s'])}",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    provenance.record(out, facts)
    provenance.write_csv(out, COLUMNS, rows)
    (out / "table.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
