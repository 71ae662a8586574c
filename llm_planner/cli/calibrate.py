"""`llm-planner calibrate`: fit a cluster spec to measurements and write the corrected spec.

Two sources: placement runs (`--plan` and `--report`, llm_planner.measure.calibrate) and, with
`--serving`, serving measurements (vLLM and SGLang benchmark results, our own serving run
reports; llm_planner.measure.serving_fit). This module parses the flags and prints."""

from __future__ import annotations

import argparse
import math

from rich.console import Console
from rich.table import Table

from llm_planner.cli.arg_types import budget, front_end_seconds, positive
from llm_planner.cli.commands import UserError
from llm_planner.core.atomic import check_not_an_input, check_writable
from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.core.fmt import fmt_s, styled
from llm_planner.core.precision import KV_FORMATS, build_precision
from llm_planner.measure.calibrate import CalibrateError, calibrate_files
from llm_planner.measure.fits import Calibration
from llm_planner.measure.serving_cases import ServingSettings
from llm_planner.measure.serving_fit import DEFAULT_WEIGHTS, ServingCalibration, calibrate_serving_files

FIGURE_NAMES = {"tpot_s": "TPOT", "tokens_per_s": "tokens/s", "ttft_s": "TTFT", "decode_step_s": "decode step"}


def _weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= 10):
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 10, got {text!r}")
    return value


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit a cluster spec's efficiency factors and links to run reports (or, with --serving, its serving "
        "factors to benchmark results), write the corrected spec",
    )
    p.add_argument("--cluster", required=True, help="cluster spec YAML to correct")
    p.add_argument("--plan", action="append", help="plan the runs executed: once for all reports, or once per --report")
    p.add_argument("--report", action="append", help="run report JSON of `launch`; repeat for more runs")
    p.add_argument("-o", "--output", required=True, help="corrected cluster spec YAML to write")
    s = p.add_argument_group("serving measurements (--serving)")
    s.add_argument(
        "--serving",
        action="store_true",
        help="fit compute_efficiency, mem_efficiency, step_overhead_s, collective_overhead_s and sequence_overhead_s "
        "to RESULT files",
    )
    s.add_argument(
        "results",
        nargs="*",
        metavar="RESULT",
        help="`vllm bench serve --save-result` JSON, `sglang.bench_serving --output-file` JSONL, or a serving run "
        "report of `launch`",
    )
    s.add_argument("--model", help="decoder preset or config.json the results served (default: a report's model)")
    s.add_argument(
        "--replica",
        action="append",
        help="the replica's layout as `score --replica` reads it, e.g. '1 x node/gpu[tp4]': once for all RESULTs or "
        "once per RESULT (overrides a report's)",
    )
    s.add_argument(
        "--concurrency",
        type=positive,
        action="append",
        help="sequences in flight: once or once per RESULT (default: the file's max_concurrency or concurrency)",
    )
    s.add_argument(
        "--micro-batches",
        type=positive,
        action="append",
        help="once or once per RESULT (default: a report's; for an engine, one per pipeline stage)",
    )
    s.add_argument("--dtype", default="fp16", choices=tuple(DTYPE_BYTES), help="weights' element type (default: fp16)")
    s.add_argument(
        "--weights",
        default=None,
        help="the decoder layers' weight format the engine ran, as plan takes it (fp8, int8, int4-awq, ...), below "
        "--dtype's activations (default: --dtype)",
    )
    s.add_argument("--kv-cache-dtype", choices=KV_FORMATS, default=None, help="the KV cache's dtype: auto or fp8")
    s.add_argument(
        "--max-batched-tokens", type=budget, default=None, help="the engine's token budget (default: as `score`)"
    )
    s.add_argument(
        "--ttft-weight",
        type=_weight,
        default=DEFAULT_WEIGHTS["ttft_s"],
        help=f"weight of TTFT's relative error beside TPOT's 1 (default: {DEFAULT_WEIGHTS['ttft_s']}; 0: leave it out)",
    )
    s.add_argument(
        "--tokens-weight",
        type=_weight,
        default=DEFAULT_WEIGHTS["tokens_per_s"],
        help=f"weight of tokens/s' relative error (default: {DEFAULT_WEIGHTS['tokens_per_s']}; 0 for a closed batch "
        "of a few prompts, whose tokens/s is mostly its ramp-up and tail)",
    )
    prefill = s.add_mutually_exclusive_group()
    prefill.add_argument(
        "--no-chunked-prefill",
        dest="chunked_prefill",
        action="store_false",
        default=None,
        help="the engine ran prompts in iterations of their own, the decodes waiting (TensorRT-LLM without chunked "
        "context, SGLang without --enable-mixed-chunk), as `score` takes it (default: so for SGLang's results, as "
        "SGLang runs by default; mixed for the others)",
    )
    prefill.add_argument(
        "--chunked-prefill",
        dest="chunked_prefill",
        action="store_true",
        default=None,
        help="the engine carried prompt chunks in the decodes' iterations (SGLang with --enable-mixed-chunk; vLLM's "
        "and TensorRT-LLM's default)",
    )
    s.add_argument(
        "--closed-loop",
        action="store_true",
        default=None,
        help="the results are closed-loop benchmarks (C requests of one shape sent at once, each resent as it ends: "
        "vllm bench serve --max-concurrency, genai-perf's concurrency mode): predict each as `score --closed-loop` "
        "simulates it, not as the steady state",
    )
    s.add_argument(
        "--front-end-s",
        type=front_end_seconds,
        default=None,
        help="with --closed-loop: the seconds the engine's front end takes a request, as `score --front-end-s` takes "
        "it (default 0: requests reach the engine as sent); an input of the fit, not fitted",
    )
    s.add_argument("--allow-cpu", action="store_true", help="let a replica name CPU classes")


