"""`plan --objective serving` from inputs to the plan file's data: build the context, run the
solver and the baselines once, bound, assign devices, and write every figure the plan states."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from llm_planner.core.plan_paths import model_paths, relative_to_plan
from llm_planner.core.precision import Precision
from llm_planner.core.timing import Stopwatch
from llm_planner.cost.serving_profile import load_serving_profile
from llm_planner.graph.hf_config import config_file_of
from llm_planner.serving.aside import ASIDE_DEVICES, Aside
from llm_planner.serving.assign import assign_devices
from llm_planner.serving.baselines import engineer_best, engineer_options, megatron
from llm_planner.serving.bound import exportable_bounds
from llm_planner.serving.context import (
    ServingContext,
    ServingOptions,
    build_context,
    profile_format_refusal,
    status_of,
    usable_bytes,
)
from llm_planner.serving.engines import layout_refusal, without_remedy
from llm_planner.serving.fleet import FleetChoice
from llm_planner.serving.layout import Pattern, describe, segment_fields
from llm_planner.serving.plan_file import SERVING_FORMAT, SERVING_VERSION, input_digest
from llm_planner.serving.precision_choice import bound_without_plan, plan_among
from llm_planner.serving.search import SearchStats, fleet_prices, segment_options, solve_serving
from llm_planner.serving.workload import ServingWorkload, WorkloadError

# As they run; unrestricted_search only with --exportable (the search without it, for its price).
# The most server classes (a node template's devices of one kind) the search plans: its layouts
# and bounds grow faster than the classes (one-GPU templates, GPT-2, on the 2-core machine under
# load: 10 classes 5 s, 20 8 s, 40 32 s, 64 75 s; docs/inputs.md). Identical servers are one template
# with `count`, planned as a count whatever their number.
MAX_SEARCH_CLASSES = 32
TIMING_PARTS = ("reading_inputs", "baselines", "layout_search", "unrestricted_search", "bounds", "assigning_devices")


def model_fields(ctx: ServingContext, name: str) -> dict:
    """A plan's `model` mapping: the name it was given by, dtype, layers (those the stages split),
    precision, and for a mixture of experts its experts and top-k and its dense first layers."""
    out = {
        "name": name,
        "dtype": ctx.precision.activations,
        "num_layers": ctx.tasks.num_layers,
        "precision": ctx.precision.to_dict(),
    }
    if ctx.config.is_moe:
        out["experts"] = {"num_experts": ctx.config.num_experts, "experts_per_token": ctx.config.experts_per_token}
    if ctx.config.first_dense_layers:  # held by the first stage beside its share of num_layers
        out["dense_layers"] = ctx.config.first_dense_layers
    return out


def replica_record(ctx: ServingContext, pattern: Pattern, count: int, devices: list) -> dict[str, Any]:
    ev = pattern.ev
    usable = usable_bytes(ctx, pattern)
    return {
        "pattern": describe(pattern.layout, ctx.by_name),
        "count": count,
        "segments": [segment_fields(s) for s in pattern.layout],
        "layers": list(ev.layers),
        "concurrency": ev.concurrency,
        "micro_batches": ev.micro_batches,
        "tokens_per_s": ev.tokens_per_s,
        "tpot_s": ev.tpot_s,
        "ttft_s": ev.ttft_s,
        "round_trip_s": ev.round_trip_s,
        "stage_s": list(ev.stage_s),
        "mem_bytes": list(ev.mem_bytes),
        "usable_bytes": usable,
        "devices": [[list(stage) for stage in copy] for copy in devices],
        "precision": ctx.precision.to_dict(),
    }


def fleet_summary(ctx: ServingContext, fleet: FleetChoice) -> dict[str, Any]:
    """What a comparison table shows of a fleet (baselines keep no devices)."""
    return {
        "tokens_per_s": fleet.tokens_per_s,
        "replicas": [
            {
                "pattern": describe(p.layout, ctx.by_name),
                "count": n,
                "concurrency": p.ev.concurrency,
                "micro_batches": p.ev.micro_batches,
                "tpot_s": p.ev.tpot_s,
                "layers": list(p.ev.layers),
                "max_mem_fraction": max(m / u for m, u in zip(p.ev.mem_bytes, usable_bytes(ctx, p))),
            }
            for p, n in fleet.chosen
        ],
    }


def plan_serving(
    *,
    cluster_path: str,
    model: str,
    workload: ServingWorkload,
    dtype: str | Precision,
    options: ServingOptions,
    output_path: str,
    profile_path: str | None = None,
    solver: str = "serving",
) -> dict[str, Any]:
    """The serving plan's data (docs/plan-format.md); raises WorkloadError when nothing serves.
    `serving.timings_s` says where the time went: reading inputs, baselines, layout search, bounds
    (what the search's child process had left when the search was done, then the rest) and
    assigning devices, each measured where it runs."""
    watch = Stopwatch()
    inputs = dict(
        cluster_path=cluster_path,
        model=model,
        workload=workload,
        dtype=dtype,
        options=options,
        profile_path=profile_path,
    )
    with watch.part("reading_inputs"):
        ctx = build_context(**inputs)
    _check_classes(ctx, cluster_path)
    fleet, stats, baselines, first_two, free = _search(ctx, inputs, solver, watch)
    if not fleet.chosen:
        raise WorkloadError(_nothing_serves(ctx))
    with watch.part("bounds"):
        prices = _prices(ctx, fleet)
        bound, free_bound = exportable_bounds(
            ctx.cache,
            ctx.classes,
            workload.tpot_slo_s,
            ctx.links,
            (fleet.tokens_per_s, prices),
            None if free is None else (free.tokens_per_s, _prices(ctx, free)),
            first_two,
        )
        gap, status = status_of(fleet.tokens_per_s, bound)
    with watch.part("assigning_devices"):
        devices = assign_devices(ctx.cluster, ctx.by_name, fleet)
        replicas = [replica_record(ctx, p, n, d) for (p, n), d in zip(fleet.chosen, devices)]
        baselines = {name: fleet_summary(ctx, f) for name, f in baselines.items()}
    timings = {name: watch.parts[name] for name in TIMING_PARTS if name in watch.parts} | {"total": watch.total()}
    return {
        "format": SERVING_FORMAT,
        "version": SERVING_VERSION,
        "objective": "serving",
        "inputs": {
            "cluster": relative_to_plan(cluster_path, output_path),
            "cluster_sha256": ctx.cluster.sha256,
            "profile": relative_to_plan(profile_path, output_path),
            "profile_sha256": input_digest(profile_path, "profile") if profile_path is not None else None,
            "model_sha256": _model_digest(model),
        },
        "model": model_paths(model_fields(ctx, model), lambda path: relative_to_plan(path, output_path), "."),
        "workload": workload.to_dict(),
        "options": _options_record(options) | {"solver": solver},
        "serving": {
            "tokens_per_s": fleet.tokens_per_s,
            "upper_bound_tokens_per_s": bound,
            "device_prices": prices,
            "gap": gap,
            "status": status,
            "tpot_s": max(p.ev.tpot_s for p, _ in fleet.chosen),
            "ttft_s": max(p.ev.ttft_s for p, _ in fleet.chosen),
            "concurrency": sum(p.ev.concurrency * n for p, n in fleet.chosen),
            "solve_time_s": watch.parts["layout_search"],
            "layouts_evaluated": stats.evaluated,
            "layouts_candidate": stats.candidates,
            "layouts_left": stats.left,
            "replicas": replicas,
            "unrestricted": None if free is None else unrestricted_record(ctx, free, _prices(ctx, free), free_bound),
            "timings_s": timings,
        },
        "baselines": baselines,
    }


def _prices(ctx: ServingContext, fleet: FleetChoice) -> dict[str, float]:
    """The device prices a fleet's bound uses: the search's, else its own patterns' fleet LP's."""
    return fleet.prices or fleet_prices([p for p, _ in fleet.chosen], ctx.capacity)


def unrestricted_record(ctx: ServingContext, fleet: FleetChoice, prices: dict, bound: float) -> dict[str, Any]:
    """serving.unrestricted: the best plan found without --exportable, what verify re-derives of it."""
    replicas = [replica_record(ctx, p, n, []) for p, n in fleet.chosen]
    return {
        "tokens_per_s": fleet.tokens_per_s,
        "upper_bound_tokens_per_s": bound,
        "device_prices": prices,
        "replicas": [{k: v for k, v in r.items() if k != "devices"} for r in replicas],
    }


def _unrestricted(ctx: ServingContext, fleet: FleetChoice, engineer: dict) -> FleetChoice:
    """The best fleet without --exportable: the search's over the unrestricted problem, or the
    exportable fleet when that search (stopped at its time limit) found less (it is a plan of
    the unrestricted problem too)."""
    free, _ = solve_serving(ctx.unrestricted(), engineer)
    return free if free.chosen and free.tokens_per_s > fleet.tokens_per_s else fleet


def _search(ctx: ServingContext, inputs: dict, solver: str, watch: Stopwatch):
    """The baselines, the solver's fleet and how its search went, the first two bounds from the
    child process beside the search (None on a small cluster: the bound computes them), and with
    --exportable the best fleet without it (else None)."""
    with watch.part("bounds"):  # the first two start in a child process beside the search
        aside = Aside(inputs) if sum(sc.num_devices for sc in ctx.classes) >= ASIDE_DEVICES else None
    try:
        with watch.part("baselines"):
            engineer = engineer_options(ctx)  # the baseline and the search's candidates, evaluated once
            baselines = {"engineer-best": engineer_best(ctx, engineer), "megatron": megatron(ctx)}
        with watch.part("layout_search"):
            if solver == "serving":
                fleet, stats = solve_serving(ctx, engineer)
            else:
                fleet, stats = baselines[solver], SearchStats(candidates=0, evaluated=0, left=0)
        free = None
        if solver == "serving" and ctx.options.exportable is not None and fleet.chosen:
            with watch.part("unrestricted_search"):
                free = _unrestricted(ctx, fleet, engineer)
        with watch.part("bounds"):
            first_two = aside() if aside is not None else None
    except BaseException:
        if aside is not None:
            aside.stop()
        raise
    return fleet, stats, baselines, first_two, free


def _model_digest(model: str) -> str | None:
    """The sha256 of the config.json the model name names (None for a preset)."""
    config = config_file_of(model)
    return input_digest(str(config), "model") if config is not None else None


def _nothing_serves(ctx: ServingContext) -> str:
    """Why no layout serves: memory for one sequence, or the TPOT target (with the best TPOT found),
    or, where that TPOT meets its target, the TTFT target (with the best TTFT found)."""
    wl, fastest, first, refusals = ctx.workload, float("inf"), float("inf"), []
    for sc in ctx.classes:
        for seg in segment_options(ctx, sc.name):
            refusals.append(layout_refusal(ctx.options.exportable, (seg,), ctx.by_name))
            model = ctx.replica((seg,))
            split = model.split_layers(1, 1)
            if split is not None:
                ev = model.evaluate(split, 1, 1)
                fastest, first = min(fastest, ev.tpot_s), min(first, ev.ttft_s)
    where = (
        f"{ctx.config.name} on cluster {ctx.cluster.name!r} "
        f"(prompt {wl.mean_prompt_len:g}, output {wl.mean_output_len:g} tokens){ctx.left_out_text()}"
    )
    if refusals and all(r is not None for r in refusals):  # with --exportable: the first class's reason
        refused = without_remedy(refusals[0])
        return (
            f"no layout serves {where}: --exportable {ctx.options.exportable} rules out every class: {refused}; "
            "plan without --exportable"
        )
    if fastest == float("inf"):
        return (
            "no layout of one class holds the weights and the KV cache of even one sequence of "
            f"{wl.kv_context:g} tokens for {where}; use shorter requests "
            "(--prompt-len/--output-len) or more memory"
        )
    if fastest <= wl.tpot_slo_s and (wl.ttft_slo_s is None or first <= wl.ttft_slo_s):
        return (
            f"no layout serves {where}, though the fastest single-class layout meets the targets with one sequence "
            f"in flight ({fastest * 1e3:.3g} ms per token): the search's other limits rule every layout out, most "
            f"often the token budget (--max-batched-tokens {ctx.tasks.token_budget}), which each iteration's decodes "
            "and prompt chunk must fit; raise it"
        )
    if wl.ttft_slo_s is not None and fastest <= wl.tpot_slo_s:
        return (
            f"--ttft-slo {wl.ttft_slo_s * 1e3:g} ms cannot be met for {where}: the fastest single-class layout "
            f"takes {first * 1e3:.3g} ms to the first token with one sequence in flight; set --ttft-slo above that"
            f"{_budget_hint(ctx)}"
        )
    return (
        f"--tpot-slo {wl.tpot_slo_s * 1e3:g} ms cannot be met for {where}: the fastest single-class layout takes "
        f"{fastest * 1e3:.3g} ms per token with one sequence in flight; set --tpot-slo above that{_budget_hint(ctx)}"
    )


def _budget_hint(ctx: ServingContext) -> str:
    """', or ...' naming --max-batched-tokens where the token budget cuts a mean prompt into several
    iterations (each one a decode step's fixed costs more on every token): '' otherwise."""
    budget, prompt = ctx.tasks.token_budget, ctx.workload.mean_prompt_len
    if budget >= prompt:
        return ""
    return (
        f", or raise --max-batched-tokens {budget} (it cuts a {prompt:g}-token prompt into "
        f"{math.ceil(prompt / budget)} iterations)"
    )


def _check_classes(ctx, cluster_path: str) -> None:
    if len(ctx.classes) > MAX_SEARCH_CLASSES:
        raise WorkloadError(
            f"{cluster_path}: nodes: the serving search plans at most {MAX_SEARCH_CLASSES} server classes (a node "
            f"template's devices of one kind) and the cluster has {len(ctx.classes)}: write identical servers as one "
            "template with `count` (docs/cluster-spec.md), which plans them as a count"
        )


def plan_serving_among(candidates: list[Precision], **inputs: Any) -> dict[str, Any]:
    """plan_serving in the best of the candidate precisions (llm_planner.serving.precision_choice),
    the others listed under serving.precisions; plan_serving itself for one candidate."""
    if len(candidates) == 1:
        return plan_serving(dtype=candidates[0], **inputs)
    _check_profile_formats(candidates, inputs.get("profile_path"))
    keys = ("cluster_path", "model", "workload", "options", "profile_path")
    context = {k: inputs.get(k) for k in keys}

    def bound_one(p: Precision) -> float:
        return bound_without_plan(lambda: build_context(**context, dtype=p))

    return plan_among(candidates, lambda p: plan_serving(dtype=p, **inputs), bound_one)


def _check_profile_formats(candidates: list[Precision], profile_path: str | None) -> None:
    """WorkloadError unless the profile times every candidate's formats: a candidate it cannot
    time would be planned without it, and its bound would not hold for the plans in it."""
    if profile_path is None:
        return
    profile = load_serving_profile(profile_path)
    for p in candidates:
        why = profile_format_refusal(profile, p)
        if why is not None:
            raise WorkloadError(
                f"--profile {profile_path}: {why} (the candidate {p.describe()} of --allow-weights / "
                "--allow-kv-cache-dtype); a profile times one format: allow only the formats it times, or "
                "plan the candidates without --profile"
            )


def fixed_plan_data(
    ctx: ServingContext, *, cluster: str, model_name: str, model_sha256: str | None, records: list[dict]
) -> dict[str, Any]:
    """A serving plan file's contents for replicas given, not searched (a layout to launch or score
    as it is: `records` from `replica_record`): its bound is its own tokens/s (status heuristic), no
    baselines and no unrestricted plan."""
    total = sum(r["tokens_per_s"] for r in records)
    return {
        "format": SERVING_FORMAT,
        "version": SERVING_VERSION,
        "objective": "serving",
        "inputs": {
            "cluster": cluster,
            "cluster_sha256": ctx.cluster.sha256,
            "profile": None,
            "profile_sha256": None,
            "model_sha256": model_sha256,
        },
        "model": model_fields(ctx, model_name),
        "workload": ctx.workload.to_dict(),
        "options": {**ctx.options.__dict__, "solver": "serving"},
        "serving": {
            "tokens_per_s": total,
            "upper_bound_tokens_per_s": total,  # not searched: the layout is fixed
            "device_prices": None,
            "gap": 0.0,
            "status": "heuristic",
            "tpot_s": max(r["tpot_s"] for r in records),
            "ttft_s": max(r["ttft_s"] for r in records),
            "concurrency": sum(r["concurrency"] for r in records),
            "solve_time_s": 0.0,
            "layouts_evaluated": 0,
            "layouts_candidate": 0,
            "layouts_left": 0,
            "replicas": records,
            "unrestricted": None,
        },
        "baselines": {name: {"tokens_per_s": 0, "replicas": []} for name in ("engineer-best", "megatron")},
    }


def _options_record(options: ServingOptions) -> dict:
    """The options as the plan file holds them (lists for tuples; expert_picks only when measured)."""
    record = dataclasses.asdict(options)
    picks = record.pop("expert_picks")
    return record | ({"expert_picks": list(picks)} if picks is not None else {})
