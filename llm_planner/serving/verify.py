"""The independent check of a serving plan: rebuild the context from the plan's inputs and
re-derive every figure it states (docs/plan-format.md, "Serving plans"). It trusts nothing the
file claims.

Before anything is parsed, every input file the plan names (the cluster, the profile, a model's
config.json) must have the sha256 the plan records (llm_planner.serving.plan_file.checked_input);
every field was read with its type and shape (llm_planner.serving.plan_fields, unknown fields
refused). Then checked: each replica pattern's segments (known class, offered degree, a block that
packs) and its `pattern` text (written from the segments), its layer split (every layer once, at
least one per stage), its concurrency and micro-batches, and every number derived from them
(tokens/s, TPOT, TTFT, round trip, stage times, memory and usable memory per device) against the
verifier's own arithmetic (llm_planner.serving.verify_replica) at relative tolerance 1e-6; TPOT (and
TTFT, when targeted) within the targets; every device's memory within its usable bytes; the
options against each layout (stages, classes per replica, micro-batches, exportable); the model's
fields against the model the inputs name; the devices: each copy's stages on devices of the right
class, a group an aligned block of one server, consecutive stages on one server wherever the
pattern's cost assumed it, no device twice; the copies of every pattern together within each
class's devices; the totals; serving.unrestricted (with --exportable: the best plan found without
it), each replica re-derived the same way within the options less --exportable, its tokens/s at
least the plan's; the upper bound recomputed (the smaller of the plan's and the unrestricted
plan's, llm_planner.serving.bound.exportable_bounds), the gap and the status it supports; the
baselines re-run (and a baseline solver's plan that baseline's fleet); the search statistics as
llm_planner.serving.verify_claims says (they cannot be re-derived).

Not yet independent of the search's code (a defect there would pass here too):
- each part's per-(class, degree) time pieces and its weight, KV and workspace bytes per device
  (llm_planner.serving.costs.StageCosts, built from llm_planner.cost.roofline and the decoder's
  tasks, llm_planner.serving.tasks.build_serving_tasks) and a measured profile's block time;
- the kernels of a layer (llm_planner.cost.iteration, and for data-parallel attention
  llm_planner.cost.dp_attention), which the verifier evaluates on its own loads;
- which link each hand-off takes (llm_planner.serving.layout.build_slots and same_server_after);
- the server classes, their degrees and blocks (llm_planner.serving.classes, layout.layout_ok);
- the upper bound (llm_planner.serving.bound.tokens_upper_bound, the same deterministic procedure)
  and the baselines (re-run by llm_planner.serving.baselines, as they are defined).
"""

from __future__ import annotations

from llm_planner.core.plan_read import Fields
from llm_planner.core.precision import Precision
from llm_planner.core.tensor_groups import GroupError, group_from_members
from llm_planner.graph.checkpoint import checkpoint_precision
from llm_planner.graph.ir import GraphError
from llm_planner.serving.bound import exportable_bounds, tokens_upper_bound
from llm_planner.serving.classes import is_dp
from llm_planner.serving.context import (
    OPTIMAL_GAP,
    ServingContext,
    ServingOptions,
    build_context,
    status_of,
)
from llm_planner.serving.expert_load import ExpertLoad
from llm_planner.serving.inputs import decoder_config
from llm_planner.serving.layout import Segment, describe, layout_ok, layout_usage, same_server_after, segment_of
from llm_planner.serving.plan_fields import precision, read_plan_fields
from llm_planner.serving.plan_file import ServingPlanError, ServingPlanFile, checked_input, checked_model
from llm_planner.serving.precision_choice import bound_without_plan, candidate_context
from llm_planner.serving.verify_claims import check_baselines, check_model, check_options, close
from llm_planner.serving.verify_replica import Derived, derive
from llm_planner.serving.workload import MOST_SEQUENCES, ServingWorkload, WorkloadError, plan_workload


