"""The serving solver: replica layouts that may mix classes, each at its best operating
point, and the fleet problem over all of them.

Candidates: every layout of up to `max_segments` classes (llm_planner.serving.layout), each
class with any offered degree and any stage count whose block packs, in spec order and in
the reverse order, at most `max_stages` stages and no more stages than layers; a layout whose
devices cannot hold the weights is skipped before it is evaluated. Each is evaluated at the
best of 1, p/2 and p micro-batches with the largest feasible concurrency and a layer split
fitted to its stages (llm_planner.serving.replica). Every engineer-best layout is a candidate
too, at the operating point the baseline gives it, so the solver is never below engineer-best.
The fleet problem (llm_planner.serving.fleet) then picks how many copies of each to run.
"""

from __future__ import annotations

import itertools
import logging
import time

from llm_planner.serving.baselines import class_patterns
from llm_planner.serving.context import ServingContext
from llm_planner.serving.fleet import FleetChoice, solve_fleet
from llm_planner.serving.layout import Layout, Pattern, Segment

log = logging.getLogger(__name__)


def segment_options(ctx: ServingContext, class_name: str) -> list[Segment]:
    sc, opts = ctx.by_name[class_name], ctx.options
    degrees = sc.degrees
    out = []
    for k in degrees:
        for n in range(1, min(opts.max_stages, ctx.tasks.num_layers, sc.num_devices // k) + 1):
            if sc.block_ok(n * k):
                out.append(Segment(class_name, k, n))
    return out


def _weights_fit(ctx: ServingContext, layout: Layout) -> bool:
    room = sum(seg.devices * ctx.by_name[seg.class_name].kind.usable_mem_bytes for seg in layout)
    return room >= sum(t.weight_bytes for t in ctx.tasks.tasks.values()) + \
        (ctx.tasks.num_layers - 1) * ctx.tasks.tasks["block"].weight_bytes


def candidate_layouts(ctx: ServingContext) -> list[Layout]:
    names = [c.name for c in ctx.classes]
    options = {name: segment_options(ctx, name) for name in names}
    seen, out = set(), []
    for r in range(1, min(ctx.options.max_segments, len(names)) + 1):
        for combo in itertools.combinations(names, r):
            for order in {combo, combo[::-1]}:
                for segs in itertools.product(*(options[name] for name in order)):
                    layout = tuple(segs)
                    if layout in seen or sum(s.stages for s in layout) > min(ctx.options.max_stages, ctx.tasks.num_layers):
                        continue
                    seen.add(layout)
                    if _exportable(ctx, layout) and _weights_fit(ctx, layout):
                        out.append(layout)
    return sorted(out, key=len)  # one class first: a time limit keeps the simplest layouts


def _exportable(ctx: ServingContext, layout: Layout) -> bool:
    if ctx.options.exportable != "vllm":
        return True
    kinds = [ctx.by_name[s.class_name].kind for s in layout]
    return len({s.degree for s in layout}) == 1 and all(k.type != "cpu" for k in kinds)


def evaluate_layouts(ctx: ServingContext, layouts: list[Layout], deadline: float) -> tuple[list[Pattern], int]:
    """The feasible patterns, and how many layouts were evaluated before the deadline."""
    out = []
    for i, layout in enumerate(layouts):
        if time.monotonic() > deadline:
            log.warning("serving search stopped at its time limit after %d of %d layouts", i, len(layouts))
            return out, i
        model = ctx.replica(layout)
        micro = [model.p] if ctx.options.exportable == "vllm" else None
        ev = model.best(micro)
        if ev is not None:
            out.append(Pattern(layout=layout, ev=ev))
    return out, len(layouts)


def solve_serving(ctx: ServingContext) -> tuple[FleetChoice, int, int]:
    """The best fleet found, the layouts evaluated and the candidates (all of them unless the
    time limit stopped the search; the plan says so)."""
    started = time.monotonic()
    deadline = started + ctx.options.time_limit_s
    engineer = [p for sc in ctx.classes if sc.kind.type != "cpu" for p, _ in class_patterns(ctx, sc.name)]
    layouts = candidate_layouts(ctx)
    patterns, evaluated = evaluate_layouts(ctx, layouts, deadline)
    left = max(5.0, deadline - time.monotonic())
    return solve_fleet(engineer + patterns, ctx.capacity, time_limit_s=left), evaluated, len(layouts)
