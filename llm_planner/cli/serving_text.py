"""What `plan` and `show` print of a serving plan: the comparison with the baselines, the replicas'
stages, the totals and the notes on the plan's kinds (docs/serving.md)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from llm_planner.core.fmt import fmt_bytes, fmt_s, styled
from llm_planner.core.precision import fp8_weight_only, precision_from_dict
from llm_planner.core.spec import ClusterSpec
from llm_planner.serving.classes import is_dp
from llm_planner.serving.layout import group_text, stage_attention
from llm_planner.serving.tasks import sequences_in_budget
from llm_planner.serving.workload import plan_workload

# a plan with no replica: the hand layouts run GPUs only, each within the TPOT target and memory
NO_REPLICA = "none: no layout on GPUs meets the TPOT target in memory (hand layouts use no CPU)"
# the plan file's solver status as the summary line words it: the bound is proven either way
STATUS_TEXT = {"optimal": "the plan is proven optimal", "heuristic": "the plan is not proven optimal"}


def print_serving(console: Console, data: dict, *, with_baselines: bool, cluster: ClusterSpec | None = None) -> None:
    wl, sv, model = data["workload"], data["serving"], data["model"]
    shape = (
        f"prompt {wl['requests'][0]['prompt_len']}, output {wl['requests'][0]['output_len']} tokens"
        if len(wl["requests"]) == 1
        else f"{len(wl['requests'])} request shapes"
    )
    ttft = f", TTFT target {fmt_s(wl['ttft_slo_s'])}" if wl["ttft_slo_s"] else ""
    console.print(
        styled(
            (model["name"], "bold"),
            f" ({_precision_text(model['precision'])}{_experts_text(data)}) serving: {shape}; "
            f"TPOT target {fmt_s(wl['tpot_slo_s'])}{ttft}",
        )
    )
    if with_baselines:
        console.print(comparison_table(data))
    console.print(replica_table(data))
    console.print(
        f"{sv['tokens_per_s']:,.0f} output tokens/s; upper bound {sv['upper_bound_tokens_per_s']:,.0f} tokens/s over "
        f"every plan (gap {sv['gap']:.1%}: {STATUS_TEXT[sv['status']]}); {_search_note(sv)}",
        highlight=False,
    )
    for row in sv.get("precisions") or ():  # a plan chosen among allowed precisions: each candidate
        console.print(
            f"  candidate {_precision_text(row['precision'])}: {row['tokens_per_s']:,.0f} tokens/s, "
            f"bound {row['upper_bound_tokens_per_s']:,.0f}",
            highlight=False,
        )
    if sv.get("unrestricted") is not None:
        console.print(compatibility_text(data), highlight=False)
    note = fp8_kernels_text(data, cluster) if cluster is not None else None
    for text in (note, budget_text(data)):
        if text:
            console.print(text, highlight=False)


def budget_text(data: dict) -> str | None:
    """A note when the per-iteration token budget, not the TPOT target or memory, stops replicas from
    holding more sequences: each micro-batch's decodes and their steady prompt share fill the budget
    (serving.replica.within_budget) while the TPOT is under its target. None otherwise."""
    wl, budget = plan_workload(data), data["options"]["max_batched_tokens"]
    most = sequences_in_budget(budget, wl.prefill_per_output, data["options"].get("chunked_prefill", True))
    capped = [
        r["pattern"]
        for r in data["serving"]["replicas"]
        if -(-r["concurrency"] // r["micro_batches"]) + 1 > most and r["tpot_s"] < 0.98 * wl.tpot_slo_s
    ]
    if not capped:
        return None
    return (
        f"the token budget (--max-batched-tokens {budget}: a micro-batch's decodes and their prompt share, "
        f"{budget / most:.3g} tokens a sequence, within it) caps the sequences in flight of {'; '.join(capped)} "
        "below what the TPOT target allows; a larger budget lets them hold more if the engine is given it too"
    )


def fp8_kernels_text(data: dict, cluster: ClusterSpec) -> str | None:
    """Which of the plan's GPU kinds run its fp8 weights weight-only (W8A16, FP8 Marlin: no fp8
    tensor cores) and which at fp8 (W8A8); None unless the weights are fp8."""
    precision = precision_from_dict(data["model"]["precision"], "model.precision")
    if precision.weights != "fp8":
        return None
    devices = cluster.device_map()
    used = {devices[d].kind for r in data["serving"]["replicas"] for copy in r["devices"] for st in copy for d in st}
    split = {True: [], False: []}
    for name in sorted(used):
        split[fp8_weight_only(precision, cluster.kind(name).peak_dtypes)].append(name)
    parts = [f"weight-only (W8A16, vLLM's FP8 Marlin; no fp8 tensor cores) on {', '.join(split[True])}"] * bool(
        split[True]
    )
    parts += [f"at fp8 (W8A8) on {', '.join(split[False])}"] * bool(split[False])
    return "fp8 weights run " + "; ".join(parts)


def _experts_text(data: dict) -> str:
    """A mixture of experts in a few words (nothing for a dense model)."""
    experts = data["model"].get("experts")
    if experts is None:
        return ""
    skew = data["options"].get("expert_imbalance", 1.0)
    dense = data["model"].get("dense_layers", 0)
    segments = [seg for rep in data["serving"]["replicas"] for seg in rep["segments"]]
    used = sorted({seg["degree"] for seg in segments if is_dp(seg.get("attention", "tp"))})  # dpaK sizes
    split = "tensor-parallel, or split over dpaK groups with data-parallel attention" if used else "tensor-parallel"
    table = data["options"].get("dp_imbalance") or {}
    members = ", ".join(f"dpa{k} {table[k]:.3g}" for k in used if k in table)
    redundant = data["options"].get("eplb")
    measured = data["options"].get("expert_picks") is not None
    source = "from a measured histogram" if measured else "EPLB's placement of uniform routing"
    eplb = f"; EPLB rebalances the dpaK groups' experts with {redundant} redundant" if redundant is not None else ""
    return (
        f"; mixture of experts: {experts['num_experts']} experts, top-{experts['experts_per_token']}, "
        f"{split}, imbalance {skew:.3g}{' (uniform routing)' if skew == 1 else ''}"
        + (f" (busiest member: {members}; {source})" if members else "")
        + (eplb if used else "")
        + (f"; {dense} dense first layers, on the first stage" if dense else "")
    )


def _precision_text(p: dict) -> str:
    """A plan's precision in a few words: the dtype alone when nothing is quantized."""
    if p["weights"] == p["activations"] == p["kv_cache"]:
        return p["activations"]
    return f"weights {p['weights']}, activations {p['activations']}, KV cache {p['kv_cache']}"


