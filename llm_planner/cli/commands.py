"""CLI command handlers: each turns parsed arguments into calls and rich output."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llm_planner.core.atomic import WriteError, check_not_an_input, check_writable, write_atomic
from llm_planner.core.fmt import fmt_s, fmt_time, has_file_units, significant, styled, time_unit
from llm_planner.core.plan import PlanError, load_plan, save_plan
from llm_planner.core.precision import DEFAULT_DTYPE
from llm_planner.core.procs import last_stop_signal
from llm_planner.core.spec import load_cluster
from llm_planner.core.timing import Stopwatch, fmt_elapsed, timing_text
from llm_planner.cost.measured import profile_coverage
from llm_planner.cost.profile import load_profile
from llm_planner.export.placement import ExportError, export_plan
from llm_planner.graph.models import ModelSpec, list_models
from llm_planner.placement import solve as api
from llm_planner.placement import study
from llm_planner.placement.errors import SolveInterrupted
from llm_planner.placement.inputs import problem_from_inputs, problem_from_plan_inputs
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.session import SolveSession
from llm_planner.placement.verify_file import verify_plan_file
from llm_planner.placement.views import cluster_tables, device_table, steady_state_text, write_gantt


class UserError(Exception):
    """A failure to report to the user with an exit code (no traceback)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def refuse_rejected(path, violations: list[str], nothing: str) -> None:
    """UserError (exit 2) listing the violations `verify` finds in the plan at `path`, when it finds any:
    what export writes is what `llm-planner verify` accepts (launch: plan_launch.check_verified).
    `nothing` says what was not done."""
    if violations:
        lines = "".join(f"\n  - {v}" for v in violations)
        raise UserError(
            f"{path}: `llm-planner verify` rejects this plan ({len(violations)} violation(s)); {nothing}:{lines}",
            exit_code=2,
        )


@contextlib.contextmanager
def progress(console: Console, message: str):
    """A spinner while work runs (rich hides it when output is not a terminal)."""
    with console.status(message, spinner="dots"):
        yield


def model_spec(args: argparse.Namespace):

    if args.model is None:
        return None
    return ModelSpec(
        name=args.model,
        phase=args.phase,
        seq_len=args.seq_len,
        granularity=args.granularity,
        dtype=args.dtype or DEFAULT_DTYPE,
        seed=args.seed,
    )


