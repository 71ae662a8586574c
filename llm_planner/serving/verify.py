"""The independent check of a serving plan: rebuild the context from the plan's inputs and
re-derive every figure it states (docs/plan-format.md, "Serving plans").

Checked: the inputs (the cluster file's hash); each replica pattern's segments (known class,
offered degree, a block that packs) and its text (layout.describe of them), its layer split
(every layer once, at least one per stage), its concurrency and micro-batches, and every
number derived from them (tokens/s, TPOT, TTFT, round trip, stage times, memory per device)
against the model; TPOT (and TTFT,
when targeted) within the targets; every device's memory within its usable bytes; the devices:
each copy's stages on devices of the right class, a group an aligned block of one server,
consecutive stages on one server wherever the pattern's cost assumed it, no device twice;
the copies of every pattern together within each class's devices (the counts against the spec);
the totals; the upper bound recomputed, the gap and the status it supports.
"""

from __future__ import annotations

import math
from typing import Any

from llm_planner.core.tensor_groups import GroupError, group_from_members
from llm_planner.serving.bound import tokens_upper_bound
from llm_planner.serving.context import (
    OPTIMAL_GAP,
    ServingContext,
    ServingOptions,
    build_context,
    status_of,
    usable_bytes,
)
from llm_planner.serving.layout import Pattern, Segment, describe, layout_ok, same_server_after
from llm_planner.serving.plan_file import ServingPlanError, ServingPlanFile
from llm_planner.serving.workload import RequestShape, ServingWorkload

REL_TOL = 1e-6


def context_of(plan: ServingPlanFile) -> ServingContext:
    d = plan.data
    try:
        wl = d["workload"]
        workload = ServingWorkload(
            requests=tuple(RequestShape(**r) for r in wl["requests"]),
            tpot_slo_s=wl["tpot_slo_s"],
            ttft_slo_s=wl["ttft_slo_s"],
            source=f"{plan.path}: workload",
        )
        opts = {k: v for k, v in d["options"].items() if k != "solver"}
        options = ServingOptions(**opts)
    except (TypeError, KeyError) as exc:
        raise ServingPlanError(f"{plan.path}: workload/options: {exc}") from None
    cluster = plan.input_path("cluster")
    if cluster is None:
        raise ServingPlanError(f"{plan.path}: inputs.cluster: missing")
    return build_context(
        cluster, d["model"]["name"], workload, d["model"]["dtype"], options, plan.input_path("profile")
    )


def verify_serving_plan(plan: ServingPlanFile) -> list[str]:
    """Violations, one line each; [] when the plan is what its inputs give."""
    ctx = context_of(plan)
    problems: list[str] = []
    if ctx.cluster.sha256 != plan.data["inputs"]["cluster_sha256"]:
        problems.append("inputs.cluster_sha256: the cluster file changed since the plan was made")
    used: dict[str, str] = {}
    total = 0.0
    taken: dict[str, list[tuple[str, int]]] = {}  # class -> (replica, its copies' devices of the class)
    for i, rep in enumerate(plan.replicas):
        where = f"serving.replicas[{i}]"
        pattern = _check_pattern(ctx, rep, where, problems)
        if pattern is None:
            continue
        total += pattern.ev.tokens_per_s * rep["count"]
        for name, n in pattern.usage.items():
            taken.setdefault(name, []).append((where, n * rep["count"]))
        _check_devices(ctx, pattern, rep, where, used, problems)
    _check_counts(ctx, taken, problems)
    _check_totals(ctx, plan, total, problems)
    return problems


def _check_counts(ctx: ServingContext, taken: dict[str, list[tuple[str, int]]], problems: list[str]) -> None:
    """The copies of every pattern together take no more devices of a class than the cluster has."""
    for name, uses in taken.items():
        sc = ctx.by_name[name]
        need = sum(n for _, n in uses)
        if need > sc.num_devices:
            fields = ", ".join(f"{where}.count" for where, _ in uses)
            problems.append(
                f"{fields}: the copies take {need:,} devices of class {name}, which has {sc.num_devices:,} "
                f"({sc.num_servers:,} server(s) of {sc.per_server})"
            )


def _close(a: Any, b: float) -> bool:
    return isinstance(a, (int, float)) and math.isclose(float(a), b, rel_tol=REL_TOL, abs_tol=1e-12)


