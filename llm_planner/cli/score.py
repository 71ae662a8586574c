"""`llm-planner score`: one replica at one concurrency, no search. The layout is read as `describe`
writes it (llm_planner.serving.layout_text), the figures are the cost model's
(llm_planner.serving.score); this module parses the flags and prints."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

from llm_planner.cli.arg_types import (
    budget,
    front_end_seconds,
    imbalance,
    layer_counts,
    positive,
    redundant_experts,
    tokens,
)
from llm_planner.cli.commands import UserError
from llm_planner.cli.serving import expert_load_options
from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.core.fmt import LiteralConsole, fmt_bytes, fmt_s, styled
from llm_planner.core.precision import KV_FORMATS
from llm_planner.cost.chunks import engine_mixes_prompts
from llm_planner.export.engine_args import engine_token_budget
from llm_planner.serving.classes import ServerClass
from llm_planner.serving.closed_loop import MOST_CONCURRENCY as CLOSED_LOOP_MOST
from llm_planner.serving.closed_loop import ROUNDS
from llm_planner.serving.context import ServingOptions, build_context
from llm_planner.serving.engines import ENGINES, TITLES
from llm_planner.serving.inputs import serving_precision, workload_from_flags
from llm_planner.serving.layout import Layout, device_word, group_text
from llm_planner.serving.layout_text import LayoutError, parse_layout
from llm_planner.serving.score import ReplicaScore, score_replica
from llm_planner.serving.tasks import DEFAULT_TOKEN_BUDGET
from llm_planner.serving.workload import TPOT_SLO_RANGE_S, ServingWorkload

NO_TARGETS = "no TPOT or TTFT target applies"


def add_score_parser(sub) -> None:
    p = sub.add_parser(
        "score", help="serving: one replica's tokens/s, TPOT and TTFT at one concurrency (no search, no target)"
    )
    p.add_argument("--cluster", required=True, help="cluster spec YAML")
    p.add_argument("--model", required=True, help="decoder preset name (see `llm-planner models`) or a config.json")
    p.add_argument(
        "--replica",
        required=True,
        help="the layout as plans write it, segments joined by '->', e.g. 'node/gpu: 2 stages x tp4 in 1 server "
        "-> other/gpu: 1 stage x 1 GPU' (the servers part optional), or compact: '2 x node/gpu[tp4] -> 1 x other/gpu'",
    )
    p.add_argument("--concurrency", type=positive, required=True, help="sequences in flight in the replica")
    p.add_argument(
        "--micro-batches", type=positive, default=1, help="micro-batches the sequences are cut into (default: 1)"
    )
    p.add_argument(
        "--layers",
        type=layer_counts,
        default=None,
        help="decoder layers of each stage, comma-separated, summing to the model's (default: the planner's split "
        "at this concurrency)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="score the replica as this engine runs it by default: its token budget for the replica's smallest GPU "
        "(vLLM's --max-num-batched-tokens, SGLang's --chunked-prefill-size) unless --max-batched-tokens is given, "
        "and its way with prompts (SGLang: in iterations of their own, as without --enable-mixed-chunk) unless "
        "--chunked-prefill or --no-chunked-prefill is",
    )
    p.add_argument(
        "--max-batched-tokens",
        type=budget,
        default=None,
        help=f"tokens one engine iteration may carry (default: --engine's default here, else {DEFAULT_TOKEN_BUDGET})",
    )
    prefill = p.add_mutually_exclusive_group()
    prefill.add_argument(
        "--no-chunked-prefill",
        dest="chunked_prefill",
        action="store_false",
        default=None,
        help="score an engine that runs prompts in iterations of their own, the decodes waiting (TensorRT-LLM without "
        "chunked context, vLLM before V1 with chunked prefill off, SGLang without --enable-mixed-chunk, its default); "
        "plans are made for engines that mix the two",
    )
    prefill.add_argument(
        "--chunked-prefill",
        dest="chunked_prefill",
        action="store_true",
        default=None,
        help="score an engine that carries prompt chunks beside the decodes (the default but with --engine sglang: "
        "SGLang with --enable-mixed-chunk, as the plans' exports run it)",
    )
    p.add_argument(
        "--expert-imbalance",
        type=imbalance,
        default=1.0,
        help="mixture-of-experts models: the busiest expert's tokens over the mean, >= 1 (default: 1, uniform routing)",
    )
    p.add_argument(
        "--expert-load",
        default=None,
        metavar="FILE",
        help="mixture-of-experts models: a measured routing histogram instead of --expert-imbalance, as plan takes it",
    )
    p.add_argument(
        "--eplb",
        type=redundant_experts,
        default=None,
        metavar="R",
        help="mixture-of-experts models: the engine rebalances a dpaK group's experts with R redundant ones, as plan "
        "takes it (default: off)",
    )
    p.add_argument("--prompt-len", type=tokens, default=None, help="mean prompt tokens per request")
    p.add_argument("--output-len", type=tokens, default=None, help="mean output tokens per request")
    p.add_argument(
        "--workload", default=None, help="a YAML file of request shapes instead of --prompt-len/--output-len"
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=tuple(DTYPE_BYTES),
        help="activation dtype (default: the model config's torch_dtype, else fp16)",
    )
    p.add_argument(
        "--weights",
        default=None,
        help="the decoder layers' weight format, as plan takes it: fp16/bf16/fp32, fp8, int8, int4-awq, int4-gptq "
        "(default: what the model config's quantization_config declares, else unquantized)",
    )
    p.add_argument(
        "--kv-cache-dtype", choices=KV_FORMATS, default=None, help="the KV cache's dtype: auto or fp8 (default: auto)"
    )
    p.add_argument("--profile", help="a measured serving profile to use instead of the roofline where it has times")
    p.add_argument(
        "--closed-loop",
        action="store_true",
        help="also simulate a closed-loop benchmark, iteration by iteration: --concurrency requests of the one shape "
        "sent at once, each resent as it ends (genai-perf's concurrency mode, vllm bench serve --max-concurrency); "
        "its mean TTFT, TPOT and tokens/s, which such a benchmark reports, differ from the steady state's",
    )
    p.add_argument(
        "--front-end-s",
        type=front_end_seconds,
        default=None,
        help="with --closed-loop: the seconds the engine's front end takes a request, one request at a time "
        "(receiving, tokenizing, handing it to the scheduler), so requests sent together reach the engine spread "
        "out (default 0: as sent)",
    )
    p.add_argument("--allow-cpu", action="store_true", help="let the replica name CPU classes")
    p.add_argument("--json", action="store_true", help="write one JSON object to stdout instead of the table")


def cmd_score(args: argparse.Namespace, console: Console) -> int:
    workload = workload_from_flags(
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        workload_file=args.workload,
        tpot_slo=TPOT_SLO_RANGE_S[1],  # the loosest target a workload takes; score reads none
        ttft_slo=None,
    )
    chunked = engine_mixes_prompts(args.engine) if args.chunked_prefill is None else args.chunked_prefill
    if args.profile and not chunked:
        flag = "--no-chunked-prefill" if args.chunked_prefill is False else f"--engine {args.engine}"
        raise UserError(
            f"{flag}: prompts in iterations of their own; a measured serving profile's times are chunked prefill's "
            "beside the decodes: score without --profile"
            + ("" if args.chunked_prefill is False else ", or give --chunked-prefill"),
            exit_code=2,
        )
    options = ServingOptions(
        allow_cpu=args.allow_cpu,
        max_batched_tokens=args.max_batched_tokens or DEFAULT_TOKEN_BUDGET,
        **expert_load_options(args),
        chunked_prefill=chunked,
        deepep=re.search(r"dpa\d+-deepep", args.replica) is not None,  # any layout scores, a dpa<k>-deepep one too
    )
    precision = serving_precision(args.model, args.dtype, args.weights, args.kv_cache_dtype)
    ctx, layout = _context_and_layout(args, workload, precision, options)
    rounds = ROUNDS if args.closed_loop else 0
    if args.front_end_s is not None and not args.closed_loop:
        raise UserError(
            "--front-end-s: the front end's time is simulated in a closed loop; give --closed-loop", exit_code=2
        )
    if args.closed_loop and args.concurrency > CLOSED_LOOP_MOST:
        raise UserError(
            f"--concurrency {args.concurrency:,}: --closed-loop simulates at most {CLOSED_LOOP_MOST:,} sequences in "
            "flight, iteration by iteration; leave out --closed-loop for the steady state",
            exit_code=2,
        )
    score = score_replica(
        ctx,
        layout,
        concurrency=args.concurrency,
        micro_batches=args.micro_batches,
        layers=args.layers,
        closed_loop_rounds=rounds,
        front_end_s=args.front_end_s or 0.0,
    )
    if args.json:
        print(json.dumps(score.to_dict(), allow_nan=False))
        warn = LiteralConsole(stderr=True, soft_wrap=True)
    else:
        console.print(
            styled((ctx.config.name, "bold"), f" ({precision.describe()}), replica ", (score.replica, "bold"))
        )
        console.print(_header(score, workload, args.engine), highlight=False)
        console.print(score_table(score, layout, ctx.by_name))
        console.print(_figures(score), highlight=False)
        if score.closed_loop is not None:
            console.print(_closed_loop_text(score), highlight=False)
        warn = console
    for line in warnings(score):
        warn.print(styled(("warning:", "yellow"), f" {line}"), highlight=False)
    return 0


def _context_and_layout(args: argparse.Namespace, workload: ServingWorkload, precision, options: ServingOptions):
    """The serving context and the replica's layout; with --engine and no --max-batched-tokens, the
    context at the engine's default budget for the layout's GPUs."""
    ctx = build_context(args.cluster, args.model, workload, precision, options, args.profile)
    try:
        layout = parse_layout(args.replica, ctx.by_name)
    except LayoutError as exc:
        raise UserError(f"--replica: {exc}{ctx.left_out_text()}", exit_code=2) from None
    if args.eplb and all(seg.attention == "tp" for seg in layout):
        raise UserError(
            f"--eplb rebalances the experts of a group with data-parallel attention (dpaK), and the replica "
            f"{args.replica!r} has none: give its groups as dpaK, or leave out --eplb",
            exit_code=2,
        )
    if args.engine is None or args.max_batched_tokens is not None:
        return ctx, layout
    tokens = engine_token_budget(args.engine, [ctx.by_name[seg.class_name].kind for seg in layout])
    return (ctx, layout) if tokens == options.max_batched_tokens else (ctx.with_token_budget(tokens), layout)


def _header(score: ReplicaScore, workload: ServingWorkload, engine: str | None = None) -> str:
    ev, reqs = score.ev, workload.requests
    shape = (
        f"prompt {reqs[0].prompt_len}, output {reqs[0].output_len} token{'s' if reqs[0].output_len != 1 else ''}"
        if len(reqs) == 1
        else f"{len(reqs)} request shapes"
    )
    batches = f"{ev.micro_batches} micro-batch" + ("es" if ev.micro_batches > 1 else "")
    prefill = "" if score.chunked_prefill else ", prompts in iterations of their own"
    budget = f"token budget {score.max_batched_tokens}{prefill}" + (
        f", as {TITLES[engine]} runs by default" if engine else ""
    )
    flight = f"{ev.concurrency} in flight"
    if score.queued:
        flight = (
            f"{ev.concurrency + score.queued} sent, {ev.concurrency} in flight (memory holds no more full contexts; "
            f"the engine queues {score.queued})"
        )
    return f"{flight}, {batches}; {shape}; {budget}; {NO_TARGETS}"


def score_table(score: ReplicaScore, layout: Layout, classes: Mapping[str, ServerClass]) -> Table:
    table = Table()
    for col in ("stage", "devices", "layers", "layers memory holds", "stage time", "memory / device"):
        table.add_column(col)
    ev = score.ev
    groups = [
        f"{seg.class_name} "
        + (group_text(seg.degree, seg.attention) if seg.degree > 1 else f"1 {device_word(classes[seg.class_name])}")
        for seg in layout
    ]
    per_stage = [g for g, seg in zip(groups, layout) for _ in range(seg.stages)]
    for s, n in enumerate(ev.layers):
        table.add_row(
            str(s),
            per_stage[s],
            f"{n} + {score.dense_layers} dense" if s == 0 and score.dense_layers else str(n),
            str(score.caps[s]),
            fmt_s(ev.stage_s[s]),
            f"{fmt_bytes(ev.mem_bytes[s])} / {fmt_bytes(score.usable_bytes[s])}",
        )
    return table


def _figures(score: ReplicaScore) -> str:
    ev = score.ev
    return (
        f"{ev.tokens_per_s:,.0f} output tokens/s; TPOT {fmt_s(ev.tpot_s)} (round trip {fmt_s(ev.round_trip_s)}); "
        f"TTFT est. {fmt_s(ev.ttft_s)}; decode step {fmt_s(score.decode_step_s)}"
    )


def _tpot_text(tpot_s: float | None) -> str:
    return "none (one output token a request)" if tpot_s is None else fmt_s(tpot_s)


def _closed_loop_text(score: ReplicaScore) -> str:
    got = score.closed_loop
    how = [f"all {score.ev.concurrency + score.queued} sent at once, each resent as it ends"]
    if got.front_end_s:
        how.append(f"through a front end of {fmt_s(got.front_end_s)} a request")
    if got.max_running < score.ev.concurrency + score.queued:
        how.append(f"at most {got.max_running} running")
    return (
        f"closed loop ({got.requests} requests, {', '.join(how)}): "
        f"{got.tokens_per_s:,.0f} output tokens/s; TPOT {_tpot_text(got.tpot_s)}; TTFT {fmt_s(got.ttft_s)}"
    )


def _sent(score: ReplicaScore) -> str:
    """--concurrency as given, with the sequences admitted where memory held fewer (closed loop)."""
    sent = score.ev.concurrency + score.queued
    return f"{sent}" if not score.queued else f"{sent} ({score.ev.concurrency} admitted)"


def warnings(score: ReplicaScore) -> list[str]:
    """What makes the scored point one an engine could not hold (it is scored anyway)."""
    ev, out = score.ev, []
    for s in score.over_memory():
        out.append(
            f"stage {s} holds {ev.layers[s]} layers, over the {score.caps[s]} its memory holds at --concurrency "
            f"{ev.concurrency} ({fmt_bytes(ev.mem_bytes[s])} of {fmt_bytes(score.usable_bytes[s])} usable); "
            "scored anyway"
        )
    if not score.within_token_budget:
        out.append(
            f"--concurrency {_sent(score)} in {ev.micro_batches} micro-batch(es) overruns the token budget "
            f"(--max-batched-tokens {score.max_batched_tokens}): a micro-batch's decodes and their steady prompt "
            f"share do not fit one iteration, so an engine could not keep {ev.concurrency} sequences in flight; "
            "scored as at the least budget that holds them (each iteration its decodes and their whole prompt share)"
        )
    return out