def context_of(
    plan: ServingPlanFile, workload: ServingWorkload | None = None, precision: Precision | None = None
) -> ServingContext:
    """The context the plan's inputs give (with another `workload` or `precision` where given: what
    a run of the plan at other request lengths or another dtype is predicted in); every input
    file's hash checked before it is parsed."""
    d = plan.data
    cluster, profile, model = checked_input(plan, "cluster"), checked_input(plan, "profile"), checked_model(plan)
    workload = workload or plan_workload(d, source=f"{plan.path}: workload")
    # a plan without dp_attention was made before data-parallel attention was offered
    options = ServingOptions(**({"dp_attention": False} | {k: v for k, v in d["options"].items() if k != "solver"}))
    assert cluster is not None  # plan_fields requires inputs.cluster
    try:
        decoder_config(model)
    except WorkloadError as exc:
        raise ServingPlanError(f"{plan.path}: model.name: {exc}") from None
    try:
        return build_context(cluster, model, workload, precision or model_precision(plan), options, profile)
    except ValueError as exc:  # the inputs' own errors name their file; say which plan named it
        raise ServingPlanError(f"{plan.path}: inputs (model, workload, options): {exc}") from None


def model_precision(plan: ServingPlanFile):
    """The plan's model.precision (llm_planner.core.precision.Precision)."""
    return precision(Fields(plan.data["model"], str(plan.path or "<plan>"), "model", ServingPlanError))


def verify_serving_plan(plan: ServingPlanFile) -> list[str]:
    """Violations, one line each; [] when the plan is what its inputs give. ServingPlanError when it
    cannot be checked (a field of the wrong type or shape, an input file that is not the one the plan
    was made from); the data is read field by field here too, whether or not it came from a file."""
    read_plan_fields(plan.data, str(plan.path or "<plan>"), ServingPlanError)
    ctx = context_of(plan)
    problems: list[str] = []
    check_model(ctx, plan.data, problems)
    _check_checkpoint(ctx, plan.data["model"]["name"], problems)
    _check_member_factors(ctx, problems)
    used: dict[str, str] = {}
    total = 0.0
    taken: dict[str, list[tuple[str, int]]] = {}  # class -> (replica, its copies' devices of the class)
    for i, rep in enumerate(plan.replicas):
        where = f"serving.replicas[{i}]"
        if precision(Fields(rep, str(plan.path or "<plan>"), where, ServingPlanError)) != ctx.precision:
            problems.append(
                f"{where}.precision: {rep['precision']} but model.precision is {ctx.precision.to_dict()}: the search "
                "plans every replica in the model's precision"
            )
        found = _check_replica(ctx, rep, where, problems, plan.data["options"]["solver"] == "serving")
        if found is None:
            continue
        layout, derived = found
        total += derived.tokens_per_s * rep["count"]
        for name, n in layout_usage(layout).items():
            taken.setdefault(name, []).append((where, n * rep["count"]))
        _check_devices(ctx, layout, rep, where, used, problems)
    _check_counts(ctx, taken, problems)
    _check_totals(ctx, plan, total, _check_unrestricted(ctx, plan, problems), problems)
    check_baselines(ctx, plan.data, problems)
    return problems


def _check_member_factors(ctx: ServingContext, problems: list[str]) -> None:
    """options.dp_imbalance where no histogram gave it (no expert_picks): only EPLB's placement of
    uniform routing gives such factors, and they are recomputed here; a histogram's are taken as
    the plan states them (the histogram is not in the plan)."""
    options = ctx.options
    if options.expert_picks is not None or not options.dp_imbalance:
        return
    if options.eplb is None or options.expert_imbalance != 1.0:
        problems.append(
            "options.dp_imbalance: member factors without a measured router (expert_picks) come only from EPLB's "
            "placement of uniform routing (options.eplb with expert_imbalance 1)"
        )
        return
    factors = ExpertLoad.uniform(ctx.config.num_experts).dp_imbalance(options.eplb)
    if factors != {int(k): v for k, v in options.dp_imbalance.items()}:
        problems.append(
            f"options.dp_imbalance: not the factors EPLB's placement of uniform routing gives with {options.eplb} "
            f"redundant experts, {factors}"
        )


def _check_checkpoint(ctx: ServingContext, model: str, problems: list[str]) -> None:
    """The plan's weight format is the one the model's config.json declares, when it declares one."""
    try:
        ckpt = checkpoint_precision(model)
    except GraphError as exc:
        problems.append(f"model.name: {exc}")
        return
    p = ctx.precision
    if ckpt is not None and ckpt.weights is not None and (ckpt.weights, ckpt.group_size) != (p.weights, p.group_size):
        problems.append(
            f"model.precision.weights: {p.weights_label}, but {ckpt.source} declares {ckpt.weights_label} in its "
            "quantization_config"
        )


