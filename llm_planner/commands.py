"""CLI command handlers: each turns parsed arguments into calls and rich output."""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llm_planner.fmt import fmt_s


class UserError(Exception):
    """A failure to report to the user with an exit code (no traceback)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def progress(console: Console, message: str):
    """A spinner while work runs (rich hides it when output is not a terminal)."""
    with console.status(message, spinner="dots"):
        yield


def _model_spec(args: argparse.Namespace):
    from llm_planner.graph.models import ModelSpec

    if args.model is None:
        return None
    return ModelSpec(name=args.model, phase=args.phase, seq_len=args.seq_len, granularity=args.granularity, dtype=args.dtype, seed=args.seed)


def _solve_options(args: argparse.Namespace, solver: str | None = None):
    from llm_planner.solve.options import SolveOptions

    try:
        return SolveOptions(
            solver=solver or args.solver,
            backend=args.solver_backend,
            allow_backend_fallback=args.allow_backend_fallback,
            time_limit_s=args.time_limit,
            rel_gap=args.gap,
            threads=args.threads,
            symmetry=args.symmetry,
            contiguous=args.contiguous,
            workers=args.workers,
        ).check()
    except ValueError as exc:
        raise UserError(f"bad option: {exc}", exit_code=2) from None


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from llm_planner.pipeline import problem_from_inputs
    from llm_planner.plan import save_plan
    from llm_planner.solve import api, baselines

    options = _solve_options(args)
    with progress(console, "building the task graph and costs..."):
        problem = problem_from_inputs(
            cluster_path=args.cluster,
            model=_model_spec(args),
            graph_path=args.graph,
            objective=args.objective,
            batch_size=args.batch,
            max_shards=args.max_shards,
            options={k: v for k, v in options.__dict__.items()},
        )
    console.print(
        f"[bold]{problem.graph.name}[/]: {problem.num_tasks} tasks, {problem.num_edges} edges on "
        f"[bold]{problem.cluster.name}[/]: {problem.num_devices} devices; objective {problem.objective}, batch {problem.batch_size}"
    )
    with progress(console, f"solving with {options.solver}..."):
        try:
            plan = api.solve(problem, options)
        except api.SolveError as exc:
            raise UserError(str(exc)) from None
    save_plan(plan, args.output)
    rows = [] if args.no_baselines else baselines.run_all_baselines(problem)
    console.print(plan_summary_table(plan, rows))
    console.print(f"plan written to [bold]{args.output}[/]")
    return 0


def plan_summary_table(plan, baseline_plans: dict) -> Table:
    unit = "s/sample" if plan.objective == "throughput" else "s"
    table = Table(title=f"plan ({plan.objective})")
    for col in ("planner", f"objective ({unit})", "samples/s", "lower bound", "gap", "status", "solve time", "devices used"):
        table.add_column(col, justify="right" if col != "planner" else "left")
    table.add_row(
        plan.solver.name, fmt_s(plan.objective_s), f"{plan.throughput_samples_per_s:.4g}", fmt_s(plan.lower_bound_s),
        f"{plan.gap:.2%}", plan.solver.status, fmt_s(plan.solver.time_s), str(len(plan.devices_used())),
    )
    for name, other in (baseline_plans or {}).items():
        if other is None:
            table.add_row(f"baseline:{name}", "infeasible (memory)", "-", "-", "-", "-", "-", "-")
            continue
        ratio = other.objective_s / plan.objective_s if plan.objective_s > 0 else float("nan")
        table.add_row(
            f"baseline:{name}", f"{fmt_s(other.objective_s)} ({ratio:.2f}x)", f"{other.throughput_samples_per_s:.4g}",
            "", "", other.solver.status, fmt_s(other.solver.time_s), str(len(other.devices_used())),
        )
    return table


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from llm_planner.verify import verify_plan_file

    with progress(console, "rebuilding the problem and simulating..."):
        report = verify_plan_file(args.plan)
    if report.ok:
        console.print(f"[green]valid[/]: objective {fmt_s(report.simulated_objective_s)} matches the simulation")
        return 0
    console.print(f"[red]invalid plan[/] {args.plan}: {len(report.violations)} violation(s)")
    for v in report.violations:
        console.print(f"  - {v}", highlight=False)
    return 1


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    from llm_planner.pipeline import problem_from_plan_inputs
    from llm_planner.plan import load_plan
    from llm_planner.report import device_table, write_gantt

    plan = load_plan(args.plan)
    problem = problem_from_plan_inputs(plan.inputs)
    console.print(plan_summary_table(plan, {}))
    console.print(device_table(plan, problem))
    if args.gantt:
        write_gantt(plan, args.gantt)
        console.print(f"Gantt chart written to [bold]{args.gantt}[/]")
    return 0


def cmd_models(args: argparse.Namespace, console: Console) -> int:
    from llm_planner.graph.models import list_models

    table = Table(title="model presets")
    for col in ("name", "family", "description"):
        table.add_column(col)
    for name, family, desc in list_models():
        table.add_row(name, family, desc)
    console.print(table)
    console.print("Also: any transformers config.json (or a directory holding one) as --model, or a graph file as --graph.")
    return 0


def cmd_show_cluster(args: argparse.Namespace, console: Console) -> int:
    from llm_planner.report import cluster_tables
    from llm_planner.spec import load_cluster

    cluster = load_cluster(args.cluster)
    for table in cluster_tables(cluster):
        console.print(table)
    return 0


def cmd_launch(args: argparse.Namespace, console: Console) -> int:
    from llm_planner import launch

    try:
        prompts = [[int(tok) for tok in p.split(",") if tok.strip()] for p in args.prompt_ids]
    except ValueError:
        raise UserError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids}", exit_code=2) from None
    started = time.perf_counter()
    try:
        result = launch.launch_plan(
            args.plan,
            dry_run=args.dry_run,
            checkpoint=args.checkpoint,
            prompt_ids=prompts,
            max_new_tokens=args.max_new_tokens,
            micro_batches=args.micro_batches,
            dtype=args.dtype,
            report_path=args.report,
            timeout_s=args.timeout,
            workdir=args.workdir,
        )
    except launch.LaunchError as exc:
        raise UserError(str(exc), exit_code=exc.exit_code) from None
    console.print(launch.describe_result(result))
    if result.ok and not args.dry_run:
        console.print(f"run report written to [bold]{result.report_path}[/] in {fmt_s(time.perf_counter() - started)}")
    return 0 if result.ok else 1


def cmd_compare_symmetry(args: argparse.Namespace, console: Console) -> int:
    from llm_planner import study
    from llm_planner.pipeline import problem_from_inputs

    problem = problem_from_inputs(
        cluster_path=args.cluster, model=_model_spec(args), graph_path=args.graph,
        objective=args.objective, batch_size=args.batch, max_shards=args.max_shards,
    )
    solvers = tuple(s.strip() for s in args.solvers.split(",") if s.strip())
    with console.status("solving...") as status:
        rows = study.compare_symmetry(problem, time_limit_s=args.time_limit, solvers=solvers, backend=args.solver_backend,
                                      progress=lambda msg: status.update(f"solving: {msg}"))
    unit = "s/sample" if problem.objective == "throughput" else "s"
    table = Table(title=f"symmetry breaking: {problem.graph.name} on {problem.cluster.name}, {problem.objective}, batch {problem.batch_size}")
    for col in ("criterion", "solver", f"objective ({unit})", "lower bound", "gap", "solve time", "status", "B&B nodes"):
        table.add_column(col, justify="left" if col in ("criterion", "solver", "status") else "right")
    for r in rows:
        table.add_row(r.criterion, r.solver, fmt_s(r.objective_s), fmt_s(r.lower_bound_s), f"{r.gap:.2%}", fmt_s(r.time_s), r.status,
                      "-" if r.nodes is None else str(r.nodes))
    console.print(table)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    study.write_csv(rows, out / "symmetry.csv")
    study.write_bar_chart(rows, out / "symmetry.png", title=table.title)
    console.print(f"wrote {out / 'symmetry.csv'} and {out / 'symmetry.png'}")
    return 0
