"""Launch a serving plan with MPI: one rank per device of its replicas, served by our runtime.

From a serving plan (`plan --objective serving`): every copy of every replica pattern is a
replica; each of its stages runs on the devices the plan assigned it (one rank each, a
tensor-parallel group's ranks together, or a data-parallel group's as the whole replica:
llm_planner.runtime.serve_dp), with the plan's layers, concurrency, micro-batches,
token budget and context (the longest request of its workload). The load is the plan's
workload (llm_planner.runtime.serve_requests): closed loop at each replica's concurrency, or
open loop at `request_rate`, until `max_requests` or `duration_s`. The hostfile, the rank
table, the mpiexec command, the error files and the watchdog are the placement launcher's
(llm_planner.launch.plan_launch.run_table); the run report is written by
llm_planner.launch.serve_report, with each replica's predicted figures from the planner's own
serving model (llm_planner.serving.score.score_replica) at the plan's operating point.

Checked before anything starts (LaunchError, exit 2, naming the file or flag): the plan's
fields and the hashes of its inputs (llm_planner.serving.verify.context_of), its precision (the
runtime runs weights and KV cache in the activation dtype only: a quantized plan is refused), the
model's type (dense gpt2, llama and qwen3, and the mixture-of-experts types of
llm_planner.runtime.decoder_tasks.MOE_FAMILIES), the plan's `model.experts` and the model against a
checkpoint's config, the devices against the cluster (a device it lacks, a node without a
hostname, more ranks on a node than its `slots`, a device in two stages), the load's flags, and
every request against the plan's context. The plan's figures are not re-derived here:
`llm-planner verify PLAN` does that.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from llm_planner.core.atomic import write_atomic
from llm_planner.core.plan_read import Fields
from llm_planner.core.precision import build_precision
from llm_planner.core.spec import ClusterSpec
from llm_planner.core.tensor_groups import GroupError, group_from_members
from llm_planner.launch.launch_text import oversubscription_notes
from llm_planner.launch.launch_types import LaunchError, LaunchOptions, LaunchResult
from llm_planner.launch.mpiexec_run import probe_port
from llm_planner.launch.plan_launch import default_workdir, run_table
from llm_planner.launch.ranks import rank_entry, rank_order
from llm_planner.launch.serve_failure import add_served, serving_failure
from llm_planner.launch.serve_report import serving_report
from llm_planner.launch.workdir_lock import run_lock
from llm_planner.runtime import decoder_tasks as dt
from llm_planner.runtime.heartbeat import INTERVAL_S
from llm_planner.runtime.serve_progress import clear_progress, read_progress
from llm_planner.runtime.serve_requests import LoadSpec, route
from llm_planner.runtime.serve_spec import ReplicaSpec, ServeSpec, StageSpec
from llm_planner.runtime.table import RankTable, RunSpec
from llm_planner.serving.context import ServingContext
from llm_planner.serving.layout import segment_of, stage_attention
from llm_planner.serving.layout_text import LayoutError
from llm_planner.serving.plan_fields import precision
from llm_planner.serving.plan_file import ServingPlanError, ServingPlanFile, load_serving_plan
from llm_planner.serving.score import ReplicaScore, score_replica
from llm_planner.serving.verify import context_of, model_precision
from llm_planner.serving.workload import RequestShape

log = logging.getLogger(__name__)

RAW_NAME = "serving_raw.json"  # in the workdir: the ranks' raw record (each request's tokens and times)
DEFAULT_REQUESTS_PER_SLOT = 2  # without --max-requests or --duration: twice each replica's concurrency


STALL_TIMEOUT_S = 60.0  # `launch --stall-timeout`'s default (llm_planner.launch.stall_watch)
MIN_STALL_S = 3 * INTERVAL_S  # at least three heartbeats (one a second): a shorter one stops healthy runs


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    dry_run: bool = False
    checkpoint: str | None = None
    report_path: str | None = None
    timeout_s: float = 600.0
    workdir: str | None = None
    extra: tuple[str, ...] = ()  # extra mpiexec arguments
    seed: int = 0  # the requests' token ids and arrivals, and seeded weights
    dtype: str | None = None  # default: the plan's
    fail_rank: int | None = None  # fault injection (tests)
    request_rate: float | None = None  # requests/s over the cluster, Poisson (open loop); None: closed loop
    max_requests: int | None = None
    duration_s: float | None = None
    prompt_len: int | None = None  # override of the plan's request shapes (one shape)
    output_len: int | None = None
    stall_timeout_s: float = STALL_TIMEOUT_S  # no heartbeat, or nothing back with requests in flight, this long: stop
    enforce_eager: bool = False  # no CUDA graphs (llm_planner.runtime.serve_graphs)


@dataclass(frozen=True, kw_only=True)
class ServePrepared:
    """The rank table and what the report needs: the plan, its context and each replica's prediction."""

    table: RankTable
    plan: ServingPlanFile
    ctx: ServingContext
    spec: ServeSpec
    scores: tuple[ReplicaScore | None, ...]  # per replica of spec.replicas, at the concurrency the run reaches
    notes: tuple[str, ...] = ()  # warnings for the report: replicas predicted off the plan's operating point


