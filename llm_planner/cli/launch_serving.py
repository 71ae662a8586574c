"""`llm-planner launch SERVING_PLAN`: serve a serving plan under mpiexec and print measured against
predicted per replica (llm_planner.launch.serve_launch, docs/serve-runtime.md)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llm_planner.cli.arg_types import positive_seconds, seed, tokens, whole
from llm_planner.cli.commands import UserError
from llm_planner.core.atomic import WriteError, check_not_an_input
from llm_planner.core.fileio import read_document
from llm_planner.core.fmt import fmt_s, styled
from llm_planner.core.plan_paths import resolve_from_plan
from llm_planner.graph.hf_config import config_file_of
from llm_planner.launch.launch_text import describe_result
from llm_planner.launch.launch_types import LaunchError
from llm_planner.launch.serve_launch import STALL_TIMEOUT_S, ServeOptions, launch_serving

SERVING_FLAGS = (
    "request_rate",
    "max_requests",
    "duration",
    "prompt_len",
    "output_len",
    "stall_timeout",
    "enforce_eager",
)
PLACEMENT_FLAGS = {"prompt_ids": "--prompt-ids", "max_new_tokens": "--max-new-tokens", "warmup": "--warmup"}


def request_rate(text: str) -> float:
    """Requests per second: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of requests per second, got {text!r}")
    return value


def add_serve_launch_args(p: argparse.ArgumentParser) -> None:
    """The flags of `launch` that only serving plans take (the load the front end sends)."""
    p.add_argument(
        "--request-rate",
        type=request_rate,
        default=None,
        help="serving plans: open loop, Poisson arrivals at R requests/s over the cluster "
        "(default: closed loop at each replica's planned concurrency)",
    )
    p.add_argument(
        "--max-requests",
        type=whole(1, 2**31),
        default=None,
        help="serving plans: requests to serve over the cluster (default: twice the planned concurrency, "
        "unless --duration is given)",
    )
    p.add_argument(
        "--duration",
        type=positive_seconds,
        default=None,
        help="serving plans: stop admitting requests after this many seconds (those in flight finish)",
    )
    p.add_argument(
        "--stall-timeout",
        type=positive_seconds,
        default=None,
        help=f"serving plans: stop the run when a rank sends no heartbeat, or a replica with requests in flight "
        f"gets no iteration back, for this many seconds (default: {STALL_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--seed", type=seed, default=None, help="seed of the requests' token ids and arrivals, and of seeded weights"
    )
    p.add_argument(
        "--prompt-len",
        type=tokens,
        default=None,
        help="serving plans: prompt tokens of every request (default: the plan's)",
    )
    p.add_argument(
        "--output-len",
        type=tokens,
        default=None,
        help="serving plans: output tokens of every request (default: the plan's)",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        default=None,
        help="serving plans: run every stage eagerly (default: a stage on one GPU with a dense MLP replays its "
        "iterations as CUDA graphs between its attentions)",
    )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def refuse_serving_flags(args: argparse.Namespace) -> None:
    given = [_flag(n) for n in SERVING_FLAGS if getattr(args, n) is not None]
    if given:
        raise UserError(f"{', '.join(given)}: only serving plans take them; {args.plan} is not one", exit_code=2)


def check_report_path(args: argparse.Namespace) -> None:
    """--report is written at the end of a run: refused before it starts where it is a directory or
    names the plan or a file the plan was made from (its folder may be one the run makes, such as
    its workdir)."""
    if args.report is not None:
        if Path(args.report).is_dir():
            raise WriteError(f"{args.report}: cannot write: it is a directory")
        check_not_an_input(args.report, {"plan": args.plan, **_recorded_inputs(args.plan)})


