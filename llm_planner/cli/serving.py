"""CLI handlers of serving plans: `plan --objective serving`, and `show` / `verify` of a
serving plan file. Names from files are printed literally (never as markup)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from llm_planner.cli.arg_types import budget, imbalance, positive, redundant_experts, tokens
from llm_planner.cli.commands import UserError, progress, refuse_rejected
from llm_planner.cli.serving_text import print_serving
from llm_planner.core.atomic import check_not_an_input, check_writable
from llm_planner.core.fmt import fmt_s, styled
from llm_planner.core.precision import KV_FORMATS
from llm_planner.core.spec import ClusterSpec, SpecError, load_cluster
from llm_planner.core.timing import Stopwatch, fmt_elapsed, timing_text
from llm_planner.cost.eplb import check_redundant
from llm_planner.serving.api import plan_serving_among
from llm_planner.serving.context import ServingOptions
from llm_planner.serving.engines import ENGINES
from llm_planner.serving.expert_load import ExpertLoad, read_expert_load
from llm_planner.serving.inputs import checkpoint_weights, decoder_config, serving_precision, workload_from_flags
from llm_planner.serving.plan_fields import SERVING_SOLVERS
from llm_planner.serving.plan_file import ServingPlanError, load_serving_plan, save_serving_plan
from llm_planner.serving.precision_choice import candidate_precisions
from llm_planner.serving.tasks import DEFAULT_TOKEN_BUDGET
from llm_planner.serving.verify import verify_serving_plan
from llm_planner.serving.workload import TPOT_RANGE, TTFT_RANGE


def add_serving_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving (--objective serving, decoder models)")
    g.add_argument("--prompt-len", type=tokens, default=None, help="serving: mean prompt tokens per request")
    g.add_argument("--output-len", type=tokens, default=None, help="serving: mean output tokens per request")
    g.add_argument(
        "--workload",
        default=None,
        help=(
            "serving: a YAML file of request shapes, requests: [{prompt_len, output_len, weight}], "
            "instead of the two above"
        ),
    )
    g.add_argument(
        "--tpot-slo",
        default=None,
        help=f"serving: per-token latency target every request must meet, a time with its unit {TPOT_RANGE}, "
        "e.g. '50 ms' or '0.05 s'",
    )
    g.add_argument(
        "--ttft-slo",
        default=None,
        help=f"serving: optional target on the estimated time to first token, a time with its unit {TTFT_RANGE}, "
        "e.g. '2 s'",
    )
    g.add_argument("--allow-cpu", action="store_true", help="serving: let decoder stages run on CPUs (never in groups)")
    g.add_argument(
        "--exportable",
        choices=ENGINES,
        default=None,
        help="serving: search only layouts the engine's export runs (one tensor-parallel degree, no CPU, a "
        "micro-batch per stage, the same number of consecutive stages on every host); the best plan without "
        "that limit is searched too and shown beside it",
    )
    g.add_argument(
        "--max-classes-per-replica",
        type=positive,
        default=None,
        help="serving: classes of servers one replica's pipeline may mix (default: 3, or 2 when three would "
        "give over 2,000 candidate layouts)",
    )
    g.add_argument(
        "--max-stages", type=positive, default=64, help="serving: pipeline stages of one replica at most (default: 64)"
    )
    g.add_argument(
        "--max-micro-batches",
        type=positive,
        default=None,
        help="serving: micro-batches in flight per replica at most (default: one per stage; 1 models an engine "
        "whose requests move through the pipeline as one batch)",
    )
    g.add_argument(
        "--max-batched-tokens",
        type=budget,
        default=None,
        help=f"serving: tokens one engine iteration may carry, decodes and prompt chunks (vLLM's "
        f"--max-num-batched-tokens, SGLang's --chunked-prefill-size; exported as planned; default: "
        f"{DEFAULT_TOKEN_BUDGET})",
    )
    g.add_argument(
        "--expert-imbalance",
        type=imbalance,
        default=1.0,
        help="serving, mixture-of-experts models: the busiest expert's tokens over the mean, >= 1; the expert "
        "GEMMs are charged as if every expert had the busiest one's (default: 1, uniform routing)",
    )
    g.add_argument(
        "--expert-load",
        default=None,
        metavar="FILE",
        help="serving, mixture-of-experts models: a measured routing histogram (YAML or JSON, tokens_per_expert: "
        "counts per expert, or one list per MoE layer) giving the imbalance factors instead of --expert-imbalance: "
        "the busiest expert's for tensor-parallel experts, the busiest member's for each dpaK group",
    )
    g.add_argument(
        "--eplb",
        type=redundant_experts,
        default=None,
        metavar="R",
        help="serving, mixture-of-experts models: the engines rebalance the experts of each dpaK group by their "
        "load (vLLM and SGLang --enable-eplb) with R redundant experts (0: rebalancing only); a group of k takes "
        "(E + R)/k experts on each member, and with --expert-load its imbalance is that of EPLB's placement "
        "(default: off, E/k consecutive experts a member)",
    )
    g.add_argument(
        "--no-dp-attention",
        dest="dp_attention",
        action="store_false",
        help="serving, mixture-of-experts models: only tensor-parallel groups (default: groups with "
        "data-parallel attention and the experts split over them are searched too, vLLM's "
        "--data-parallel-size --enable-expert-parallel, SGLang's --enable-dp-attention)",
    )
    g.add_argument(
        "--deepep",
        action="store_true",
        help="serving, mixture-of-experts models: DeepEP's kernels are installed (with NVLink between a server's "
        "GPUs and RDMA between servers): groups with data-parallel attention may also move each token to its top-k "
        "experts' members only (dpa<k>-deepep: vLLM --all2all-backend deepep_low_latency, SGLang --moe-a2a-backend "
        "deepep) instead of gathering every token on every member (default: gather only)",
    )
    g.add_argument(
        "--weights",
        default=None,
        help="serving: the decoder layers' weight format: fp16/bf16/fp32 (the activation dtype, unquantized), fp8 "
        "or int8 (W8A8), int4-awq or int4-gptq (W4A16, groups of 128 weights; int4-awq:g64 for another group "
        "size) (default: what the model config's quantization_config declares, else unquantized)",
    )
    g.add_argument(
        "--kv-cache-dtype",
        choices=KV_FORMATS,
        default=None,
        help="serving: the KV cache's dtype: auto (the activation dtype) or fp8 (default: auto)",
    )
    g.add_argument(
        "--allow-weights",
        type=_formats,
        default=(),
        help="serving: weight formats the plan may use besides --weights, comma-separated (e.g. fp8,int4-awq): "
        "each is planned and the plan with the most tokens/s is kept (quantization changes the model's outputs: "
        "only the formats named here are ever chosen)",
    )
    g.add_argument(
        "--allow-kv-cache-dtype",
        type=_formats,
        default=(),
        help="serving: KV cache dtypes the plan may use besides --kv-cache-dtype (fp8), as --allow-weights",
    )
    g.add_argument(
        "--serving-solver",
        choices=SERVING_SOLVERS,
        default="serving",
        help="serving: the planner's search (default), or write a baseline's layout as the plan",
    )


def _formats(text: str) -> tuple[str, ...]:
    """A comma-separated list of formats (each checked where the precision is built)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected one or more formats separated by commas, e.g. fp8,int4-awq")
    return names