def compatibility_text(data: dict) -> str:
    """What --exportable costs: the best plan found without it beside this one."""
    sv, engine = data["serving"], data["options"]["exportable"]
    free = sv["unrestricted"]
    share = sv["tokens_per_s"] / free["tokens_per_s"] if free["tokens_per_s"] > 0 else 1.0
    lines = [
        f"without --exportable {engine}: {free['tokens_per_s']:,.0f} output tokens/s (upper bound "
        f"{free['upper_bound_tokens_per_s']:,.0f}); this plan serves {share:.1%} of it, so {engine}'s limits "
        f"cost {1 - share:.1%}; that plan runs:"
    ]
    lines += [f"  {_replica_line(r)}" for r in free["replicas"]]
    return "\n".join(lines)


def _replica_line(r: dict) -> str:
    return f"{_copies(r['count'])} of ({r['pattern']}): {r['concurrency']} in flight, TPOT {fmt_s(r['tpot_s'])}"


def comparison_table(data: dict) -> Table:
    table = Table(title="serving plans compared (same TPOT target, memory and costs)")
    for col in ("planner", "tokens/s", "vs engineer-best", "replicas (copies of a layout: sequences in flight, TPOT)"):
        table.add_column(col)
    ref = data["baselines"]["engineer-best"]["tokens_per_s"]
    rows = [("engineer-best", data["baselines"]["engineer-best"])]
    rows += [(name, b) for name, b in data["baselines"].items() if name != "engineer-best"]
    rows.append(
        ("this plan", {"tokens_per_s": data["serving"]["tokens_per_s"], "replicas": data["serving"]["replicas"]})
    )
    if data["serving"].get("unrestricted") is not None:
        rows.append((f"without --exportable {data['options']['exportable']}", data["serving"]["unrestricted"]))
    for name, b in rows:
        reps = "\n".join(_replica_line(r) for r in b["replicas"]) or NO_REPLICA
        ratio = f"{b['tokens_per_s'] / ref:.2f}x" if ref > 0 else "-"
        table.add_row(name, f"{b['tokens_per_s']:,.0f}", ratio, reps)
    return table


def _copies(n: int) -> str:
    return f"{n} cop{'y' if n == 1 else 'ies'}"


def replica_table(data: dict) -> Table:
    table = Table(title="replicas of this plan")
    for col in (
        "copies",
        "stage",
        "devices (first copy)",
        "layers",
        "concurrency",
        "micro-batches",
        "stage time",
        "TPOT",
        "TTFT est.",
        "memory / device",
    ):
        table.add_column(col)
    dense = data["model"].get("dense_layers", 0)
    for rep in data["serving"]["replicas"]:
        stages = rep["devices"][0]
        groups = stage_attention(rep["segments"])
        for s, devs in enumerate(stages):
            head = s == 0
            dev = devs[0] if len(devs) == 1 else f"{devs[0]} .. {devs[-1]} ({group_text(len(devs), groups[s])})"
            mem = f"{fmt_bytes(rep['mem_bytes'][s])} / {fmt_bytes(rep['usable_bytes'][s])}"
            table.add_row(
                str(rep["count"]) if head else "",
                str(s),
                dev,
                f"{rep['layers'][s]} + {dense} dense" if head and dense else str(rep["layers"][s]),
                str(rep["concurrency"]) if head else "",
                str(rep["micro_batches"]) if head else "",
                fmt_s(rep["stage_s"][s]),
                fmt_s(rep["tpot_s"]) if head else "",
                fmt_s(rep["ttft_s"]) if head else "",
                mem,
            )
    return table


def _search_note(sv: dict) -> str:
    """How many candidate layouts the search evaluated, and how many the time limit left."""
    note = f"the search evaluated {sv['layouts_evaluated']} of {sv['layouts_candidate']} candidate layouts"
    if sv["layouts_left"]:
        return note + f"; stopped at --time-limit with {sv['layouts_left']} still worth pricing"
    return note + (
        ", the others priced out by the fleet LP" if sv["layouts_evaluated"] < sv["layouts_candidate"] else ""
    )