def _check_options(options: ServeOptions) -> None:
    rate = options.request_rate
    if rate is not None and not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise LaunchError(f"--request-rate: expected a positive number of requests per second, got {rate!r}")
    if options.max_requests is not None and options.max_requests < 1:
        raise LaunchError(f"--max-requests: expected at least 1 request, got {options.max_requests}")
    if options.duration_s is not None and not (math.isfinite(options.duration_s) and options.duration_s > 0):
        raise LaunchError(f"--duration: expected a positive number of seconds, got {options.duration_s}")
    for flag, value in (("--prompt-len", options.prompt_len), ("--output-len", options.output_len)):
        if value is not None and value < 1:
            raise LaunchError(f"{flag}: expected at least 1 token, got {value}")
    if not options.timeout_s > 0:
        raise LaunchError(f"--timeout: must be > 0 seconds, got {options.timeout_s}")
    if not options.stall_timeout_s >= MIN_STALL_S:
        raise LaunchError(
            f"--stall-timeout: must be at least {MIN_STALL_S:g} s (the ranks send a heartbeat every "
            f"{INTERVAL_S:g} s), got {options.stall_timeout_s:g}"
        )
    if options.duration_s is not None and options.duration_s >= options.timeout_s:
        raise LaunchError(
            f"--duration {options.duration_s:g} s: --timeout {options.timeout_s:g} s stops the whole run (its "
            "start-up included) before that; give a --timeout above --duration"
        )
    probe_port(error=LaunchError)  # how the hosts of a failed run are probed (llm_planner.launch.mpiexec_run)


def _check_experts(plan: ServingPlanFile, config, checkpoint: str | None) -> None:
    """The plan's `model.experts` must be the model's the runtime builds (the config, or the checkpoint's)."""
    stated = plan.data["model"].get("experts")
    actual = (
        {"num_experts": config.num_experts, "experts_per_token": config.experts_per_token} if config.is_moe else None
    )
    if stated != actual:
        built = f"checkpoint {checkpoint}" if checkpoint else f"model {plan.data['model']['name']}"
        raise LaunchError(
            f"{plan.path}: model.experts: the plan states {stated}, but {built} has "
            f"{actual if actual is not None else 'no experts (a dense model)'}"
        )


