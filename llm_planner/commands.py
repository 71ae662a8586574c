"""CLI command handlers: each turns parsed arguments into calls and rich output."""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llm_planner.fmt import fmt_s, fmt_time, has_file_units


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
    from llm_planner.solve.baselines import baseline_set

    options = _solve_options(args)
    _check_outputs(args)  # before a solve of minutes, not after
    with progress(console, "building the task graph and costs..."):
        problem = problem_from_inputs(
            cluster_path=args.cluster,
            model=_model_spec(args),
            graph_path=args.graph,
            objective=args.objective,
            batch_size=args.batch,
            max_shards=args.max_shards,
            options={k: v for k, v in options.__dict__.items()},
            profile_path=args.profile,
            max_tp=args.max_tp,
        )
    if args.profile:
        print_profile_coverage(console, problem, args.profile)
    console.print(
        f"[bold]{problem.graph.name}[/]: {problem.num_tasks} tasks, {problem.num_edges} edges on "
        f"[bold]{problem.cluster.name}[/]: {problem.num_physical} devices{_groups_note(problem)}; objective {problem.objective}, batch {problem.batch_size}"
    )
    plan = _solve(problem, options, console)
    save_plan(plan, args.output)
    interrupted = plan.solver.status == "interrupted"
    rows = [] if args.no_baselines or interrupted else baseline_set.all_baselines(problem)
    units = has_file_units(problem.graph)
    console.print(plan_summary_table(plan, rows, file_units=units))
    if interrupted:
        console.print(f"[yellow]interrupted[/]: the best plan found so far, {fmt_time(plan.objective_s, units)}, within "
                      f"{plan.gap:.2%} of the bound {fmt_time(plan.lower_bound_s, units)}")
    console.print(f"plan written to [bold]{args.output}[/]")
    if args.export:
        _export(plan, problem, args, console)
    return 130 if interrupted else 0  # a script sees the Ctrl-C (the plan is written and valid)


def _check_outputs(args: argparse.Namespace) -> None:
    """Exit 2 naming the path when the plan (or --export) file cannot be written."""
    from llm_planner.atomic import check_writable
    from llm_planner.plan import PlanError

    check_writable(args.output, PlanError)
    if args.export:
        check_writable(_export_path(args), PlanError)


def _solve(problem, options, console: Console):
    """The solver's plan; Ctrl-C before it has one: exit 130, no plan written."""
    from llm_planner.solve import api
    from llm_planner.solve.errors import SolveInterrupted

    try:
        with progress(console, f"solving with {options.solver}... (Ctrl-C stops it and writes the best plan found)"):
            return api.solve(problem, options)
    except (SolveInterrupted, KeyboardInterrupt) as exc:
        why = str(exc) or "interrupted before the solver found a plan"
        raise UserError(f"{why}: no plan written", exit_code=130) from None
    except api.SolveError as exc:
        raise UserError(str(exc)) from None


def _export_path(args: argparse.Namespace) -> Path:
    return Path(args.export_file or Path(args.output).with_suffix(f".{args.export}.json"))


def _export(plan, problem, args: argparse.Namespace, console: Console) -> None:
    """Write the plan as a framework's parallel configuration (llm_planner.export)."""
    import json

    from llm_planner.atomic import write_atomic
    from llm_planner.export import ExportError, export_plan
    from llm_planner.plan import PlanError

    layer_of = {t.name: t.label("layer") for t in problem.graph.tasks}
    try:
        config = export_plan(plan, args.export, problem.graph.topological_order(), layer_of)
    except ExportError as exc:
        raise UserError(f"--export {args.export}: the plan has no {args.export} form: {exc}", exit_code=2) from None
    path = _export_path(args)
    write_atomic(path, json.dumps(config, indent=1) + "\n", PlanError)
    console.print(f"{args.export} configuration written to [bold]{path}[/]")


def _groups_note(problem) -> str:
    groups = problem.num_devices - problem.num_physical
    return f" and {groups} tensor-parallel groups (up to {problem.max_tp})" if groups else ""