def serving_options(args: argparse.Namespace):
    """The search's options; the counts are whole numbers of at least 1, refused by argparse otherwise."""
    if args.time_limit < 1e-3:
        raise UserError(f"--time-limit must be at least 1 ms for --objective serving, got {args.time_limit!r}", 2)
    return ServingOptions(
        allow_cpu=args.allow_cpu,
        max_tp=args.max_tp,
        exportable=args.exportable,
        max_segments=args.max_classes_per_replica,
        max_stages=args.max_stages,
        time_limit_s=args.time_limit,
        max_micro_batches=args.max_micro_batches,
        max_batched_tokens=args.max_batched_tokens or DEFAULT_TOKEN_BUDGET,
        **expert_load_options(args),
        dp_attention=args.dp_attention,
        deepep=args.deepep,
    )


def expert_load_options(args: argparse.Namespace) -> dict:
    """The imbalance factors: --expert-imbalance's, or those --expert-load's histogram gives
    (llm_planner.serving.expert_load, with --eplb's placement where asked; under uniform routing
    with --eplb, the placement's of equal loads), and --eplb."""
    eplb = args.eplb
    if args.expert_load is None and (eplb is None or args.expert_imbalance != 1.0):
        return {"expert_imbalance": args.expert_imbalance, "eplb": eplb}
    if args.expert_load is not None and args.expert_imbalance != 1.0:
        raise UserError("--expert-load and --expert-imbalance: give one (the histogram gives the factors)", 2)
    config = decoder_config(args.model)
    if args.expert_load is None:
        return _uniform_eplb(config, eplb)
    _check_eplb(config, eplb)
    load = read_expert_load(args.expert_load, config)
    return {
        "expert_imbalance": round(load.expert_imbalance(), 6),
        "dp_imbalance": load.dp_imbalance(eplb),
        "expert_picks": load.picks(config.experts_per_token),
        "eplb": eplb,
    }


def _check_eplb(config, eplb: int | None) -> None:
    """--eplb's count against the model's experts, before a placement is computed (a dense model
    is refused by the serving context, naming --eplb)."""
    if eplb is not None and config.is_moe:
        try:
            check_redundant(eplb, config.num_experts)
        except ValueError as exc:
            raise UserError(f"--eplb: {exc}", 2) from None