def _check_attention(plan: ServingPlanFile) -> None:
    """The runtime runs tensor-parallel groups, and data-parallel attention with the experts split over
    the group (`dp`, llm_planner.runtime.serve_dp) as the whole replica: one stage, one micro-batch, a
    sequence on each member at least, E/k experts a member (no redundant experts of EPLB). Anything
    else with data-parallel attention is refused, naming the field."""
    eplb = plan.data["options"].get("eplb")
    for i, rep in enumerate(plan.replicas):
        for j, seg in enumerate(rep["segments"]):
            attention, where = seg.get("attention", "tp"), f"{plan.path}: serving.replicas[{i}]"
            if attention == "tp":
                continue
            why = _dp_refusal(attention, rep, j, eplb)
            if why is not None:
                raise LaunchError(f"{where}.{why} (export the plan to vLLM or SGLang, or plan with --no-dp-attention)")


def _dp_refusal(attention: str, rep: dict, j: int, eplb: int | None) -> str | None:
    """Why the runtime cannot serve a replica with its data-parallel segment j (None: it can)."""
    seg = rep["segments"][j]
    if attention != "dp":
        return (
            f"segments[{j}].attention: {attention!r}: the runtime moves the experts' tokens with an all-gather "
            "and a reduce-scatter, not DeepEP's kernels"
        )
    if len(rep["segments"]) != 1 or seg["stages"] != 1:
        return "segments: the runtime runs data-parallel attention as the whole replica, one stage"
    if rep["micro_batches"] != 1:
        return f"micro_batches: {rep['micro_batches']}: a data-parallel stage runs one micro-batch per member"
    if rep["concurrency"] < seg["degree"]:
        return f"concurrency: {rep['concurrency']} sequences leave some of the {seg['degree']} members without one"
    if eplb:
        return f"options.eplb: {eplb} redundant experts: the runtime holds E/k experts a member, without EPLB"
    return None


def _attentions(rep: dict) -> list[str]:
    """Each stage's attention as the runtime names it: "tp", or "dp" (checked by _check_attention)."""
    return ["tp" if a == "tp" else "dp" for a in stage_attention(rep["segments"])]


def _check_precision(plan: ServingPlanFile) -> None:
    """The runtime holds weights and KV cache in the activation dtype: a plan whose model (or any
    replica) stores weights in another format or its KV cache in fp8 is refused, naming the field."""
    source = str(plan.path or "<plan>")
    fields = [("model.precision", model_precision(plan))]
    for i, rep in enumerate(plan.replicas):
        where = f"serving.replicas[{i}]"
        fields.append((f"{where}.precision", precision(Fields(rep, source, where, ServingPlanError))))
    for where, p in fields:
        if p.quantized:
            raise LaunchError(
                f"{plan.path}: {where}: weights {p.weights_label}, KV cache {p.kv_cache}: the serving runtime runs "
                f"weights and KV cache in the activation dtype ({p.activations}) only; launch a plan made without "
                "--weights, --kv-cache-dtype and --allow-* (or serve this one with an engine: `export`)"
            )


def _shapes(plan: ServingPlanFile, options: ServeOptions, context_len: int) -> tuple[tuple[int, int, float], ...]:
    """The request shapes of the load: the plan's, or one from --prompt-len / --output-len."""
    planned = tuple((r["prompt_len"], r["output_len"], float(r["weight"])) for r in plan.data["workload"]["requests"])
    if options.prompt_len is None and options.output_len is None:
        return planned
    prompt = options.prompt_len if options.prompt_len is not None else planned[0][0]
    output = options.output_len if options.output_len is not None else planned[0][1]
    if prompt + output > context_len:
        raise LaunchError(
            f"--prompt-len/--output-len: a request of {prompt} prompt + {output} output tokens = {prompt + output} "
            f"exceeds the plan's context of {context_len} tokens per sequence (its KV cache slots are sized for the "
            "longest request of its workload)"
        )
    return ((prompt, output, 1.0),)