def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    _check_flags(args)
    check_writable(args.output, CalibrateError)
    if args.serving:
        settings = ServingSettings(
            model=args.model,
            replicas=tuple(args.replica or ()),
            concurrency=tuple(args.concurrency or ()),
            micro_batches=tuple(args.micro_batches or ()),
            dtype=args.dtype
            if args.weights is None and args.kv_cache_dtype is None
            else build_precision(args.dtype, args.weights, args.kv_cache_dtype),
            max_batched_tokens=args.max_batched_tokens,
            allow_cpu=args.allow_cpu,
            chunked_prefill=args.chunked_prefill,
            closed_loop=bool(args.closed_loop),
            front_end_s=args.front_end_s or 0.0,
        )
        weights = {"ttft_s": args.ttft_weight, "tokens_per_s": args.tokens_weight}
        result = calibrate_serving_files(args.cluster, args.results, settings, args.output, weights)
        console.print(figures_table(result))
        for note in result.notes:
            console.print(styled(("note:", "yellow"), f" {note}"), highlight=False)
        console.print(fits_table(result.calibration, f"serving calibration of {args.cluster}"))
    else:
        result = calibrate_files(args.cluster, args.plan, args.report, args.output)
        console.print(fits_table(result, f"calibration of {args.cluster}"))
    console.print(styled("corrected spec written to ", (str(args.output), "bold")))
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    _check_not_an_input(args)
    serving_only = (
        "--model",
        "--replica",
        "--concurrency",
        "--micro-batches",
        "--max-batched-tokens",
        "--weights",
        "--kv-cache-dtype",
        "--no-chunked-prefill",
        "--chunked-prefill",
        "--closed-loop",
        "--front-end-s",
    )
    if args.serving:
        if args.front_end_s is not None and not args.closed_loop:
            raise UserError(
                "--front-end-s: the front end's time is simulated in a closed loop; give --closed-loop", exit_code=2
            )
        if args.plan or args.report:
            raise UserError("--serving fits RESULT files; --plan and --report are for placement runs", exit_code=2)
        if not args.results:
            raise UserError("--serving needs at least one RESULT file (a benchmark result or run report)", exit_code=2)
        return
    given = [f for f in serving_only if _given(args, f)]
    if args.results or given:
        what = f"RESULT files ({', '.join(args.results)})" if args.results else ", ".join(given)
        raise UserError(f"{what}: serving measurements need --serving", exit_code=2)
    if not args.plan or not args.report:
        raise UserError("calibrate needs --plan and --report (or --serving and RESULT files)", exit_code=2)


def _given(args: argparse.Namespace, flag: str) -> bool:
    """Whether `flag` was on the command line (--chunked-prefill and --no-chunked-prefill share one value)."""
    if flag in ("--chunked-prefill", "--no-chunked-prefill"):
        return args.chunked_prefill is (flag == "--chunked-prefill")
    return getattr(args, flag[2:].replace("-", "_")) is not None


def _check_not_an_input(args: argparse.Namespace) -> None:
    """-o must not name a file the command reads (the spec it corrects, a measurement): writing the
    corrected spec there would destroy it."""
    named = {
        "--cluster": (args.cluster,),
        "RESULT": args.results or (),
        "--plan": args.plan or (),
        "--report": args.report or (),
    }
    inputs = {f"{flag} {path}": path for flag, paths in named.items() for path in paths}
    check_not_an_input(args.output, inputs, CalibrateError)


def _fmt_field(name: str, value: float) -> str:
    if name.endswith("_bytes_per_s"):
        return f"{value / 1e9:.4g} GB/s"
    return fmt_s(value) if name.endswith("_s") else f"{value:.4g}"


def fits_table(result: Calibration, title: str) -> Table:
    table = Table(title=title)
    for col in ("kind / link", "field", "spec", "fitted", "observations", "rel. RMS before", "after", "note"):
        table.add_column(col, justify="left" if col in ("kind / link", "field", "note") else "right")
    for fit in (*result.kinds, *result.links):
        for name, before in fit.before.items():
            value = fit.values[name]
            table.add_row(
                fit.name,
                name,
                _fmt_field(name, before),
                _fmt_field(name, value) if name in fit.fitted else "(kept)",
                str(fit.samples),
                _share(fit.rel_rms_before),
                _share(fit.rel_rms_after),
                fit.kept.get(name, ""),
            )
    return table


def _share(x: float) -> str:
    """A relative error as a percentage; '-' where nothing measured it."""
    return f"{x:.1%}" if math.isfinite(x) else "-"


def _figure(name: str, value: float) -> str:
    return f"{value:,.1f}" if name == "tokens_per_s" else fmt_s(value)


def figures_table(result: ServingCalibration) -> Table:
    """Each measured figure with the spec's prediction and the fitted one (error = predicted / measured - 1)."""
    table = Table(title="measured against predicted, with the spec's factors and with the fitted ones")
    for col in ("observation", "replica", "C", "figure", "measured", "spec", "error", "fitted", "error"):
        table.add_column(col, justify="left" if col in ("observation", "replica", "figure") else "right")
    for f in result.figures:
        table.add_row(
            f.source,
            f.replica,
            str(f.concurrency),
            FIGURE_NAMES[f.figure],
            _figure(f.figure, f.measured),
            _figure(f.figure, f.before),
            f"{f.before / f.measured - 1:+.1%}",
            _figure(f.figure, f.after),
            f"{f.after / f.measured - 1:+.1%}",
        )
    return table