def _uniform_eplb(config, eplb: int) -> dict:
    """Uniform routing under EPLB: the member factors of its placement of equal loads."""
    _check_eplb(config, eplb)
    if not config.is_moe:
        return {"expert_imbalance": 1.0, "eplb": eplb}
    return {
        "expert_imbalance": 1.0,
        "dp_imbalance": ExpertLoad.uniform(config.num_experts).dp_imbalance(eplb),
        "eplb": eplb,
    }


def cmd_plan_serving(args: argparse.Namespace, console: Console) -> int:

    watch = Stopwatch()  # the whole command, its parts measured where they run (plan's timings_s)
    if args.graph is not None or args.cluster is None:
        raise UserError("--objective serving needs --cluster and a decoder --model", exit_code=2)
    with watch.part("reading_inputs"):
        workload = workload_from_flags(
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            workload_file=args.workload,
            tpot_slo=args.tpot_slo,
            ttft_slo=args.ttft_slo,
        )
        asked = serving_precision(args.model, args.dtype, args.weights, args.kv_cache_dtype)
        stated = checkpoint_weights(args.model)
        candidates = candidate_precisions(asked, args.allow_weights, args.allow_kv_cache_dtype, stated)
    options = serving_options(args)
    check_writable(args.output, ServingPlanError)
    inputs = {"--cluster": args.cluster, "--workload": args.workload, "--profile": args.profile}
    inputs |= {"--expert-load": args.expert_load, "--model": args.model if Path(args.model).is_file() else None}
    check_not_an_input(args.output, inputs, ServingPlanError)
    with progress(console, "searching serving layouts..."):
        data = plan_serving_among(
            candidates,
            cluster_path=args.cluster,
            model=args.model,
            workload=workload,
            options=options,
            output_path=args.output,
            profile_path=args.profile,
            solver=args.serving_solver,
        )
    with watch.part("writing"):
        save_serving_plan(data, args.output)
    print_serving(console, data, with_baselines=not args.no_baselines, cluster=load_cluster(args.cluster))
    console.print(f"the command {timing_text(watch.total(), _command_parts(data, watch))}", highlight=False)
    console.print(styled("plan written to ", (str(args.output), "bold")))
    return 0


def _command_parts(data: dict, watch: Stopwatch) -> dict[str, float]:
    """The plan's parts (serving.timings_s) with the command's own: the workload read with the
    inputs, and writing the file."""
    parts = {k: v for k, v in data["serving"]["timings_s"].items() if k != "total"}
    parts["reading_inputs"] += watch.parts["reading_inputs"]
    return parts | {"writing": watch.parts["writing"]}


def cmd_verify_serving(args: argparse.Namespace, console: Console) -> int:

    path = args.plan
    plan = load_serving_plan(path)
    with progress(console, "re-deriving the serving plan..."):
        problems = verify_serving_plan(plan)
    if not problems:
        sv = plan.serving
        console.print(
            styled(
                ("valid", "green"),
                f": {sv['tokens_per_s']:,.0f} tokens/s at TPOT {fmt_s(sv['tpot_s'])}, every replica's "
                f"steady state fits; bound {sv['upper_bound_tokens_per_s']:,.0f} tokens/s recomputed",
            )
        )
        return 0
    console.print(styled(("invalid serving plan", "red"), f" {path}: {len(problems)} violation(s)"))
    for line in problems:
        console.print(f"  - {line}", highlight=False)
    return 1


def check_serving_verified(plan, nothing: str) -> None:
    """What `verify` does with a serving plan, for the commands that act on one (export): exit 2 with
    its violations when it rejects the plan."""
    refuse_rejected(plan.path, verify_serving_plan(plan), nothing)


def cmd_show_serving(args: argparse.Namespace, console: Console) -> int:

    if args.gantt:
        raise UserError(
            f"--gantt: {args.plan} is a serving plan, and a serving plan has no Gantt chart; its replicas' stages, "
            "stage times and TPOT are in the table `show` prints without --gantt",
            exit_code=2,
        )
    plan = load_serving_plan(args.plan)
    print_serving(console, plan.data, with_baselines=True, cluster=_plan_cluster(plan))
    console.print(_stored_timing(plan.serving), highlight=False)
    return 0


def _plan_cluster(plan) -> ClusterSpec | None:
    """The plan's cluster spec for `show`'s notes on its kinds; None when it cannot be read or is
    not the file the plan was made from (`show` prints the plan file alone then, and `verify` says
    what is wrong with its inputs)."""
    path = plan.input_path("cluster")
    try:
        cluster = load_cluster(path) if path else None
    except (OSError, SpecError):
        return None
    return cluster if cluster is not None and cluster.sha256 == plan.data["inputs"].get("cluster_sha256") else None


def _stored_timing(sv: dict) -> str:
    """Where the planning time went, as the plan recorded it (plans written before the record
    have only the layout search's time)."""
    timings = dict(sv.get("timings_s") or {})
    if not timings:
        return f"planning: the layout search took {fmt_elapsed(sv['solve_time_s'])}"
    total = timings.pop("total", sum(timings.values()))
    return f"planning {timing_text(total, timings)}; writing the file not included"
