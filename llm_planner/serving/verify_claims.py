"""The serving verifier's checks of what a plan claims beyond its replicas' figures: the model's
fields against the model the inputs name, the options against each replica's layout, the
baselines re-run, a baseline solver's plan against that baseline, and the search statistics.

The statistics (solve_time_s, layouts_evaluated, layouts_candidate, layouts_left) say how one
run of the search went and cannot be re-derived: they are accepted as non-negative numbers of
their type (llm_planner.serving.plan_fields reads them so), and as 0 for a plan a baseline
solver wrote (that run evaluates no layout of the search).
"""

from __future__ import annotations

import math
from typing import Any

from llm_planner.serving.api import fleet_summary
from llm_planner.serving.baselines import engineer_best, megatron
from llm_planner.serving.context import ServingContext
from llm_planner.serving.engines import engine_micro_batches, layout_refusal
from llm_planner.serving.layout import Layout, runs_somewhere

REL_TOL = 1e-6
BASELINE_FIGURES = ("pattern", "count", "concurrency", "micro_batches", "layers")


def close(a: Any, b: float) -> bool:
    return isinstance(a, (int, float)) and math.isclose(float(a), b, rel_tol=REL_TOL, abs_tol=1e-12)


def check_model(ctx: ServingContext, data: dict, problems: list[str]) -> None:
    model = data["model"]
    if model["num_layers"] != ctx.tasks.num_layers:
        problems.append(
            f"model.num_layers: {model['num_layers']} but {ctx.config.name} (model.name {model['name']!r}) has "
            f"{ctx.tasks.num_layers}"
        )
    cfg = ctx.config
    stated = model.get("experts")
    actual = {"num_experts": cfg.num_experts, "experts_per_token": cfg.experts_per_token} if cfg.is_moe else None
    if stated != actual:
        problems.append(
            f"model.experts: {stated} but {cfg.name} (model.name {model['name']!r}) has "
            f"{actual if actual is not None else 'no experts (a dense model)'}"
        )
    if model.get("dense_layers", 0) != cfg.first_dense_layers:
        problems.append(
            f"model.dense_layers: {model.get('dense_layers', 0)} but {cfg.name} (model.name {model['name']!r}) has "
            f"{cfg.first_dense_layers} dense first layers"
        )


def check_options(ctx: ServingContext, layout: Layout, m: int, where: str, problems: list[str]) -> None:
    """A replica of the search within the options the plan states."""
    opts, stages = ctx.options, sum(s.stages for s in layout)
    if stages > min(opts.max_stages, ctx.tasks.num_layers):
        problems.append(f"{where}.segments: {stages} stages, but options.max_stages is {opts.max_stages}")
    classes = len({s.class_name for s in layout})  # a class at both ends (search.with_ends) counts once
    if classes > (opts.max_segments or 3):
        problems.append(
            f"{where}.segments: {classes} classes in one replica, options.max_segments allows {opts.max_segments or 3}"
        )
    if not runs_somewhere(layout):
        problems.append(f"{where}.segments: a group with data-parallel attention in a pipeline, which no engine runs")
    refusal = layout_refusal(opts.exportable, layout, ctx.by_name, m)
    if refusal is not None:
        problems.append(f"{where}.segments: options.exportable {opts.exportable}: {refusal}")
    low, top = 1, min(stages, opts.max_micro_batches or stages)
    if engine_micro_batches(opts.exportable, stages) is None and not low <= m <= top:
        problems.append(
            f"{where}.micro_batches: {m}, but the options allow {low} to {top} on {stages} stage(s) "
            f"(options.max_micro_batches {opts.max_micro_batches})"
        )


def check_baselines(ctx: ServingContext, data: dict, problems: list[str]) -> None:
    """The baselines re-run; a baseline solver's plan is that baseline's fleet."""
    fleets = {"engineer-best": engineer_best(ctx), "megatron": megatron(ctx)}
    for name, fleet in fleets.items():
        _same_summary(fleet_summary(ctx, fleet), data["baselines"][name], f"baselines.{name}", problems)
    solver, sv = data["options"]["solver"], data["serving"]
    if solver == "serving":
        return
    mine = [{k: r[k] for k in BASELINE_FIGURES} for r in sv["replicas"]]
    theirs = [{k: r[k] for k in BASELINE_FIGURES} for r in fleet_summary(ctx, fleets[solver])["replicas"]]
    if mine != theirs:
        problems.append(f"serving.replicas: options.solver is {solver}, but they are not its fleet {theirs}")
    for key in ("layouts_evaluated", "layouts_candidate", "layouts_left"):
        if sv[key] != 0:
            problems.append(f"serving.{key}: {sv[key]}, but options.solver {solver} evaluates no layout of the search")


def _same_summary(want: dict, got: dict, where: str, problems: list[str]) -> None:
    if not close(got["tokens_per_s"], want["tokens_per_s"]):
        problems.append(
            f"{where}.tokens_per_s: {got['tokens_per_s']!r} but re-running it gives {want['tokens_per_s']!r}"
        )
    if len(got["replicas"]) != len(want["replicas"]):
        problems.append(
            f"{where}.replicas: {len(got['replicas'])} pattern(s), re-running it gives {len(want['replicas'])}"
        )
        return
    for i, (g, w) in enumerate(zip(got["replicas"], want["replicas"])):
        for key in (*BASELINE_FIGURES, "tpot_s", "max_mem_fraction"):
            same = close(g[key], w[key]) if key in ("tpot_s", "max_mem_fraction") else g[key] == w[key]
            if not same:
                problems.append(f"{where}.replicas[{i}].{key}: {g[key]!r} but re-running it gives {w[key]!r}")