def _check_unrestricted(ctx: ServingContext, plan: ServingPlanFile, problems: list[str]) -> tuple | None:
    """serving.unrestricted (with --exportable: the best plan found without it), each replica
    re-derived as the plan's own are, within the options less --exportable; its (tokens/s, device
    prices) for the bound, None without one."""
    free, sv = plan.unrestricted, plan.serving
    wanted = plan.data["options"]["exportable"] is not None and plan.data["options"]["solver"] == "serving"
    if free is None:
        if wanted and plan.data["version"] >= 6:
            problems.append("serving.unrestricted: null, but options.exportable asks for the plan without it")
        return None
    if not wanted:
        problems.append("serving.unrestricted: recorded, but the plan was made without --exportable")
        return None
    other, total, taken = ctx.unrestricted(), 0.0, {}
    for i, rep in enumerate(free["replicas"]):
        where = f"serving.unrestricted.replicas[{i}]"
        found = _check_replica(other, rep, where, problems, True)
        if found is not None:
            total += found[1].tokens_per_s * rep["count"]
            for name, n in layout_usage(found[0]).items():
                taken.setdefault(name, []).append((where, n * rep["count"]))
    _check_counts(other, taken, problems)
    if not close(free["tokens_per_s"], total):
        problems.append(f"serving.unrestricted.tokens_per_s: {free['tokens_per_s']!r} but its replicas give {total!r}")
    if total < sv["tokens_per_s"] * (1 - 1e-9):
        problems.append(
            f"serving.unrestricted: {total!r} tokens/s, below the plan's {sv['tokens_per_s']!r} (an exportable plan "
            "is a plan of the unrestricted problem too)"
        )
    return total, _prices(ctx, free, problems, "serving.unrestricted")


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


def _check_replica(
    ctx: ServingContext, rep: dict, where: str, problems: list[str], search: bool
) -> tuple[tuple[Segment, ...], Derived] | None:
    """The replica's layout and its figures by the verifier's arithmetic; None when it has no layout here."""
    layout = tuple(segment_of(s) for s in rep["segments"])
    for seg in layout:
        sc = ctx.by_name.get(seg.class_name)
        if sc is None or (seg.degree, seg.attention) not in sc.shapes:
            what = f"degree {seg.degree}" + (" with data-parallel attention" if is_dp(seg.attention) else "")
            what += " over DeepEP (offered with --deepep)" if seg.attention == "dp-deepep" else ""
            problems.append(f"{where}.segments: class {seg.class_name!r} with {what} is not offered here")
            return None
    if not layout_ok(layout, ctx.by_name):
        problems.append(f"{where}.segments: a class's block of devices does not pack into its servers")
        return None
    if rep["pattern"] != describe(layout, ctx.by_name):
        problems.append(f"{where}.pattern: {rep['pattern']!r}, but the segments are {describe(layout, ctx.by_name)!r}")
    if search:
        check_options(ctx, layout, rep["micro_batches"], where, problems)
    c = rep["concurrency"]
    if c > MOST_SEQUENCES:
        problems.append(f"{where}.concurrency: {c:,} is over the {MOST_SEQUENCES:,} sequences a replica may hold")
        return None
    _check_budget(ctx, layout, c, rep["micro_batches"], where, problems)
    got = derive(ctx, layout, rep["layers"], c, rep["micro_batches"])
    for key in ("tokens_per_s", "tpot_s", "ttft_s", "round_trip_s"):
        if not close(rep[key], getattr(got, key)):
            problems.append(f"{where}.{key}: {rep[key]!r} but the inputs give {getattr(got, key)!r}")
    for key in ("stage_s", "mem_bytes", "usable_bytes"):
        values = getattr(got, key)
        if not (len(rep[key]) == len(values) and all(map(close, rep[key], values))):
            problems.append(f"{where}.{key}: differs from what the inputs give, {list(values)}")
    if got.tpot_s > ctx.workload.tpot_slo_s * (1 + 1e-9):
        problems.append(
            f"{where}: TPOT {got.tpot_s * 1e3:.4g} ms exceeds the target {ctx.workload.tpot_slo_s * 1e3:.4g} ms"
        )
    if ctx.workload.ttft_slo_s is not None and got.ttft_s > ctx.workload.ttft_slo_s * (1 + 1e-9):
        problems.append(f"{where}: TTFT {got.ttft_s:.4g} s exceeds the target {ctx.workload.ttft_slo_s:.4g} s")
    for s, (mem, usable) in enumerate(zip(got.mem_bytes, got.usable_bytes)):
        if mem > usable * (1 + 1e-9):
            problems.append(
                f"{where}: stage {s} needs {mem:.6g} bytes per device with {c} sequences in flight, usable {usable:.6g}"
            )
    return layout, got