def _check_pattern(ctx: ServingContext, rep: dict, where: str, problems: list[str]) -> Pattern | None:
    try:
        layout = tuple(Segment(s["class"], int(s["degree"]), int(s["stages"])) for s in rep["segments"])
    except (TypeError, KeyError, ValueError) as exc:
        problems.append(f"{where}.segments: malformed ({exc})")
        return None
    for seg in layout:
        sc = ctx.by_name.get(seg.class_name)
        if sc is None or seg.degree not in sc.degrees or seg.stages < 1:
            problems.append(f"{where}.segments: class {seg.class_name!r} with degree {seg.degree} is not offered here")
            return None
    if not layout_ok(layout, ctx.by_name):
        problems.append(f"{where}.segments: a class's block of devices does not pack into its servers")
        return None
    if rep["pattern"] != describe(layout, ctx.by_name):  # the text `show` and export print
        problems.append(f"{where}.pattern: {rep['pattern']!r} but its segments read {describe(layout, ctx.by_name)!r}")
    layers, c, m = rep["layers"], rep["concurrency"], rep["micro_batches"]
    if not (
        isinstance(layers, list)
        and all(isinstance(n, int) and n >= 1 for n in layers)
        and len(layers) == sum(s.stages for s in layout)
        and sum(layers) == ctx.tasks.num_layers
    ):
        problems.append(
            f"{where}.layers: must give every stage at least one layer and add up to {ctx.tasks.num_layers}"
        )
        return None
    if not (
        isinstance(c, int)
        and isinstance(m, int)
        and 1 <= m <= c
        and isinstance(rep["count"], int)
        and rep["count"] >= 1
    ):
        problems.append(
            f"{where}: concurrency, micro_batches and count must be integers with 1 <= micro_batches <= concurrency"
        )
        return None
    ev = ctx.replica(layout).evaluate(tuple(layers), c, m)
    pattern = Pattern(layout=layout, ev=ev)
    for key, value in (
        ("tokens_per_s", ev.tokens_per_s),
        ("tpot_s", ev.tpot_s),
        ("ttft_s", ev.ttft_s),
        ("round_trip_s", ev.round_trip_s),
    ):
        if not _close(rep[key], value):
            problems.append(f"{where}.{key}: {rep[key]!r} but the model gives {value!r}")
    for key, values in (
        ("stage_s", ev.stage_s),
        ("mem_bytes", ev.mem_bytes),
        ("usable_bytes", usable_bytes(ctx, pattern)),
    ):
        if not (isinstance(rep[key], list) and len(rep[key]) == len(values) and all(map(_close, rep[key], values))):
            problems.append(f"{where}.{key}: differs from the model's {list(values)}")
    if ev.tpot_s > ctx.workload.tpot_slo_s * (1 + 1e-9):
        problems.append(
            f"{where}: TPOT {ev.tpot_s * 1e3:.4g} ms exceeds the target {ctx.workload.tpot_slo_s * 1e3:.4g} ms"
        )
    if ctx.workload.ttft_slo_s is not None and ev.ttft_s > ctx.workload.ttft_slo_s * (1 + 1e-9):
        problems.append(f"{where}: TTFT {ev.ttft_s:.4g} s exceeds the target {ctx.workload.ttft_slo_s:.4g} s")
    for s, (mem, usable) in enumerate(zip(ev.mem_bytes, usable_bytes(ctx, pattern))):
        if mem > usable * (1 + 1e-9):
            problems.append(
                f"{where}: stage {s} needs {mem:.6g} bytes per device with {c} sequences in flight, usable {usable:.6g}"
            )
    return pattern


def _check_devices(
    ctx: ServingContext, pattern: Pattern, rep: dict, where: str, used: dict, problems: list[str]
) -> None:
    copies = rep["devices"]
    if not isinstance(copies, list) or len(copies) != rep["count"]:
        problems.append(f"{where}.devices: expected one list of stages per copy ({rep['count']})")
        return
    known = ctx.cluster.device_map()
    for j, stages in enumerate(copies):
        here = f"{where}.devices[{j}]"
        expected = [seg for seg in pattern.layout for _ in range(seg.stages)]
        if not isinstance(stages, list) or len(stages) != len(expected):
            problems.append(f"{here}: expected {len(expected)} stages")
            continue
        nodes = []
        for s, (names, seg) in enumerate(zip(stages, expected)):
            nodes.append(_check_stage(ctx, known, names, seg, f"{here}[{s}]", used, problems))
        _check_neighbours(ctx, pattern, nodes, here, problems)