def _recorded_inputs(plan_path: str) -> dict[str, str | None]:
    """The files a plan records (its cluster, profile, graph, model config), by field, resolved
    against the plan's folder; none where the plan cannot be read (the launch then says why)."""
    try:
        data = read_document(plan_path, WriteError)
    except WriteError:
        return {}
    inputs, model = data.get("inputs"), data.get("model")
    if not isinstance(inputs, dict) or not isinstance(model, dict):
        return {}
    out = {f"inputs.{key}": inputs.get(key) for key in ("cluster", "profile")}
    out |= {"model.graph": model.get("graph") if isinstance(model.get("graph"), str) else None}
    found = {k: resolve_from_plan(v, plan_path) if isinstance(v, str) else None for k, v in out.items()}
    name = model.get("name")
    config = config_file_of(resolve_from_plan(name, plan_path)) if isinstance(name, str) and name else None
    return found | {"model.name's config": str(config) if config is not None else None}


def cmd_launch_serving(args: argparse.Namespace, console: Console) -> int:
    given = [flag for name, flag in PLACEMENT_FLAGS.items() if getattr(args, name) not in (None, [])]
    given += ["--measure"] if args.measure else []
    if given:
        raise UserError(
            f"{', '.join(given)}: {args.plan} is a serving plan; its load is its workload "
            "(--request-rate, --max-requests, --duration, --prompt-len, --output-len)",
            exit_code=2,
        )
    check_report_path(args)
    options = ServeOptions(
        dry_run=args.dry_run,
        checkpoint=args.checkpoint,
        report_path=args.report,
        timeout_s=args.timeout,
        workdir=args.workdir,
        seed=args.seed if args.seed is not None else 0,
        dtype=args.dtype,
        request_rate=args.request_rate,
        max_requests=args.max_requests,
        duration_s=args.duration,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        stall_timeout_s=args.stall_timeout if args.stall_timeout is not None else STALL_TIMEOUT_S,
        enforce_eager=bool(args.enforce_eager),
    )
    try:
        result, report = launch_serving(args.plan, options)
    except LaunchError as exc:
        raise UserError(str(exc), exit_code=exc.exit_code) from None
    if result.dry_run:
        console.print(describe_result(result))
        return 0
    if report is None:
        console.print(f"launch failed: {result.error}")
        return 1
    console.print(report_table(report))
    for note in report.get("warnings", []):
        console.print(note)
    console.print(
        styled(
            f"served {report['total']['requests_completed']} requests in {fmt_s(report['total']['duration_s'])} "
            f"(the launch took {fmt_s(result.duration_s)}, the ranks' start included); run report written to ",
            (str(result.report_path), "bold"),
        )
    )
    return 0


def _num(value, fmt=lambda v: f"{v:,.1f}") -> str:
    return "-" if value is None else fmt(value)


def report_table(report: dict) -> Table:
    """Measured against predicted per replica, and the total."""
    table = Table(title="served: measured vs predicted (per replica)")
    for name in (
        "replica",
        "layout",
        "requests",
        "tokens/s",
        "predicted",
        "TPOT (p50, p99)",
        "predicted",
        "TTFT (steady)",
        "predicted",
        "decode step",
        "predicted",
    ):
        table.add_column(name)
    for r in report["replicas"]:
        m, p = r["measured"], r["predicted"]
        table.add_row(
            str(r["replica"]),
            r["layout"],
            str(r["requests_completed"]),
            _num(m["tokens_per_s"]),
            _num(p["tokens_per_s"]),
            f"{_num(m['tpot_s'], fmt_s)} ({_num(m['tpot_p50_s'], fmt_s)}, {_num(m['tpot_p99_s'], fmt_s)})",
            _num(p["tpot_s"], fmt_s),
            f"{_num(m['ttft_s'], fmt_s)} ({_num(m.get('ttft_steady_s'), fmt_s)})",
            _num(p["ttft_s"], fmt_s),
            _num(m["decode_step_s"], fmt_s),
            _num(p["decode_step_s"], fmt_s),
        )
    total = report["total"]
    table.add_row(
        "total",
        "",
        str(total["requests_completed"]),
        _num(total["measured"]["tokens_per_s"]),
        _num(total["predicted"]["tokens_per_s"]),
        "",
        "",
        "",
        "",
        "",
        "",
    )
    return table