def _model_config(plan: ServingPlanFile, options: ServeOptions, context_len: int):
    source = str(plan.path)
    try:
        config = dt.planned_decoder_config(
            {"name": plan.data["model"]["name"]}, options.checkpoint, source=source, families=dt.SERVED_FAMILIES
        )
    except dt.DecoderError as exc:
        raise LaunchError(str(exc)) from None
    _check_experts(plan, config, options.checkpoint)
    if context_len > config.max_positions:
        raise LaunchError(
            f"{source}: workload.requests: the longest request ({context_len} tokens) exceeds the model's "
            f"{config.max_positions} positions"
        )
    return config


def _served_context(plan: ServingPlanFile, ctx: ServingContext, options: ServeOptions, shapes) -> ServingContext:
    """The context a run is predicted in: the plan's, or with the request shapes the load serves
    (--prompt-len / --output-len) and the dtype it runs (--dtype) where they are not the plan's,
    so that the report sets the run beside what the model says of that run."""
    if options.prompt_len is None and options.output_len is None and options.dtype in (None, ctx.precision.activations):
        return ctx
    shaped = tuple(RequestShape(prompt_len=p, output_len=o, weight=w) for p, o, w in shapes)
    workload = replace(ctx.workload, requests=shaped)
    served = ctx.precision if options.dtype is None else build_precision(options.dtype, None, None)
    try:
        return context_of(plan, workload, served)
    except ServingPlanError as exc:
        raise LaunchError(str(exc)) from None


def _replica_rows(plan: ServingPlanFile, ctx: ServingContext) -> list[tuple[dict, list[list[str]], ReplicaScore]]:
    """(pattern, devices of each stage, prediction) of every replica: each copy of each pattern in plan order."""
    rows = []
    for i, rep in enumerate(plan.replicas):
        try:
            score = _score_at(ctx, rep, rep["concurrency"])
        except (LayoutError, KeyError) as exc:
            raise LaunchError(f"{plan.path}: serving.replicas[{i}]: {exc}") from None
        rows += [(rep, copy, score) for copy in rep["devices"]]
    return rows


def _score_at(ctx: ServingContext, rep: dict, concurrency: int) -> ReplicaScore:
    """The plan's replica pattern `rep` scored at `concurrency` (its micro-batches at most that many)."""
    layout = tuple(segment_of(s) for s in rep["segments"])
    m = min(rep["micro_batches"], concurrency)
    return score_replica(ctx, layout, concurrency=concurrency, micro_batches=m, layers=tuple(rep["layers"]))


def _stage_ranks(plan: ServingPlanFile, rows, cluster: ClusterSpec) -> tuple[list[str], dict[str, str]]:
    """The rank order of every device the replicas use, and the plan device (itself, or its group) of each."""
    copies = [
        f"serving.replicas[{i}].devices[{j}]" for i, rep in enumerate(plan.replicas) for j in range(len(rep["devices"]))
    ]
    serves: dict[str, str] = {}
    where: dict[str, str] = {}  # device -> the copy and stage it serves, as the plan's fields name them
    for copy, (_, stages, _) in zip(copies, rows, strict=True):
        for s, names in enumerate(stages):
            try:
                group = names[0] if len(names) == 1 else group_from_members(cluster, list(names))
            except GroupError as exc:
                raise LaunchError(f"{plan.path}: {copy}[{s}]: {exc}") from None
            for name in names:
                if name in serves:
                    raise LaunchError(
                        f"{plan.path}: {copy}[{s}]: device {name} serves two stages (it also serves {where[name]}); "
                        "a device runs one rank"
                    )
                serves[name], where[name] = group, f"{copy}[{s}]"
    return rank_order(list(serves), cluster, str(plan.path)), serves