def _check_budget(ctx: ServingContext, layout, c: int, m: int, where: str, problems: list[str]) -> None:
    """The replica's sequences within the engine's per-iteration token budget B, by the verifier's own
    arithmetic: a micro-batch's ceil(C/m) decodes and their steady prompt share E[P]/E[O] each fit an
    iteration (else prompts queue without end and C cannot stay in flight); for a plan made for vLLM
    (--exportable vllm) C itself within B (a rank's share of each with data-parallel attention), as
    vLLM takes no more sequences than its budget."""
    budget, ratio = ctx.options.max_batched_tokens, ctx.tasks.prefill_per_output
    b = -(-c // m)
    need = b * (1.0 + ratio) if ctx.options.chunked_prefill else float(b)
    if need > budget * (1 + 1e-9):
        problems.append(
            f"{where}.concurrency: {c:,} in {m} micro-batch(es) overruns the token budget of {budget:,}: "
            f"{b:,} decodes and their prompt share take {need:,.0f} tokens an iteration"
        )
    ranks = {seg.degree for seg in layout if is_dp(seg.attention)} or {1}
    if ctx.options.exportable == "vllm" and any(-(-c // k) > -(-budget // k) for k in ranks):
        problems.append(f"{where}.concurrency: {c:,} above the token budget of {budget:,}, which vLLM refuses")


def _check_devices(
    ctx: ServingContext, layout: tuple[Segment, ...], rep: dict, where: str, used: dict, problems: list[str]
) -> None:
    copies = rep["devices"]
    known = ctx.cluster.device_map()
    for j, stages in enumerate(copies):
        here = f"{where}.devices[{j}]"
        expected = [seg for seg in layout for _ in range(seg.stages)]
        if not isinstance(stages, list) or len(stages) != len(expected):
            problems.append(f"{here}: expected {len(expected)} stages")
            continue
        nodes = []
        for s, (names, seg) in enumerate(zip(stages, expected)):
            nodes.append(_check_stage(ctx, known, names, seg, f"{here}[{s}]", used, problems))
        _check_neighbours(ctx, layout, nodes, here, problems)


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
    if sc.spans_servers(seg.degree):  # data-parallel attention over whole servers
        servers = {}
        for name in names:
            servers.setdefault(known[name].node, []).append(name)
        if any(len(members) != sc.per_server for members in servers.values()):
            problems.append(f"{where}: a group of {seg.degree} over servers of {sc.per_server} takes them whole")
    elif seg.degree > 1:
        try:
            group_from_members(ctx.cluster, names)
        except GroupError as exc:
            problems.append(f"{where}: {exc}")
    return known[names[0]].node


def _check_neighbours(ctx, layout: tuple[Segment, ...], nodes: list, where: str, problems: list[str]) -> None:
    s = 0
    for seg in layout:
        sc = ctx.by_name[seg.class_name]
        for i in range(seg.stages - 1):
            a, b = nodes[s + i], nodes[s + i + 1]
            if a is not None and b is not None and same_server_after(seg, sc, i) and a != b:
                problems.append(
                    f"{where}: stages {s + i} and {s + i + 1} were costed on one server but run on {a} and {b}"
                )
        s += seg.stages


def _prices(ctx: ServingContext, sv: dict, problems: list[str], where: str = "serving") -> dict[str, float] | None:
    """The device prices a bound used (None when stated as null: no price bound)."""
    prices = sv.get("device_prices")
    if prices is None:
        return None
    names = {sc.name for sc in ctx.classes}
    unknown = sorted(set(prices) - names)
    if unknown:
        problems.append(f"{where}.device_prices: {', '.join(unknown)} not a class of the cluster")
        return None
    return {str(k): float(v) for k, v in prices.items()}


def _check_candidates(ctx: ServingContext, plan: ServingPlanFile, bound: float, problems: list[str]) -> float:
    """Each candidate precision's bound recomputed (llm_planner.serving.precision_choice), the plan's
    own among them with its figures; the largest of the others' (0 when there is none)."""
    rows, where = plan.serving["precisions"], str(plan.path or "<plan>")
    mine = [
        i
        for i, r in enumerate(rows)
        if precision(Fields(r, where, f"precisions[{i}]", ServingPlanError)) == ctx.precision
    ]
    if len(mine) != 1:
        problems.append("serving.precisions: the plan's own precision (model.precision) must be listed once")
    others = 0.0
    for i, row in enumerate(rows):
        p = precision(Fields(row, where, f"serving.precisions[{i}]", ServingPlanError))
        if i in mine:
            figures = (plan.serving["tokens_per_s"], bound)
            if not (close(row["tokens_per_s"], figures[0]) and close(row["upper_bound_tokens_per_s"], figures[1])):
                problems.append(f"serving.precisions[{i}]: not the plan's own tokens/s and bound")
            continue
        if row["tokens_per_s"] > plan.serving["tokens_per_s"] * (1 + 1e-9):
            problems.append(f"serving.precisions[{i}]: more tokens/s than the plan, which keeps the best candidate")
        try:
            found = _candidate_bound(ctx, p, row)
        except WorkloadError as exc:
            problems.append(f"serving.precisions[{i}]: its bound cannot be recomputed: {exc}")
            continue
        others = max(others, found)
        if not close(row["upper_bound_tokens_per_s"], found):
            problems.append(
                f"serving.precisions[{i}].upper_bound_tokens_per_s: {row['upper_bound_tokens_per_s']!r}, "
                f"recomputed {found!r}"
            )
    return others


def _candidate_bound(ctx: ServingContext, p, row: dict) -> float:
    """A candidate's bound with its stated figures (prices and tokens/s), as precision_choice made it."""

    def build() -> ServingContext:
        return ServingContext(ctx.cluster, ctx.config, ctx.workload, p, ctx.options, ctx.cache.profile)

    if row["device_prices"] is None:
        return bound_without_plan(build)
    other = candidate_context(build)
    if other is None:
        return 0.0
    prices = {str(k): float(v) for k, v in row["device_prices"].items() if k in other.by_name}
    wl = other.workload
    return tokens_upper_bound(other.cache, other.classes, wl.tpot_slo_s, other.links, row["tokens_per_s"], prices)


def _check_totals(
    ctx: ServingContext, plan: ServingPlanFile, total: float, free: tuple | None, problems: list[str]
) -> None:
    sv = plan.serving
    reps = plan.replicas
    if not close(sv["tokens_per_s"], total):
        problems.append(f"serving.tokens_per_s: {sv['tokens_per_s']!r} but the replicas give {total!r}")
    for key in ("tpot_s", "ttft_s"):
        if reps and not close(sv[key], max(r[key] for r in reps)):
            problems.append(f"serving.{key}: not the largest of the replicas'")
    if not reps:
        problems.append("serving.replicas: empty; a plan serves with at least one replica")
    if reps and sv["concurrency"] != sum(r["concurrency"] * r["count"] for r in reps):
        problems.append("serving.concurrency: not the sum over the replicas")
    bound, free_bound = exportable_bounds(
        ctx.cache,
        ctx.classes,
        ctx.workload.tpot_slo_s,
        ctx.links,
        (total, _prices(ctx, sv, problems)),
        free,
    )
    if "precisions" in sv:  # a plan made among allowed precisions: bounded by the best of them
        bound = max(bound, _check_candidates(ctx, plan, bound, problems))
    if free is not None and not close(plan.unrestricted["upper_bound_tokens_per_s"], free_bound):
        problems.append(
            f"serving.unrestricted.upper_bound_tokens_per_s: {plan.unrestricted['upper_bound_tokens_per_s']!r}, "
            f"recomputed {free_bound!r}"
        )
    if not close(sv["upper_bound_tokens_per_s"], bound):
        problems.append(f"serving.upper_bound_tokens_per_s: {sv['upper_bound_tokens_per_s']!r}, recomputed {bound!r}")
    if total > bound * (1 + 1e-9):
        why = "the problems above are its cause" if problems else "a model defect: please report"
        problems.append(f"serving: {total!r} tokens/s exceeds the upper bound {bound!r} ({why})")
    gap, status = status_of(total, bound)
    if not close(sv["gap"], gap):
        problems.append(f"serving.gap: {sv['gap']!r} but the recomputed bound gives {gap!r}")
    if sv["status"] != status:
        problems.append(
            f"serving.status: {sv['status']}, but the gap to the recomputed bound is {gap:.2%} "
            f"({status}; optimal means at most {OPTIMAL_GAP:g})"
        )
