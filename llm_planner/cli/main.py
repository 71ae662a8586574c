"""Command line: thin; parses arguments, calls the layers, prints tables, writes files.

Exit codes: 0 success; 1 a plan that fails verification or a solve that found
no plan; 2 bad input (file, field, option, a path that cannot be written),
always with a message, never a traceback; 130 interrupted (Ctrl-C: `plan` still
writes the best plan found, with the status `interrupted`, when there is one).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from llm_planner import __version__
from llm_planner.cli import calibrate as commands_calibrate
from llm_planner.cli import commands, flags
from llm_planner.cli import export as commands_export
from llm_planner.cli import helix as commands_helix
from llm_planner.cli import measure as commands_measure
from llm_planner.cli import profile_serving as commands_profile_serving
from llm_planner.cli import score as commands_score
from llm_planner.cli import serving as commands_serving
from llm_planner.cli.arg_types import count, names_of, positive, positive_seconds, seed, share, tokens, whole
from llm_planner.cli.calibrate import add_calibrate_parser
from llm_planner.cli.export import add_export_parser
from llm_planner.cli.helix import add_import_parser, add_plan_helix_parser
from llm_planner.cli.launch_serving import add_serve_launch_args, cmd_launch_serving
from llm_planner.cli.serving import add_serving_args
from llm_planner.core.atomic import WriteError
from llm_planner.core.constants import DTYPE_BYTES, TORCH_DTYPES
from llm_planner.core.fmt import LiteralConsole, styled
from llm_planner.core.gap import DEFAULT_REL_GAP
from llm_planner.core.plan import PlanError
from llm_planner.core.precision import PrecisionError
from llm_planner.core.procs import last_stop_signal, stop_signals_as_interrupt
from llm_planner.core.spec import SpecError
from llm_planner.cost.profile import ProfileError
from llm_planner.cost.serving_profile import ServingProfileError
from llm_planner.export.serving import ServingExportError
from llm_planner.graph.ir import GraphError
from llm_planner.graph.models import GRANULARITIES, PHASES
from llm_planner.helix.inputs import HelixError
from llm_planner.launch.plan_launch import MEASURE_WARMUP
from llm_planner.measure.calibrate import CalibrateError
from llm_planner.measure.observe import MeasureError
from llm_planner.placement.inputs import InputError
from llm_planner.placement.options import SYMMETRY_CHOICES
from llm_planner.placement.problem import ProblemError
from llm_planner.placement.solve import SOLVERS
from llm_planner.placement.study import STUDY_SOLVERS
from llm_planner.serving.layout_text import LayoutError
from llm_planner.serving.plan_file import ServingPlanError, is_serving_plan
from llm_planner.serving.workload import WorkloadError

console = LiteralConsole()  # values from files are printed literally, never read as markup
if not console.is_terminal:  # piped or captured: do not squeeze tables into 80 columns
    console = LiteralConsole(width=160)
err_console = LiteralConsole(stderr=True, soft_wrap=True)  # an error message is one line, never broken inside a path

EXIT_OK, EXIT_FAIL, EXIT_INPUT = 0, 1, 2


def _input_errors() -> tuple[type[Exception], ...]:

    return (
        flags.FlagError,
        SpecError,
        GraphError,
        PlanError,
        InputError,
        ProblemError,
        MeasureError,
        CalibrateError,
        ProfileError,
        WriteError,
        HelixError,
        ServingProfileError,
        ServingPlanError,
        WorkloadError,
        ServingExportError,
        LayoutError,
        PrecisionError,
    )


def _add_model_args(p: argparse.ArgumentParser) -> None:

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model", help="preset name (see `llm-planner models`), a config.json, or a directory holding one"
    )
    src.add_argument("--graph", help="task graph JSON file (our format, or a dnn-partitioning workload file)")
    p.add_argument("--cluster", help="cluster spec YAML (not needed for workload graph files)")
    p.add_argument(
        "--phase", choices=PHASES, default="decode", help="decoders: one decode step or a prefill (default: decode)"
    )
    p.add_argument(
        "--seq-len",
        type=tokens,
        default=None,
        help="decoders: context (decode) or prompt (prefill) length (default: min(2048, the model's maximum))",
    )
    p.add_argument(
        "--granularity", choices=GRANULARITIES, default="block", help="decoders: task per block or per sublayer"
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=tuple(DTYPE_BYTES),
        help="element type of weights and activations (default: fp16); serving: of activations (default: the "
        "model config's torch_dtype, else fp16), the weights' format being --weights",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of random graphs (RWNN)")


def _add_solve_args(p: argparse.ArgumentParser) -> None:

    p.add_argument(
        "--objective",
        choices=("latency", "throughput", "serving"),
        default="latency",
        help="latency: the time of one batch (makespan); throughput: seconds per sample in steady state, "
        "the busiest device's load per batch over the batch; serving (decoders): output tokens/s of the "
        "cluster under --tpot-slo, with prefill and every in-flight sequence's KV cache (default: latency)",
    )
    p.add_argument("--batch", type=positive, default=1, help="samples (requests) in the batch (default: 1)")
    p.add_argument(
        "--max-shards",
        type=positive,
        default=None,
        help="data parallelism: at most this many batch shards (default: number of devices; 1 turns it off)",
    )
    _add_max_tp(p)
    p.add_argument(
        "--solver",
        choices=SOLVERS,
        default="milp-split",
        help="placement solver (default: milp-split: the graph cut into modules, each solved by the exact MILP, "
        "joined by a dynamic program, with tensor-parallel layouts searched; milp: the exact MILP over the "
        "whole problem, for small ones; the others are the baselines a user would otherwise write)",
    )
    p.add_argument(
        "--solver-backend",
        choices=("highs", "gurobi"),
        default="highs",
        help="MILP backend (default: highs, no licence needed)",
    )
    p.add_argument(
        "--allow-backend-fallback",
        action="store_true",
        help="fall back to highs when gurobi is missing or its licence is too small",
    )
    p.add_argument("--time-limit", type=positive_seconds, default=60.0, help="seconds per MILP solve (default: 60)")
    p.add_argument(
        "--gap", type=share, default=DEFAULT_REL_GAP, help=f"relative MIP gap to stop at (default: {DEFAULT_REL_GAP:g})"
    )
    p.add_argument("--threads", type=count, default=0, help="solver threads (default: backend's choice)")
    p.add_argument(
        "--symmetry",
        choices=SYMMETRY_CHOICES,
        default="solver",
        help="symmetry breaking among identical devices and servers (default: the solver's own detection)",
    )
    p.add_argument("--contiguous", action="store_true", help="throughput: each device's tasks form a contiguous set")
    p.add_argument("--workers", type=count, default=0, help="MILP-SPLIT processes (default: all cores)")


def _add_max_tp(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-tp",
        type=positive,
        default=None,
        help="tensor parallelism: largest group of identical devices of one server that runs a task together "
        "(default: as many as a server has of one kind; 1 turns it off)",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-planner", description="Plan, verify and launch neural networks on heterogeneous clusters."
    )
    parser.add_argument("--version", action="version", version=f"llm-planner {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="place and schedule a model on a cluster, write a plan file")
    _add_model_args(p)
    _add_solve_args(p)
    p.add_argument("-o", "--output", default="plan.yaml", help="plan file to write (default: plan.yaml)")
    p.add_argument("--no-baselines", action="store_true", help="skip the comparison with the baseline planners")
    p.add_argument(
        "--profile", help="measured costs (`llm-planner profile`) to use instead of the roofline where they exist"
    )
    p.add_argument(
        "--export",
        choices=("vllm", "megatron"),
        help="also write the plan as vLLM's or Megatron-LM's parallel sizes and layer split (when it has that form)",
    )
    p.add_argument(
        "--export-file", help="where --export writes (default: the plan file's name with .vllm.json or .megatron.json)"
    )

    add_serving_args(p)
    flags.restrict_plan(p)

    p = sub.add_parser("verify", help="check a plan against its inputs and recompute its objective")
    p.add_argument("plan", help="plan file (YAML, or JSON for a .json path) written by `plan`")

    p = sub.add_parser("show", help="per-device table of a plan, optional Gantt chart")
    p.add_argument("plan", help="plan file (YAML, or JSON for a .json path) written by `plan`")
    p.add_argument("--gantt", help="write a Gantt chart here (PNG, or the format its suffix names: .svg, .pdf)")

    sub.add_parser("models", help="list model presets")

    p = sub.add_parser("show-cluster", help="devices, links and symmetry classes of a cluster spec")
    p.add_argument("cluster", help="cluster spec YAML (docs/cluster-spec.md)")

    p = sub.add_parser(
        "compare-symmetry", help="solve one instance under every symmetry criterion, exact MILP and MILP-SPLIT"
    )
    _add_model_args(p)
    p.add_argument(
        "--objective",
        choices=("latency", "throughput"),
        default="latency",
        help="latency: the time of one batch (makespan); throughput: seconds per sample in steady state, "
        "the busiest device's load per batch over the batch (default: latency)",
    )
    p.add_argument("--batch", type=positive, default=1, help="samples (requests) in the batch (default: 1)")
    p.add_argument(
        "--max-shards",
        type=positive,
        default=None,
        help="data parallelism: at most this many shards (default: number of devices)",
    )
    _add_max_tp(p)
    p.add_argument("--time-limit", type=positive_seconds, default=60.0, help="seconds per solve (default: 60)")
    p.add_argument(
        "--solvers",
        type=names_of(STUDY_SOLVERS, "solver"),
        default=",".join(STUDY_SOLVERS),
        help=f"comma-separated solvers to compare, of {', '.join(STUDY_SOLVERS)} (default: all)",
    )
    p.add_argument(
        "--criteria",
        type=names_of(SYMMETRY_CHOICES, "criterion"),
        default=",".join(SYMMETRY_CHOICES),
        help=f"comma-separated symmetry criteria to compare (default: all of {', '.join(SYMMETRY_CHOICES)})",
    )
    p.add_argument(
        "--solver-backend",
        choices=("highs", "gurobi"),
        default="highs",
        help="MILP backend (default: highs, no licence needed)",
    )
    p.add_argument("--out-dir", default=".", help="where to write symmetry.csv and symmetry.png (default: .)")
    p.add_argument(
        "--profile", help="measured costs (`llm-planner profile`) to use instead of the roofline where they exist"
    )

    p = sub.add_parser("launch", help="run a plan with mpiexec, one rank per device (serving plans: serve them)")
    p.add_argument("plan", help="plan file (YAML, or JSON for a .json path) written by `plan`, or a serving plan")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="write the launch folder (hostfile, rank table, command) and print the command and rank table; "
        "start nothing",
    )
    p.add_argument("--checkpoint", help="Hugging Face checkpoint directory to load weights from")
    p.add_argument(
        "--prompt-ids", action="append", default=[], help="comma-separated token ids of one request; repeat for a batch"
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="decoders: tokens generated per request, the prompt's prefill being the first step (default: 16)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=tuple(TORCH_DTYPES),
        help="element type the ranks compute in (default: the plan's; fp32 is fastest on CPUs)",
    )
    p.add_argument("--report", default="run.json", help="JSON run report to write (default: run.json)")
    p.add_argument(
        "--timeout", type=positive_seconds, default=600.0, help="seconds before the whole run is stopped (default 600)"
    )
    p.add_argument(
        "--workdir", default=None, help="where to write the hostfile and rank table (default: next to the report)"
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="compare predicted with measured time per task, device, link and end to end; "
        "print the tables and write measure.json in the workdir",
    )

    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help=(
            "untimed runs of the whole workload before the timed one "
            f"(default: {MEASURE_WARMUP} with --measure, else 0)"
        ),
    )

    add_serve_launch_args(p)

    p = sub.add_parser("measure", help="compare a plan's predicted times with a run report of it")
    p.add_argument("plan", help="plan file (YAML, or JSON for a .json path) written by `plan`")
    p.add_argument("report", help="run report JSON written by `launch`")
    p.add_argument(
        "-o", "--output", default=None, help="measurement JSON to write (default: measure.json next to the report)"
    )
    p.add_argument(
        "--rows", type=whole(0, 100_000), default=20, help="task rows to print, largest errors first (default: 20)"
    )

    add_calibrate_parser(sub)
    _add_profile_parser(sub)
    commands_profile_serving.add_profile_serving_parser(sub)

    add_import_parser(sub)
    add_plan_helix_parser(sub)

    add_export_parser(sub)
    commands_score.add_score_parser(sub)
    return parser


def _add_profile_parser(sub) -> None:
    p = sub.add_parser(
        "profile", help="time the model's tasks on the cluster's devices (and links, under MPI), write a profile"
    )
    _add_model_args(p)
    p.add_argument("-o", "--output", default="profile.yaml", help="profile file to write (default: profile.yaml)")
    p.add_argument(
        "--batch-sizes", default="1,2,4", help="comma-separated sub-batch sizes to time, at least two (default: 1,2,4)"
    )
    p.add_argument(
        "--repetitions", type=int, default=5, help="timed runs per batch size; the median is kept (default: 5)"
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per batch size before them (default: 2)")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads on CPU devices (default: 1, as the runtime's ranks)"
    )
    p.add_argument(
        "--max-blocks", type=int, default=12, help="decoders: blocks built and timed; all share one key (default: 12)"
    )
    p.add_argument("--node", help="the cluster node this machine is (default: the node whose hostname is this host's)")
    p.add_argument(
        "--mpi", action="store_true", help="start one rank per cluster device with mpiexec; also measures the links"
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=600.0,
        help="--mpi: seconds before the ranks are stopped (default: 600)",
    )
    p.add_argument(
        "--workdir", default=None, help="--mpi: where to write the hostfile and job file (default: next to the output)"
    )


def _serving_handler(args: argparse.Namespace):
    """Serving plans have their own handlers: `plan --objective serving`, `show`, `verify` and `launch` of one."""

    if args.command == "plan" and args.objective == "serving":
        return commands_serving.cmd_plan_serving
    if args.command in ("show", "verify") and is_serving_plan(args.plan):
        return getattr(commands_serving, f"cmd_{args.command}_serving")
    if args.command == "launch" and is_serving_plan(args.plan):
        return cmd_launch_serving
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        args = _build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a flag argparse refused (2, its message printed)
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )

    name = "cmd_" + args.command.replace("-", "_")
    handler = (
        getattr(commands, name, None)
        or getattr(commands_helix, name, None)
        or getattr(commands_export, name, None)
        or getattr(commands_score, name, None)
        or getattr(commands_calibrate, name, None)
        or getattr(commands_profile_serving, name, None)
        or getattr(commands_measure, name)
    )
    handler = _serving_handler(args) or handler
    try:
        flags.check_objective(args)
        flags.fill_defaults(args)
        with stop_signals_as_interrupt():  # SIGTERM and SIGHUP stop a command as Ctrl-C does
            return handler(args, console)
    except _input_errors() as exc:
        err_console.print(styled(("error:", "bold red"), f" {exc}"), highlight=False)
        return EXIT_INPUT
    except commands.UserError as exc:
        err_console.print(styled(("error:", "bold red"), f" {exc}"), highlight=False)
        return exc.exit_code
    except KeyboardInterrupt:
        err_console.print(f"interrupted ({last_stop_signal()})")
        return 130
    except BrokenPipeError:  # the reader of stdout left (`... --json | head`): stop quietly, as a Unix tool does
        _stdout_to_null()
        return 141


def _stdout_to_null() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit finds no closed pipe."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file descriptor (captured): nothing is flushed to a pipe
        pass


if __name__ == "__main__":
    sys.exit(main())