def prepare_serving(plan_path: str | Path, options: ServeOptions) -> ServePrepared:
    """Every check (module docstring), then the rank table and each replica's prediction."""
    _check_options(options)
    try:
        plan = load_serving_plan(plan_path)
        _check_attention(plan)
        _check_precision(plan)
        ctx = context_of(plan)
    except ServingPlanError as exc:
        raise LaunchError(str(exc)) from None
    context_len = max(r["prompt_len"] + r["output_len"] for r in plan.data["workload"]["requests"])
    config = _model_config(plan, options, context_len)
    shapes = _shapes(plan, options, context_len)
    served_ctx = _served_context(plan, ctx, options, shapes)
    rows = _replica_rows(plan, served_ctx)
    order, serves = _stage_ranks(plan, rows, ctx.cluster)
    rank_of = {name: i for i, name in enumerate(order)}
    total = sum(score.ev.tokens_per_s for _, _, score in rows)
    replicas = []
    for rep, stages, score in rows:
        firsts = [sum(rep["layers"][:s]) for s in range(len(stages))]
        replicas.append(
            ReplicaSpec(
                pattern=rep["pattern"],
                concurrency=rep["concurrency"],
                micro_batches=rep["micro_batches"],
                share=score.ev.tokens_per_s / total if total > 0 else 1.0 / len(rows),
                stages=tuple(
                    StageSpec(ranks=tuple(rank_of[n] for n in names), first_layer=a, layers=n_layers, attention=att)
                    for names, a, n_layers, att in zip(stages, firsts, rep["layers"], _attentions(rep))
                ),
            )
        )
    max_requests = options.max_requests
    if max_requests is None and options.duration_s is None:
        max_requests = DEFAULT_REQUESTS_PER_SLOT * sum(r.concurrency for r in replicas)
    spec = ServeSpec(
        model=plan.data["model"]["name"],
        replicas=tuple(replicas),
        max_batched_tokens=int(plan.data["options"]["max_batched_tokens"]),
        context_len=context_len,
        load=LoadSpec(
            shapes=shapes, vocab_size=config.vocab_size, seed=options.seed, request_rate=options.request_rate
        ),
        max_requests=max_requests,
        duration_s=options.duration_s,
        cuda_graphs=not options.enforce_eager,
    )
    table = _rank_table(plan_path, plan, ctx.cluster, order, serves, spec, options)
    scores, notes = _scores_reached(served_ctx, rows, spec, options.max_requests is not None)
    return ServePrepared(table=table, plan=plan, ctx=ctx, spec=spec, scores=scores, notes=notes)


def _scores_reached(
    ctx: ServingContext, rows, spec: ServeSpec, given: bool
) -> tuple[tuple[ReplicaScore | None, ...], tuple[str, ...]]:
    """Each replica's prediction at the concurrency the run can reach: a closed loop stopped at
    `max_requests` (`given`: by --max-requests, else the default) routes each replica its share of them
    (llm_planner.runtime.serve_requests.route), and one given fewer than its concurrency never has
    more in flight, so it is predicted at that many, and one given none at nothing (None); a note
    says so. The others keep the plan's figures."""
    scores: list[ReplicaScore | None] = [score for _, _, score in rows]
    if spec.max_requests is None or spec.load.request_rate is not None:
        return tuple(scores), ()
    routed = Counter(route([r.share for r in spec.replicas], spec.max_requests))
    of = f"the run's {spec.max_requests} requests" + (
        "" if given else f" (the default, {DEFAULT_REQUESTS_PER_SLOT} a slot; --max-requests or --duration run more)"
    )
    notes = []
    for i, (rep, _, _) in enumerate(rows):
        reached = routed.get(i, 0)
        if reached >= rep["concurrency"]:
            continue
        if reached == 0:
            scores[i] = None
            notes.append(
                f"replica {i} ({rep['pattern']}) is routed none of {of}: it serves nothing and predicts nothing"
            )
            continue
        scores[i] = _score_at(ctx, rep, reached)
        notes.append(
            f"replica {i} ({rep['pattern']}) is routed {reached} of {of}, fewer than its planned concurrency "
            f"{rep['concurrency']}: it runs at most {reached} in flight and is predicted at {reached}, not at the "
            "plan's operating point"
        )
    return tuple(scores), tuple(notes)