def plan_summary_table(plan, baseline_plans: dict, file_units: bool = False) -> Table:
    """The plan's row and the baselines'. `file_units`: a workload file's times, which state no unit, as plain numbers."""
    unit = "file units" if file_units else "s"
    unit += "/sample" if plan.objective == "throughput" else ""
    table = Table(title=f"plan ({plan.objective})" + (": times in the workload file's own unit" if file_units else ""))
    rate = "samples per file unit" if file_units else "samples/s"
    for col in ("planner", f"objective ({unit})", rate, "lower bound", "gap", "status", "solve time", "devices used"):
        table.add_column(col, justify="right" if col != "planner" else "left")
    table.add_row(
        plan.solver.name, fmt_time(plan.objective_s, file_units), f"{plan.throughput_samples_per_s:.4g}", fmt_time(plan.lower_bound_s, file_units),
        f"{plan.gap:.2%}", plan.solver.status, fmt_s(plan.solver.time_s), str(len(plan.physical_devices_used())),
    )
    for name, other in (baseline_plans or {}).items():
        if f"baseline:{name}" == plan.solver.name:
            continue  # the plan itself, in the first row
        if other is None:
            table.add_row(f"baseline:{name}", "infeasible (memory)", "-", "-", "-", "-", "-", "-")
            continue
        ratio = other.objective_s / plan.objective_s if plan.objective_s > 0 else float("nan")
        table.add_row(
            f"baseline:{name}", f"{fmt_time(other.objective_s, file_units)} ({ratio:.2f}x)", f"{other.throughput_samples_per_s:.4g}",
            "", "", other.solver.status, fmt_s(other.solver.time_s), str(len(other.physical_devices_used())),
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
    console.print(plan_summary_table(plan, {}, file_units=has_file_units(problem.graph)))
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
    if args.measure and args.dry_run:
        raise UserError("--measure compares a run with its plan; it cannot be used with --dry-run", exit_code=2)
    started = time.perf_counter()
    try:
        result = launch.launch_plan(
            args.plan,
            dry_run=args.dry_run,
            checkpoint=args.checkpoint,
            prompt_ids=prompts,
            max_new_tokens=args.max_new_tokens,
            dtype=args.dtype,
            report_path=args.report,
            timeout_s=args.timeout,
            workdir=args.workdir,
            warmup=args.warmup if args.warmup is not None else (launch.MEASURE_WARMUP if args.measure else 0),
        )
    except launch.LaunchError as exc:
        raise UserError(str(exc), exit_code=exc.exit_code) from None
    console.print(launch.describe_result(result))
    if result.ok and not args.dry_run:
        console.print(f"run report written to [bold]{result.report_path}[/] in {fmt_s(time.perf_counter() - started)}")
        if args.measure:
            _print_measurement(console, args.plan, result.report_path, Path(result.workdir) / "measure.json", rows=20)
    return 0 if result.ok else 1


def _print_measurement(console: Console, plan_path: str, report_path: str, output: Path, *, rows: int) -> None:
    from llm_planner.measure import measure_files, measurement_tables, write_measurement

    measurement = measure_files(plan_path, report_path)
    for table in measurement_tables(measurement, max_task_rows=rows):
        console.print(table)
    write_measurement(measurement, output)
    console.print(f"measurement written to [bold]{output}[/]")


def cmd_measure(args: argparse.Namespace, console: Console) -> int:
    output = Path(args.output) if args.output else Path(args.report).parent / "measure.json"
    _print_measurement(console, args.plan, args.report, output, rows=args.rows)
    return 0


def _fmt_field(name: str, value: float) -> str:
    if name.endswith("_bytes_per_s"):
        return f"{value / 1e9:.4g} GB/s"
    return fmt_s(value) if name.endswith("_s") else f"{value:.4g}"


def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    from llm_planner.atomic import check_writable
    from llm_planner.calibrate import CalibrateError, calibrate_files

    check_writable(args.output, CalibrateError)
    result = calibrate_files(args.cluster, args.plan, args.report, args.output)
    table = Table(title=f"calibration of {args.cluster}")
    for col in ("kind / link", "field", "spec", "fitted", "observations", "rel. RMS before", "after", "note"):
        table.add_column(col, justify="left" if col in ("kind / link", "field", "note") else "right")
    for fit in (*result.kinds, *result.links):
        for name, before in fit.before.items():
            value = fit.values[name]
            table.add_row(fit.name, name, _fmt_field(name, before), _fmt_field(name, value) if name in fit.fitted else "(kept)", str(fit.samples),
                          f"{fit.rel_rms_before:.1%}", f"{fit.rel_rms_after:.1%}", fit.kept.get(name, ""))
    console.print(table)
    console.print(f"corrected spec written to [bold]{args.output}[/]")
    return 0


def cmd_compare_symmetry(args: argparse.Namespace, console: Console) -> int:
    from llm_planner import study
    from llm_planner.pipeline import problem_from_inputs
    from llm_planner.solve.options import SYMMETRY_CHOICES

    problem = problem_from_inputs(
        cluster_path=args.cluster, model=_model_spec(args), graph_path=args.graph,
        objective=args.objective, batch_size=args.batch, max_shards=args.max_shards, profile_path=args.profile, max_tp=args.max_tp,
    )
    if args.profile:
        print_profile_coverage(console, problem, args.profile)
    solvers = tuple(s.strip() for s in args.solvers.split(",") if s.strip())
    criteria = tuple(c.strip() for c in args.criteria.split(",") if c.strip())
    unknown = sorted(set(criteria) - set(SYMMETRY_CHOICES)) or (["(none given)"] if not criteria else [])
    if unknown:
        raise UserError(f"--criteria: unknown criterion {', '.join(unknown)}; choose from {', '.join(SYMMETRY_CHOICES)}", exit_code=2)
    out = _writable_dir(args.out_dir, ("symmetry.csv", "symmetry.png"))
    with console.status("solving...") as status:
        rows = study.compare_symmetry(problem, time_limit_s=args.time_limit, solvers=solvers, criteria=criteria, backend=args.solver_backend,
                                      progress=lambda msg: status.update(f"solving: {msg}"))
    unit = "s/sample" if problem.objective == "throughput" else "s"
    table = Table(title=f"symmetry breaking: {problem.graph.name} on {problem.cluster.name}, {problem.objective}, batch {problem.batch_size}")
    for col in ("criterion", "solver", f"objective ({unit})", "lower bound", "gap", "solve time", "status", "B&B nodes"):
        table.add_column(col, justify="left" if col in ("criterion", "solver", "status") else "right")
    for r in rows:
        table.add_row(r.criterion, r.solver, fmt_s(r.objective_s), fmt_s(r.lower_bound_s), f"{r.gap:.2%}", fmt_s(r.time_s), r.status,
                      "-" if r.nodes is None else str(r.nodes))
    console.print(table)
    study.write_csv(rows, out / "symmetry.csv")
    study.write_bar_chart(rows, out / "symmetry.png", title=table.title)
    console.print(f"wrote {out / 'symmetry.csv'} and {out / 'symmetry.png'}")
    return 0


def _writable_dir(directory: str, names: tuple[str, ...]) -> Path:
    """`directory`, made if missing, where each of `names` can be written (WriteError, exit 2, if not)."""
    from llm_planner.atomic import WriteError, check_writable

    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"{out}: cannot make the directory: {exc.strerror or exc}") from None
    for name in names:
        check_writable(out / name)
    return out


