"""The precision a plan runs in, chosen among the formats the user allows (`plan --allow-weights`,
`--allow-kv-cache-dtype`), never any other: a quantized format changes the model's outputs.

Every candidate precision (the asked one, and each allowed weight format with each allowed KV
cache dtype) is planned in full, as if asked alone (its search, baselines and bound); the plan kept
is the candidate with the most tokens/s. No plan in any candidate precision beats the largest of
the candidates' upper bounds, so that is the plan's bound, and its gap and status are taken to it.
The plan lists every candidate under `serving.precisions` (its precision, tokens/s, bound and the
device prices its bound used) so `verify` can recompute each bound; a candidate that no device
kind runs, or in which nothing serves, is listed with 0 tokens/s (and, when no kind runs it,
bound 0: no plan exists in it).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from llm_planner.core.precision import Precision, PrecisionError, build_precision
from llm_planner.serving.bound import tokens_upper_bound
from llm_planner.serving.context import ServingContext, status_of
from llm_planner.serving.workload import NoKindRunsError, WorkloadError

log = logging.getLogger(__name__)


def candidate_precisions(asked: Precision, weights: tuple[str, ...], kv: tuple[str, ...], stated: str | None):
    """The asked precision and every allowed weight format with every allowed KV cache dtype (each
    with the asked one too), the asked first; `stated`: the weight format the checkpoint declares,
    which no other format may replace (PrecisionError naming --allow-weights)."""
    if stated is not None and weights:
        raise PrecisionError(f"--allow-weights: the checkpoint's quantization_config fixes the weights at {stated}")
    kv_choices = dict.fromkeys(["auto" if asked.kv_cache == asked.activations else asked.kv_cache, *kv])
    out = []
    for w in dict.fromkeys([asked.weights_label, *weights]):
        for k in kv_choices:
            p = build_precision(asked.activations, w, k, where="--allow-weights", kv_where="--allow-kv-cache-dtype")
            if p not in out:
                out.append(p)
    return out


def plan_among(
    candidates: list[Precision],
    plan_one: Callable[[Precision], dict[str, Any]],
    bound_one: Callable[[Precision], float],
) -> dict[str, Any]:
    """The plan of the best candidate (module docstring); `plan_one(p)` plans in precision p
    (llm_planner.serving.api.plan_serving), `bound_one(p)` bounds a candidate without a plan
    (`bound_without_plan`). WorkloadError when nothing serves in any candidate."""
    plans, rows, why = [], [], []
    wasted = 0.0  # the candidates that serve nothing: finding so and bounding them
    for p in candidates:
        started = time.perf_counter()
        try:
            data = plan_one(p)
        except WorkloadError as exc:
            log.info("precision %s: %s", p.describe(), exc)
            why.append(f"{p.describe()}: {exc}")
            rows.append(_row(p, 0.0, bound_one(p), None))
            wasted += time.perf_counter() - started
            continue
        sv = data["serving"]
        plans.append(data)
        rows.append(_row(p, sv["tokens_per_s"], sv["upper_bound_tokens_per_s"], sv["device_prices"]))
    if not plans:
        raise WorkloadError("no allowed precision serves: " + "; ".join(why))
    best = max(plans, key=lambda d: d["serving"]["tokens_per_s"])
    sv = best["serving"]
    bound = max(r["upper_bound_tokens_per_s"] for r in rows)
    gap, status = status_of(sv["tokens_per_s"], bound)
    sv.update(upper_bound_tokens_per_s=bound, gap=gap, status=status, precisions=rows)
    more = {"precisions_that_serve_nothing": wasted} if wasted else {}
    sv["timings_s"] = summed_timings([d["serving"]["timings_s"] for d in plans], more)
    return best


def summed_timings(each: list[dict[str, float]], more: dict[str, float]) -> dict[str, float]:
    """Every candidate's time by part (serving.timings_s), summed over the candidates, with the
    parts in `more` (the candidates that serve nothing: the time spent finding so and bounding
    them); its total is the whole of it."""
    out: dict[str, float] = {}
    for part, seconds in [kv for t in each for kv in t.items()] + list(more.items()):
        out[part] = out.get(part, 0.0) + seconds
    out["total"] = out.get("total", 0.0) + sum(more.values())
    return out


def _row(p: Precision, tokens: float, bound: float, prices) -> dict[str, Any]:
    return {
        "precision": p.to_dict(),
        "tokens_per_s": tokens,
        "upper_bound_tokens_per_s": bound,
        "device_prices": prices,
    }


def candidate_context(build: Callable[[], ServingContext]) -> ServingContext | None:
    """A candidate precision's context; None when no device kind runs it (no plan exists in it). Any
    other WorkloadError building it is raised: it does not show that no plan exists."""
    try:
        return build()
    except NoKindRunsError:
        return None


def bound_without_plan(build: Callable[[], ServingContext]) -> float:
    """The upper bound in a precision no plan was made in: 0 when no device kind runs it (no plan
    exists), else the bound without a plan's figures (no price bound); `candidate_context` raises
    every other refusal, so no bound is made up."""
    ctx = candidate_context(build)
    if ctx is None:
        return 0.0
    return tokens_upper_bound(ctx.cache, ctx.classes, ctx.workload.tpot_slo_s, ctx.links, 0.0, None)
