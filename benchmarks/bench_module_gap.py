"""Benchmark: where MILP-SPLIT's gap comes from, on one module of one instance.

    .venv/bin/python benchmarks/bench_module_gap.py --model rwnn-ws-3x32 --cluster cpu-two-gpus
        [--batch 1] [--module J] [--input-device K] [--time-limit S] [--out DIR]

For the module (default: the largest) and its input cut pinned to device K
(default: the device that runs the whole model fastest alone), and for every
device l of its output cut, this solves the module subproblem
(llm_planner.placement.split.subproblem.build_subproblem) with

- HEFT, and HEFT followed by MILP-SPLIT's first-improvement moves;
- the iterated local search MILP-SPLIT runs on the modules its DP picks
  (split.subsolve.intensify_subproblem, from HEFT + moves);
- the exact MILP under `--time-limit` seconds (default 120), warm-started by the
  best baseline: its plan and its dual bound;

and computes the bound MILP-SPLIT carries for the module (bounds.combined.lower_bound
of the subproblem, its cuts pinned). A gap that stays wide between the best plan
and the best bound, with the exact MILP's own dual bound no higher, is the bound's
weakness, not the split's.

Writes DIR/bench_module_gap.csv and prints a table (times in ms, solve times in s).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]

COLUMNS = [
    "model",
    "cluster",
    "batch",
    "module",
    "tasks",
    "edges",
    "input_device",
    "output_device",
    "heft_ms",
    "moves_ms",
    "ils_ms",
    "ils_s",
    "milp_ms",
    "milp_bound_ms",
    "milp_status",
    "milp_s",
    "split_bound_ms",
    "gap",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a model preset, e.g. rwnn-ws-3x32")
    ap.add_argument("--cluster", required=True, help="a cluster spec under cluster_specs/, e.g. cpu-two-gpus")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--module", type=int, default=None, help="module index (default: the largest)")
    ap.add_argument(
        "--input-device", type=int, default=None, help="device index of the input cut (default: the fastest alone)"
    )
    ap.add_argument("--time-limit", type=float, default=120.0, help="exact MILP time limit per output device, s")
    ap.add_argument("--out", default="out/bench_module_gap")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.baselines.single import run_baseline
    from llm_planner.placement.bounds.combined import lower_bound
    from llm_planner.placement.bounds.times import task_times
    from llm_planner.placement.inputs import problem_from_inputs
    from llm_planner.placement.milp.milp import solve_milp
    from llm_planner.placement.options import SolveOptions
    from llm_planner.placement.split.moves import improve_by_moves
    from llm_planner.placement.split.split_context import SplitContext
    from llm_planner.placement.split.subproblem import build_subproblem
    from llm_planner.placement.split.subsolve import LOCAL_SEARCH_WORK, _list_scheduled, intensify_subproblem

    args = parse_args(argv)
    problem = problem_from_inputs(
        cluster_path=str(REPO / "cluster_specs" / f"{args.cluster}.yaml"),
        model=ModelSpec(name=args.model),
        objective="latency",
        batch_size=args.batch,
    )
    options = SolveOptions(solver="milp-split")
    ctx = SplitContext(problem, options)
    j = (
        args.module
        if args.module is not None
        else max(range(len(ctx.modules)), key=lambda n: len(ctx.modules[n].tasks))
    )
    if not 0 <= j < len(ctx.modules):
        sys.exit(f"--module: the graph has modules 0..{len(ctx.modules) - 1}, got {j}")
    module = ctx.modules[j]
    if module.input_task is None:
        k = None
    elif args.input_device is not None:
        k = args.input_device
    else:
        k = int(
            np.argmin(
                np.where(np.isfinite(task_times(problem, args.batch)), task_times(problem, args.batch), 0).sum(axis=0)
            )
        )
    allowed = np.ones(problem.num_devices, dtype=bool)
    rows = []
    for l in range(problem.num_devices):
        sub, _ = build_subproblem(problem, module.tasks, module.input_task, k, l, allowed, args.batch)
        if not sub.supported.any(axis=1).all():
            continue
        offset = 1 if module.input_task is not None else 0
        heft = run_baseline("heft", sub)
        dev = {n: d for d, n in enumerate(sub.device_names)}
        start = [dev[heft.assignment[t.name]] for t in sub.graph.tasks]
        moved = improve_by_moves(sub, start, max(2, LOCAL_SEARCH_WORK // sub.num_tasks))
        moves_s = min(heft.objective_s, _list_scheduled(sub, moved)[0])
        t0 = time.perf_counter()
        found = intensify_subproblem(problem, module, k, l, allowed, args.batch, tuple(moved[offset:]), options)
        ils_time = time.perf_counter() - t0
        ils_s = min(moves_s, found.cost_s if found is not None else moves_s)
        t0 = time.perf_counter()
        milp = solve_milp(sub, SolveOptions(solver="milp", time_limit_s=args.time_limit, verify=False))
        milp_time = time.perf_counter() - t0
        bound = lower_bound(sub)
        best_plan = min(ils_s, milp.objective_s)
        best_bound = max(bound, milp.lower_bound_s)
        rows.append(
            {
                "model": args.model,
                "cluster": args.cluster,
                "batch": args.batch,
                "module": j,
                "tasks": len(module.tasks),
                "edges": sub.num_edges,
                "input_device": "" if k is None else problem.devices[k].name,
                "output_device": problem.devices[l].name,
                "heft_ms": heft.objective_s * 1e3,
                "moves_ms": moves_s * 1e3,
                "ils_ms": ils_s * 1e3,
                "ils_s": ils_time,
                "milp_ms": milp.objective_s * 1e3,
                "milp_bound_ms": milp.lower_bound_s * 1e3,
                "milp_status": milp.solver.status,
                "milp_s": milp_time,
                "split_bound_ms": bound * 1e3,
                "gap": best_plan / best_bound - 1,
            }
        )
        print(
            f"output {problem.devices[l].name}: heft {rows[-1]['heft_ms']:.4f} ms, ils {rows[-1]['ils_ms']:.4f} ms, "
            f"milp {rows[-1]['milp_ms']:.4f} ms (bound {rows[-1]['milp_bound_ms']:.4f}, {milp.solver.status}), "
            f"split bound {rows[-1]['split_bound_ms']:.4f} ms",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "bench_module_gap.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    table = Table(
        title=f"{args.model} on {args.cluster}, batch {args.batch}: module {j} ({len(module.tasks)} tasks), "
        f"input on {rows[0]['input_device'] or '(none)'}"
        if rows
        else "no output device can run the module"
    )
    head = [
        "output",
        "HEFT",
        "+moves",
        "ILS",
        "ILS s",
        "MILP",
        "MILP bound",
        "MILP status",
        "MILP s",
        "split bound",
        "gap",
    ]
    for h in head:
        table.add_column(h, justify="left" if h in ("output", "MILP status") else "right")
    for r in rows:
        table.add_row(
            r["output_device"],
            f"{r['heft_ms']:.4f}",
            f"{r['moves_ms']:.4f}",
            f"{r['ils_ms']:.4f}",
            f"{r['ils_s']:.1f}",
            f"{r['milp_ms']:.4f}",
            f"{r['milp_bound_ms']:.4f}",
            r["milp_status"],
            f"{r['milp_s']:.1f}",
            f"{r['split_bound_ms']:.4f}",
            f"{r['gap']:.1%}",
        )
    Console(width=200).print(table)
    print(
        "gap: the best plan (ILS or MILP) over the best bound (split or MILP) - 1. "
        f"wrote {out / 'bench_module_gap.csv'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