def _check_stage(ctx, known, names, seg: Segment, where: str, used: dict, problems: list[str]) -> str | None:
    sc = ctx.by_name[seg.class_name]
    if not (isinstance(names, list) and len(names) == seg.degree and all(isinstance(n, str) for n in names)):
        problems.append(f"{where}: expected {seg.degree} device name(s)")
        return None
    for name in names:
        d = known.get(name)
        if d is None or d.node_template != sc.template or d.kind != sc.kind.name:
            problems.append(f"{where}: {name!r} is not a device of class {sc.name}")
            return None
        if name in used:
            problems.append(f"{where}: device {name} is also used by {used[name]}")
        used[name] = where
    if seg.degree > 1:
        try:
            group_from_members(ctx.cluster, names)
        except GroupError as exc:
            problems.append(f"{where}: {exc}")
    return known[names[0]].node


def _check_neighbours(ctx, pattern: Pattern, nodes: list, where: str, problems: list[str]) -> None:
    s = 0
    for seg in pattern.layout:
        sc = ctx.by_name[seg.class_name]
        for i in range(seg.stages - 1):
            a, b = nodes[s + i], nodes[s + i + 1]
            if a is not None and b is not None and same_server_after(seg, sc, i) and a != b:
                problems.append(
                    f"{where}: stages {s + i} and {s + i + 1} were costed on one server but run on {a} and {b}"
                )
        s += seg.stages


def _prices(ctx: ServingContext, sv: dict, problems: list[str]) -> dict[str, float] | None:
    """The device prices the plan's bound used (None when stated as null: no price bound)."""
    prices = sv.get("device_prices")
    if prices is None:
        return None
    names = {sc.name for sc in ctx.classes}
    if not isinstance(prices, dict) or not all(
        isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in prices.values()
    ):
        problems.append("serving.device_prices: not a mapping of classes to finite tokens/s >= 0")
        return None
    unknown = sorted(set(prices) - names)
    if unknown:
        problems.append(f"serving.device_prices: {', '.join(unknown)} not a class of the cluster")
        return None
    return {str(k): float(v) for k, v in prices.items()}


def _check_totals(ctx: ServingContext, plan: ServingPlanFile, total: float, problems: list[str]) -> None:
    sv = plan.serving
    reps = plan.replicas
    if not _close(sv["tokens_per_s"], total):
        problems.append(f"serving.tokens_per_s: {sv['tokens_per_s']!r} but the replicas give {total!r}")
    for key, agg in (("tpot_s", max), ("ttft_s", max)):
        if reps and not _close(sv[key], agg(r[key] for r in reps if isinstance(r.get(key), (int, float)))):
            problems.append(f"serving.{key}: not the largest of the replicas'")
    if reps and sv["concurrency"] != sum(r["concurrency"] * r["count"] for r in reps):
        problems.append("serving.concurrency: not the sum over the replicas")
    bound = tokens_upper_bound(
        ctx.cache, ctx.classes, ctx.workload.tpot_slo_s, ctx.cluster.inter_node, total, _prices(ctx, sv, problems)
    )
    if not _close(sv["upper_bound_tokens_per_s"], bound):
        problems.append(f"serving.upper_bound_tokens_per_s: {sv['upper_bound_tokens_per_s']!r}, recomputed {bound!r}")
    if total > bound * (1 + 1e-9):
        problems.append(
            f"serving: {total!r} tokens/s exceeds the upper bound {bound!r} (a model defect: please report)"
        )
    gap, status = status_of(total, bound)
    if not _close(sv["gap"], gap):
        problems.append(f"serving.gap: {sv['gap']!r} but the recomputed bound gives {gap!r}")
    if sv["status"] == "optimal" and gap > OPTIMAL_GAP:
        problems.append(f"serving.status: optimal, but the gap to the recomputed bound is {gap:.2%}")
    elif sv["status"] not in ("optimal", "heuristic"):
        problems.append(f"serving.status: {sv['status']!r} is not a status")