def _rank_table(plan_path, plan, cluster, order, serves, spec: ServeSpec, options: ServeOptions) -> RankTable:
    entries = []
    for rank, name in enumerate(order):
        role = spec.role(rank)
        stage = spec.replicas[role.replica].stages[role.stage]
        tasks = [f"block.{i}" for i in range(stage.first_layer, stage.first_layer + stage.layers)]
        if stage.first_layer == 0:
            tasks.insert(0, "embed")
        if stage.first_layer + stage.layers == plan.data["model"]["num_layers"]:
            tasks += ["final_norm", "lm_head"]
        group = list(stage.ranks) if len(stage.ranks) > 1 else []
        entries.append(
            rank_entry(rank, name, cluster, plan_device=serves[name], group=group, tasks={str(role.replica): tasks})
        )
    if options.fail_rank is not None and not 0 <= options.fail_rank < len(entries):
        raise LaunchError(f"fail_rank {options.fail_rank} is not a rank of this run (0..{len(entries) - 1})")
    workdir = default_workdir(plan_path, LaunchOptions(workdir=options.workdir, report_path=options.report_path))
    run = RunSpec(
        plan_path=str(Path(plan_path).resolve()),
        workload="serving",
        workdir=str(workdir.resolve()),
        report_path=str(
            Path(options.report_path).resolve() if options.report_path else (workdir / "run.json").resolve()
        ),
        timeout_s=float(options.timeout_s),
        checkpoint=str(Path(options.checkpoint).resolve()) if options.checkpoint else None,
        seed=options.seed,
        dtype=options.dtype or plan.data["model"]["dtype"],
        fail_rank=options.fail_rank,
        serving=spec.to_dict(),
    )
    return RankTable(ranks=tuple(entries), run=run)


def launch_serving(plan_path: str | Path, options: ServeOptions = ServeOptions()) -> tuple[LaunchResult, dict | None]:
    """Check, write the files, run mpiexec (unless dry_run) and write the run report; (result, report)."""
    prepared = prepare_serving(plan_path, options)
    with run_lock(prepared.table.run.workdir, options.dry_run):
        if not options.dry_run:
            clear_progress(prepared.table.run.workdir)
        return _run(plan_path, prepared, options)


def _run(plan_path, prepared: ServePrepared, options: ServeOptions) -> tuple[LaunchResult, dict | None]:
    """run_table on the prepared ranks, then the run report (launch_serving)."""
    run = LaunchOptions(
        dry_run=options.dry_run,
        extra=options.extra,
        timeout_s=options.timeout_s,
        stall_timeout_s=options.stall_timeout_s,
    )
    try:
        result = run_table(prepared.table, run)
    except KeyboardInterrupt:  # the interrupted run's report keeps what was served, as a failed run's does
        workdir = prepared.table.run.workdir
        add_served(prepared.table.run.report_path, serving_report(str(plan_path), prepared, _progress(workdir)))
        raise
    if result.dry_run:
        return result, None
    if not result.ok or result.report is None:
        served = serving_report(str(plan_path), prepared, _progress(result.workdir))
        return replace(result, error=serving_failure(result.error, result.report_path, prepared.spec, served)), None
    clear_progress(result.workdir)
    raw_path = Path(result.workdir) / RAW_NAME
    write_atomic(raw_path, json.dumps(result.report) + "\n", LaunchError)
    report = serving_report(str(plan_path), prepared, result.report)
    notes = [*prepared.notes, *oversubscription_notes(result.report.get("ranks", []))]
    if notes:  # ranks that shared cores: their times are not the plan's devices'
        report["warnings"] = notes
    write_atomic(result.report_path, json.dumps(report, indent=1) + "\n", LaunchError)
    return replace(result, report=report), report


def _progress(workdir) -> dict:
    """What the replicas served so far, as the ranks' raw record has it (their progress files)."""
    return {"replicas": read_progress(workdir)}
