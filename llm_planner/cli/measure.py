"""CLI command handlers that run or measure things: launch, measure, profile (calibrate: cli/calibrate.py)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llm_planner.cli.commands import UserError, model_spec, progress
from llm_planner.cli.launch_serving import check_report_path, refuse_serving_flags
from llm_planner.core.atomic import check_writable
from llm_planner.core.fmt import LiteralConsole, fmt_s, styled
from llm_planner.cost.profile import ProfileError, save_profile
from llm_planner.launch import plan_launch as launch
from llm_planner.launch import profile_run
from llm_planner.launch.launch_text import describe_result
from llm_planner.launch.launch_types import LaunchError
from llm_planner.launch.profile_run import ProfileJob, planned_runs, profile_local, run_mpi
from llm_planner.measure.compare import measure_files, measurement_tables, write_measurement
from llm_planner.runtime.profile_rank import ProfileOptions, ProfileRunError


def cmd_launch(args: argparse.Namespace, console: Console) -> int:
    refuse_serving_flags(args)  # a serving plan has its own handler (llm_planner.cli.launch_serving)
    try:
        prompts = [[int(tok) for tok in p.split(",") if tok.strip()] for p in args.prompt_ids]
    except ValueError:
        raise UserError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids}", exit_code=2) from None
    if args.measure and args.dry_run:
        raise UserError("--measure compares a run with its plan; it cannot be used with --dry-run", exit_code=2)
    check_report_path(args)
    started = time.perf_counter()
    try:
        result = launch.launch_plan(
            args.plan,
            dry_run=args.dry_run,
            checkpoint=args.checkpoint,
            prompt_ids=prompts,
            max_new_tokens=args.max_new_tokens,
            dtype=args.dtype,
            seed=args.seed,
            report_path=args.report,
            timeout_s=args.timeout,
            workdir=args.workdir,
            warmup=args.warmup if args.warmup is not None else (launch.MEASURE_WARMUP if args.measure else 0),
        )
    except LaunchError as exc:
        raise UserError(str(exc), exit_code=exc.exit_code) from None
    console.print(describe_result(result))
    if result.ok and not args.dry_run:
        console.print(
            styled(
                "run report written to ",
                (str(result.report_path), "bold"),
                f" in {fmt_s(time.perf_counter() - started)}",
            )
        )
        if args.measure:
            _print_measurement(console, args.plan, result.report_path, Path(result.workdir) / "measure.json", rows=20)
    return 0 if result.ok else 1


def _print_measurement(console: Console, plan_path: str, report_path: str, output: Path, *, rows: int) -> None:

    measurement = measure_files(plan_path, report_path)
    for table in measurement_tables(measurement, max_task_rows=rows):
        console.print(table)
    write_measurement(measurement, output)
    console.print(styled("measurement written to ", (str(output), "bold")))


def cmd_measure(args: argparse.Namespace, console: Console) -> int:
    output = Path(args.output) if args.output else Path(args.report).parent / "measure.json"
    _print_measurement(console, args.plan, args.report, output, rows=args.rows)
    return 0


def _profile_job(args: argparse.Namespace):

    if args.graph is not None:
        raise UserError(
            "profile times a model's tasks: give --model (a graph file holds no weights to run)", exit_code=2
        )
    if args.cluster is None:
        raise UserError("profile needs --cluster: it runs the model's tasks on the cluster's devices", exit_code=2)
    try:
        sizes = tuple(int(b) for b in args.batch_sizes.split(",") if b.strip())
        options = ProfileOptions(
            batch_sizes=sizes,
            repetitions=args.repetitions,
            warmup=args.warmup,
            threads=args.threads,
            max_blocks=args.max_blocks,
            seed=args.seed,
        ).check()
    except ValueError as exc:
        message = (
            str(exc)
            if isinstance(exc, ProfileRunError)
            else f"--batch-sizes {args.batch_sizes!r}: expected comma-separated integers"
        )
        raise UserError(f"bad option: {message}", exit_code=2) from None
    model = model_spec(args).check()
    return ProfileJob(
        cluster_path=args.cluster, model=model.to_dict(), output_path=args.output, options=options, node=args.node
    )


def _under_mpi() -> bool:
    """Started by mpiexec/mpirun with more than one rank (mpich sets PMI_SIZE, Open MPI OMPI_COMM_WORLD_SIZE)."""

    return any(int(os.environ.get(v, "1") or 1) > 1 for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))


def cmd_profile(args: argparse.Namespace, console: Console) -> int:
    if args.workdir is not None and not args.mpi:
        raise UserError(
            "--workdir applies to --mpi runs (their hostfile and job file); this run has no --mpi", exit_code=2
        )
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
        save_profile(profile, args.output)
    console.print(styled("profile written to ", (str(args.output), "bold")))
    return 0


def _profile_as_rank(job):
    from mpi4py import MPI

    try:
        return run_mpi(job)
    except BaseException as exc:  # one rank failing must stop them all, never leave the others waiting
        err = LiteralConsole(stderr=True)
        err.print(styled(("error", "bold red"), f" on rank {MPI.COMM_WORLD.Get_rank()}: {type(exc).__name__}: {exc}"))
        MPI.COMM_WORLD.Abort(2)
        raise


def _profile_locally(job, console: Console):

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("building the model...", total=planned_runs(job))
        profile, skipped = profile_local(job, lambda what, n: bar.update(task, advance=n, description=f"timing {what}"))
    for name in skipped:
        console.print(styled(("not profiled", "yellow"), f": {name} (a GPU, and CUDA is not available here)"))
    return profile


def profile_tables(profile) -> list[Table]:
    tables = []
    for kind, entries in profile.tasks.items():
        table = Table(title=f"profile: {kind} ({', '.join(profile.devices.get(kind, []))})")
        for col in (
            "task key",
            "task",
            "fixed",
            "per sample",
            *(f"b={b}" for b in profile.settings.get("batch_sizes", [])),
        ):
            table.add_column(col, justify="left" if col in ("task key", "task") else "right")
        for key, t in entries.items():
            table.add_row(key, t.task, fmt_s(t.fixed_s), fmt_s(t.per_sample_s), *(fmt_s(m) for m in t.median_s))
        tables.append(table)
    if profile.links:
        table = Table(title="profile: links (ping-pong, one-way)")
        for col in ("link class", "between", "latency", "bandwidth"):
            table.add_column(col, justify="left" if col in ("link class", "between") else "right")
        for name, link in profile.links.items():
            table.add_row(
                name, " - ".join(link.devices), fmt_s(link.latency_s), f"{link.bw_bytes_per_s / 1e9:.3g} GB/s"
            )
        tables.append(table)
    return tables