# ----------------------------------------------------------------------------
# profile


def print_profile_coverage(console: Console, problem, profile_path: str) -> None:
    """Which task costs came from the profile and which fell back to the roofline (and the same for links)."""
    from llm_planner.profile import load_profile
    from llm_planner.profile_apply import profile_coverage

    coverage = profile_coverage(problem.graph, problem.cluster, load_profile(profile_path))
    total = len(coverage.profiled) + len(coverage.fallback)
    console.print(f"profile [bold]{profile_path}[/]: measured costs for {len(coverage.profiled)} of {total} (task, device kind) pairs", highlight=False)
    for kind, tasks in coverage.fallback_tasks().items():
        shown = ", ".join(tasks[:8]) + (f", ... ({len(tasks)} tasks)" if len(tasks) > 8 else "")
        console.print(f"  roofline on {kind} (not in the profile): {shown}", highlight=False)
    if coverage.links_profiled or coverage.links_fallback:
        console.print(f"  links measured: {', '.join(coverage.links_profiled) or 'none'}; from the cluster spec: "
                      f"{', '.join(coverage.links_fallback) or 'none'}", highlight=False)


def _profile_job(args: argparse.Namespace):
    from llm_planner.runtime.profile_rank import ProfileOptions, ProfileRunError
    from llm_planner.runtime.profile_run import ProfileJob

    if args.graph is not None or args.cluster is None:
        raise UserError("profile needs --model and --cluster: it runs the model's tasks on the cluster's devices", exit_code=2)
    try:
        sizes = tuple(int(b) for b in args.batch_sizes.split(",") if b.strip())
        options = ProfileOptions(batch_sizes=sizes, repetitions=args.repetitions, warmup=args.warmup, threads=args.threads,
                                 max_blocks=args.max_blocks, seed=args.seed).check()
    except ValueError as exc:
        message = str(exc) if isinstance(exc, ProfileRunError) else f"--batch-sizes {args.batch_sizes!r}: expected comma-separated integers"
        raise UserError(f"bad option: {message}", exit_code=2) from None
    model = _model_spec(args).check()
    return ProfileJob(cluster_path=args.cluster, model=model.to_dict(), output_path=args.output, options=options, node=args.node)