def _solve_options(args: argparse.Namespace, solver: str | None = None):

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

    watch = Stopwatch()  # the whole command and its parts, printed at the end
    options = _solve_options(args)
    _check_outputs(args)  # before a solve of minutes, not after
    with progress(console, "building the task graph and costs..."), watch.part("reading_inputs"):
        problem = problem_from_inputs(
            cluster_path=args.cluster,
            model=model_spec(args),
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
    console.print(problem_line(problem))
    session = SolveSession(problem, options)  # the baselines and bound, once for the solver and the table
    with watch.part("solving"):
        plan = _solve(session, console)
    interrupted = plan.solver.status == "interrupted"
    with watch.part("writing"):
        save_plan(plan, args.output)
    with watch.part("baselines_for_the_table"):
        rows = {} if args.no_baselines or interrupted else session.baselines
    units = has_file_units(problem.graph)
    console.print(plan_summary_table(plan, rows, file_units=units))
    if interrupted:
        console.print(
            styled(
                ("interrupted", "yellow"),
                f": the best plan found so far, {fmt_time(plan.objective_s, units)}, within "
                f"{plan.gap:.2%} of the bound {fmt_time(plan.lower_bound_s, units)}",
            )
        )
    console.print(styled("plan written to ", (str(args.output), "bold")))
    if args.export:
        with watch.part("writing"):
            _export(plan, problem, args, console)
    console.print(_command_timing(watch, session), highlight=False)
    return 130 if interrupted else 0  # a script sees the Ctrl-C (the plan is written and valid)


def _command_timing(watch: Stopwatch, session: SolveSession) -> str:
    """The command's time, its parts, and what the baselines and the lower bound took in all
    (inside the solve where the solver needed them, beside the search for split-tp's bound)."""
    done = session.timings_s
    return (
        f"the command {timing_text(watch.total(), watch.parts)}; within these, the baselines took "
        f"{fmt_elapsed(done['baselines'])} in all and the lower bound {fmt_elapsed(done['lower_bound'])}"
    )


def _check_outputs(args: argparse.Namespace) -> None:
    """Exit 2 naming the path when the plan (or --export) file cannot be written."""

    if args.export_file and not args.export:
        raise UserError("--export-file says where --export writes: give --export vllm or megatron too", exit_code=2)
    check_writable(args.output, PlanError)
    inputs = {"--cluster": args.cluster, "--graph": args.graph, "--profile": getattr(args, "profile", None)}
    check_not_an_input(args.output, inputs, PlanError)
    if args.export:
        check_writable(_export_path(args), PlanError)
        check_not_an_input(_export_path(args), {**inputs, "plan (-o)": args.output}, PlanError)
        if os.path.realpath(_export_path(args)) == os.path.realpath(args.output):
            raise PlanError(f"--export-file {_export_path(args)}: is the plan's own path (-o); name another file")


def _solve(session, console: Console):
    """The solver's plan for the session's problem; Ctrl-C before it has one: exit 130, no plan written."""

    solver = session.options.solver
    try:
        with progress(console, f"solving with {solver}... (Ctrl-C stops it and writes the best plan found)"):
            return api.solve(session.problem, session.options, session)
    except (SolveInterrupted, KeyboardInterrupt) as exc:
        why = str(exc) or f"interrupted ({last_stop_signal()}) before the solver found a plan"
        raise UserError(f"{why}: no plan written", exit_code=130) from None
    except api.SolveError as exc:
        raise UserError(str(exc)) from None


def _export_path(args: argparse.Namespace) -> Path:
    return Path(args.export_file or Path(args.output).with_suffix(f".{args.export}.json"))


def _export(plan, problem, args: argparse.Namespace, console: Console) -> None:
    """Write the plan as a framework's parallel configuration (llm_planner.export.placement)."""

    with progress(console, "verifying the plan before exporting it..."):
        report = verify_plan_file(args.output)
    refuse_rejected(args.output, report.violations, f"no {args.export} configuration written")
    layer_of = {t.name: t.label("layer") for t in problem.graph.tasks}
    try:
        cpus = frozenset(d.name for d in problem.devices if problem.cluster.kind(d.kind).type == "cpu")
        config = export_plan(plan, args.export, problem.graph.topological_order(), layer_of, cpus)
    except ExportError as exc:
        raise UserError(
            f"--export {args.export}: the plan has no {args.export} form: {exc}; the plan itself is written to "
            f"{args.output}, no {args.export} configuration",
            exit_code=2,
        ) from None
    path = _export_path(args)
    write_atomic(path, json.dumps(config, indent=1) + "\n", PlanError)
    console.print(styled(f"{args.export} configuration written to ", (str(path), "bold")))


def problem_line(problem):
    """The header of `plan` and `show`: the model (for a decoder its phase, context and dtype), the
    cluster, the objective and the batch."""
    return styled(
        (problem.graph.name, "bold"),
        f"{_decoder_note(problem.graph)}: {problem.num_tasks} tasks, {problem.num_edges} edges on ",
        (problem.cluster.name, "bold"),
        f": {problem.num_physical} devices{_groups_note(problem)}; "
        f"objective {problem.objective}, batch {problem.batch_size}",
    )


def _decoder_note(graph) -> str:
    """What a decoder's costs are for: " (decode step, context 2,048 tokens, fp16)"; "" for other graphs."""
    meta = graph.meta_dict()
    if "decoder_config" not in meta:
        return ""
    tokens = "prompt" if meta["phase"] == "prefill" else "context"
    phase = "prefill" if meta["phase"] == "prefill" else "decode step"
    return f" ({phase}, {tokens} {meta['seq_len']:,} tokens, {meta['dtype']})"


def _groups_note(problem) -> str:
    groups = problem.num_devices - problem.num_physical
    return f" and {groups} tensor-parallel groups (up to {problem.max_tp})" if groups else ""


def plan_summary_table(plan, baseline_plans: dict, file_units: bool = False) -> Table:
    """The plan's row and the baselines'. Objectives and the bound are in one unit, which the column
    heads name (the largest the plan's objective fills: "objective (ms)" over 504.5); `file_units`: a
    workload file's times, which state no unit, as plain numbers."""
    unit, scale = ("file units", 1.0) if file_units else time_unit(plan.objective_s)
    unit += "/sample" if plan.objective == "throughput" else ""
    table = Table(title=f"plan ({plan.objective})" + (": times in the workload file's own unit" if file_units else ""))
    rate = "samples per file unit" if file_units else "samples/s"
    heads = ("planner", f"objective ({unit})", rate, f"lower bound ({unit})", "gap", "status", "solve time")
    for col in (*heads, "devices used"):
        table.add_column(col, justify="right" if col != "planner" else "left")
    table.add_row(
        plan.solver.name,
        significant(plan.objective_s / scale, 4),
        significant(plan.throughput_samples_per_s, 4),
        significant(plan.lower_bound_s / scale, 4),
        f"{plan.gap:.2%}",
        _status_text(plan),
        fmt_s(plan.solver.time_s),
        str(len(plan.physical_devices_used())),
    )
    for name, other in (baseline_plans or {}).items():
        if f"baseline:{name}" == plan.solver.name:
            continue  # the plan itself, in the first row
        if other is None:
            table.add_row(f"baseline:{name}", "infeasible (memory)", "-", "-", "-", "-", "-", "-")
            continue
        ratio = other.objective_s / plan.objective_s if plan.objective_s > 0 else float("nan")
        table.add_row(
            f"baseline:{name}",
            f"{significant(other.objective_s / scale, 4)} ({ratio:.2f}x)",
            significant(other.throughput_samples_per_s, 4),
            "",
            "",
            other.solver.status,
            fmt_s(other.solver.time_s),
            str(len(other.physical_devices_used())),
        )
    return table


def _status_text(plan) -> str:
    """The status verify re-derives, and the solver's own claim where it says more (a MILP's dual
    bound proves what the recomputable bound does not: kept in solver.details as a record)."""
    details = plan.solver.details
    if details.get("solver_status") == "optimal" and plan.solver.status != "optimal":
        bound = details.get("solver_bound_s")
        own = f", bound {fmt_s(bound)}" if isinstance(bound, (int, float)) else ""
        return f"{plan.solver.status} (solver: optimal{own})"
    return plan.solver.status


def cmd_verify(args: argparse.Namespace, console: Console) -> int:

    with progress(console, "rebuilding the problem and simulating..."):
        report = verify_plan_file(args.plan)
    if report.ok:
        console.print(
            styled(("valid", "green"), f": objective {fmt_s(report.simulated_objective_s)} matches the simulation")
        )
        return 0
    console.print(styled(("invalid plan", "red"), f" {args.plan}: {len(report.violations)} violation(s)"))
    for v in report.violations:
        console.print(f"  - {v}", highlight=False)
    return 1


def cmd_show(args: argparse.Namespace, console: Console) -> int:

    if args.gantt:
        check_writable(args.gantt)
    plan = load_plan(args.plan)
    problem = problem_from_plan_inputs(plan.inputs)
    console.print(problem_line(problem))
    console.print(plan_summary_table(plan, {}, file_units=has_file_units(problem.graph)))
    steady = steady_state_text(plan, has_file_units(problem.graph))
    if steady is not None:
        console.print(steady, highlight=False)
    console.print(device_table(plan, problem))
    if args.gantt:
        write_gantt(plan, args.gantt)
        console.print(styled("Gantt chart written to ", (str(args.gantt), "bold")))
    return 0


def cmd_models(args: argparse.Namespace, console: Console) -> int:

    table = Table(title="model presets")
    for col in ("name", "family", "description"):
        table.add_column(col)
    for name, family, desc in list_models():
        table.add_row(name, family, desc)
    console.print(table)
    console.print(
        "Also: any transformers config.json (or a directory holding one) as --model, or a graph file as --graph."
    )
    return 0


def cmd_show_cluster(args: argparse.Namespace, console: Console) -> int:

    cluster = load_cluster(args.cluster)
    for table in cluster_tables(cluster):
        console.print(table)
    return 0


def cmd_compare_symmetry(args: argparse.Namespace, console: Console) -> int:

    problem = problem_from_inputs(
        cluster_path=args.cluster,
        model=model_spec(args),
        graph_path=args.graph,
        objective=args.objective,
        batch_size=args.batch,
        max_shards=args.max_shards,
        profile_path=args.profile,
        max_tp=args.max_tp,
    )
    if args.profile:
        print_profile_coverage(console, problem, args.profile)
    out = _writable_dir(args.out_dir, ("symmetry.csv", "symmetry.png"))
    with console.status("solving...") as status:
        rows = study.compare_symmetry(
            problem,
            time_limit_s=args.time_limit,
            solvers=args.solvers,
            criteria=args.criteria,
            backend=args.solver_backend,
            progress=lambda msg: status.update(f"solving: {msg}"),
        )
    finite = [r.objective_s for r in rows if math.isfinite(r.objective_s)]
    unit, scale = time_unit(min(finite, default=1.0))
    unit += "/sample" if problem.objective == "throughput" else ""
    table = Table(
        title=(
            f"symmetry breaking: {problem.graph.name} on {problem.cluster.name}, "
            f"{problem.objective}, batch {problem.batch_size}"
        )
    )
    for col in (
        "criterion",
        "solver",
        f"objective ({unit})",
        f"lower bound ({unit})",
        "gap",
        "solve time",
        "status",
        "B&B nodes",
    ):
        table.add_column(col, justify="left" if col in ("criterion", "solver", "status") else "right")
    for r in rows:
        table.add_row(
            r.criterion,
            r.solver,
            _in_unit(r.objective_s, scale),
            _in_unit(r.lower_bound_s, scale),
            f"{r.gap:.2%}",
            fmt_s(r.time_s),
            r.status,
            "-" if r.nodes is None else str(r.nodes),
        )
    console.print(table)
    study.write_csv(rows, out / "symmetry.csv")
    study.write_bar_chart(rows, out / "symmetry.png", title=table.title)
    console.print(f"wrote {out / 'symmetry.csv'} and {out / 'symmetry.png'}")
    return 0


def _in_unit(seconds: float, scale: float) -> str:
    return significant(seconds / scale, 4) if math.isfinite(seconds) else str(seconds)


def _writable_dir(directory: str, names: tuple[str, ...]) -> Path:
    """`directory`, made if missing, where each of `names` can be written (WriteError, exit 2, if not)."""

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
    """Which task costs came from the profile and which fell back to the cost model (a task's roofline, a decoder
    layer's kernel sum; the same for links)."""

    coverage = profile_coverage(problem.graph, problem.cluster, load_profile(profile_path))
    total = len(coverage.profiled) + len(coverage.fallback)
    console.print(
        styled(
            "profile ",
            (str(profile_path), "bold"),
            f": measured costs for {len(coverage.profiled)} of {total} (task, device kind) pairs",
        ),
        highlight=False,
    )
    for kind, tasks in coverage.fallback_tasks().items():
        shown = ", ".join(tasks[:8]) + (f", ... ({len(tasks)} tasks)" if len(tasks) > 8 else "")
        console.print(f"  cost model on {kind} (not in the profile): {shown}", highlight=False)
    if coverage.links_profiled or coverage.links_fallback:
        console.print(
            f"  links measured: {', '.join(coverage.links_profiled) or 'none'}; from the cluster spec: "
            f"{', '.join(coverage.links_fallback) or 'none'}",
            highlight=False,
        )