def _under_mpi() -> bool:
    """Started by mpiexec/mpirun with more than one rank (mpich sets PMI_SIZE, Open MPI OMPI_COMM_WORLD_SIZE)."""
    import os

    return any(int(os.environ.get(v, "1") or 1) > 1 for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))


def cmd_profile(args: argparse.Namespace, console: Console) -> int:
    from llm_planner.runtime import profile_run
    from llm_planner.runtime.profile_rank import ProfileRunError

    from llm_planner.atomic import check_writable
    from llm_planner.profile import ProfileError

    job = _profile_job(args)
    if not _under_mpi():
        check_writable(args.output, ProfileError)
    try:
        if _under_mpi():  # `mpirun -n R llm-planner profile ...`: this process is one rank
            profile = _profile_as_rank(job)
            if profile is None:
                return 0
        elif args.mpi:
            workdir = args.workdir or str(Path(args.output).with_suffix("").with_name(Path(args.output).stem + ".mpi"))
            with progress(console, "profiling on one MPI rank per device..."):
                profile = profile_run.spawn_mpi(job, workdir, args.timeout)
        else:
            profile = _profile_locally(job, console)
    except ProfileRunError as exc:
        raise UserError(str(exc), exit_code=2) from None
    for table in profile_tables(profile):
        console.print(table)
    if not args.mpi and not _under_mpi():
        from llm_planner.profile import save_profile

        save_profile(profile, args.output)
    console.print(f"profile written to [bold]{args.output}[/]")
    return 0


def _profile_as_rank(job):
    from mpi4py import MPI

    from llm_planner.runtime.profile_run import run_mpi

    try:
        return run_mpi(job)
    except BaseException as exc:  # one rank failing must stop them all, never leave the others waiting
        err = Console(stderr=True)
        err.print(f"[bold red]error[/] on rank {MPI.COMM_WORLD.Get_rank()}: {type(exc).__name__}: {exc}", highlight=False)
        MPI.COMM_WORLD.Abort(2)
        raise


def _profile_locally(job, console: Console):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from llm_planner.runtime.profile_run import planned_runs, profile_local

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("building the model...", total=planned_runs(job))
        profile, skipped = profile_local(job, lambda what, n: bar.update(task, advance=n, description=f"timing {what}"))
    for name in skipped:
        console.print(f"[yellow]not profiled[/]: {name} (a GPU, and CUDA is not available here)", highlight=False)
    return profile


def profile_tables(profile) -> list[Table]:
    tables = []
    for kind, entries in profile.tasks.items():
        table = Table(title=f"profile: {kind} ({', '.join(profile.devices.get(kind, []))})")
        for col in ("task key", "task", "fixed", "per sample", *(f"b={b}" for b in profile.settings.get("batch_sizes", []))):
            table.add_column(col, justify="left" if col in ("task key", "task") else "right")
        for key, t in entries.items():
            table.add_row(key, t.task, fmt_s(t.fixed_s), fmt_s(t.per_sample_s), *(fmt_s(m) for m in t.median_s))
        tables.append(table)
    if profile.links:
        table = Table(title="profile: links (ping-pong, one-way)")
        for col in ("link class", "between", "latency", "bandwidth"):
            table.add_column(col, justify="left" if col in ("link class", "between") else "right")
        for name, link in profile.links.items():
            table.add_row(name, " - ".join(link.devices), fmt_s(link.latency_s), f"{link.bw_bytes_per_s / 1e9:.3g} GB/s")
        tables.append(table)
    return tables
