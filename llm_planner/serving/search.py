"""The serving solver: replica layouts that may mix classes, each at its best operating
point, and the fleet problem over all of them.

Candidates: every layout of up to `max_segments` classes (llm_planner.serving.layout), each
class with any offered degree and any stage count whose block packs and holds at most SPREAD
times the devices the weights need, in spec order and in the reverse order, at most
`max_stages` stages and no more stages than layers; a layout whose devices cannot hold the
weights is skipped before it is evaluated. Each is evaluated at the
best of 1, p/2 and p micro-batches with the largest feasible concurrency and a layer split
fitted to its stages (llm_planner.serving.replica). Every engineer-best layout is a candidate
too, at the operating point the baseline gives it, so the solver is never below engineer-best.
Every layout that serves within 10% of what its devices earn in the fleet LP is tried again
with one stage, and with half the stages, of its first segment moved to the end (with_ends).
The fleet problem (llm_planner.serving.fleet) then picks how many copies of each to run.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time

import numpy as np
from scipy.optimize import linprog

from llm_planner.serving.baselines import engineer_options
from llm_planner.serving.bound import device_rate_bound
from llm_planner.serving.context import ServingContext
from llm_planner.serving.engines import engine_micro_batches, layout_refusal
from llm_planner.serving.fleet import FleetChoice, solve_fleet
from llm_planner.serving.layout import Layout, Pattern, Segment, layout_usage, runs_somewhere
from llm_planner.serving.optimistic import OptimisticTokens

log = logging.getLogger(__name__)
BATCH = 100  # layouts evaluated between two renewals of the fleet LP's prices


SPREAD = 8  # a segment holds at most this many times the devices of its class that hold the weights alone


def segment_options(ctx: ServingContext, class_name: str) -> list[Segment]:
    """Every (degree, stages) of the class whose block packs, with at most SPREAD times the
    devices of the class that hold the model's weights (or one stage of the degree): so the
    candidates of a fleet do not grow with its servers (a pipeline spread thinner pays a step and
    a hand-off per stage for layers it could hold in fewer; the bound still covers every plan, so
    the gap says what this may lose)."""
    sc, opts = ctx.by_name[class_name], ctx.options
    spread = SPREAD * math.ceil(_weights_needed(ctx) / sc.kind.usable_mem_bytes)
    out = []
    for k, attention in sc.shapes:
        most = min(opts.max_stages, ctx.tasks.num_layers, sc.num_devices // k, max(1, spread // k))
        out += [Segment(class_name, k, n, attention) for n in range(1, most + 1) if sc.block_ok(n * k)]
    return out


def _weights_fit(ctx: ServingContext, layout: Layout, needed: float) -> bool:
    return sum(seg.devices * ctx.by_name[seg.class_name].kind.usable_mem_bytes for seg in layout) >= needed


def _weights_needed(ctx: ServingContext) -> float:
    """Bytes of every weight of the model: the embedding, head and norm once, the block L times, the
    dense first layers' (DeepSeek's) d times."""
    parts, layers, dense = ctx.tasks.tasks, ctx.tasks.num_layers, ctx.tasks.dense_layers
    extra = (dense - 1) * parts["dense"].weight_bytes if dense else 0.0
    return sum(t.weight_bytes for t in parts.values()) + (layers - 1) * parts["block"].weight_bytes + extra


AUTO_CANDIDATES = 2000  # --max-classes-per-replica auto: mix three classes only while the candidates stay this few


def candidate_layouts(ctx: ServingContext) -> list[Layout]:
    """Every layout of up to max_segments classes (auto: 3, or 2 when 3 would give more than
    AUTO_CANDIDATES), fewest classes first."""
    names = [c.name for c in ctx.classes]
    options = {name: segment_options(ctx, name) for name in names}
    limit = ctx.options.max_segments or 3
    needed, out = _weights_needed(ctx), []
    for r in range(1, min(limit, len(names)) + 1):
        auto = ctx.options.max_segments is None and r == 3
        level = _layouts_of(ctx, names, options, r, needed, AUTO_CANDIDATES - len(out) if auto else None)
        if level is None:
            log.info("serving search: three-class layouts left out (--max-classes-per-replica 3 to search them)")
            break
        out += level
    return out


def _layouts_of(ctx: ServingContext, names: list[str], options: dict, r: int, needed: float, cap: int | None):
    """The layouts of r classes that fit the weights, or None once there are more than cap."""
    seen, out = set(), []
    for combo in itertools.combinations(names, r):
        for order in {combo, combo[::-1]}:
            for layout in itertools.product(*(options[name] for name in order)):
                if layout in seen or sum(s.stages for s in layout) > min(ctx.options.max_stages, ctx.tasks.num_layers):
                    continue
                seen.add(layout)
                if exportable_layout(ctx, layout) and _weights_fit(ctx, layout, needed):
                    out.append(layout)
                    if cap is not None and len(out) > cap:
                        return None
    return out


def with_ends(ctx: ServingContext, layout: Layout) -> list[Layout]:
    """The layout with one stage, and with half the stages, of its first segment moved to the
    end. The first class then holds both the embedding and the head, and the classes in the
    middle only blocks: where their memory limits the sequences in flight (a stage with the head
    holds fewer layers), the replica keeps more in flight (a100-l4-t4-cloud at 200 ms: T4s at both
    ends of four A100s, 642 tokens/s against 607 with the head on an A100)."""
    first = layout[0]
    if len(layout) < 2 or first.stages < 2 or layout[-1].class_name == first.class_name:
        return []
    sc, out = ctx.by_name[first.class_name], []
    for moved in sorted({1, first.stages // 2}):
        front, back = (
            dataclasses.replace(first, stages=first.stages - moved),
            dataclasses.replace(first, stages=moved),
        )
        variant = (front, *layout[1:], back)
        if sc.block_ok(front.devices) and sc.block_ok(back.devices) and exportable_layout(ctx, variant):
            out.append(variant)
    return out


def exportable_layout(ctx: ServingContext, layout: Layout, micro_batches: int | None = None) -> bool:
    """Whether the search takes the layout: some engine runs it (layout.runs_somewhere) and, with
    --exportable, that engine's export takes every copy of it (at `micro_batches`, when given:
    llm_planner.serving.engines, the rule the export refuses by)."""
    runs = runs_somewhere(layout)
    return runs and layout_refusal(ctx.options.exportable, layout, ctx.by_name, micro_batches) is None


def evaluate_layouts(ctx: ServingContext, layouts: list[Layout], deadline: float) -> tuple[list[Pattern], int]:
    """The feasible patterns, and how many layouts were evaluated before the deadline."""
    out = []
    for i, layout in enumerate(layouts):
        if time.monotonic() > deadline:
            log.warning("serving search stopped at its time limit after %d of %d layouts", i, len(layouts))
            return out, i
        model = ctx.replica(layout)
        ev = model.best(micro_batch_options(ctx, model.p), refine=True)
        if ev is not None:
            out.append(Pattern(layout=layout, ev=ev))
    return out, len(layouts)


def _usage(patterns: list[Pattern], names: list[str]) -> np.ndarray:
    """Devices of each class (columns, in `names` order) one copy of each pattern (rows) takes."""
    return np.array([[p.usage.get(c, 0) for c in names] for p in patterns], dtype=float)


def fleet_prices(patterns: list[Pattern], capacity: dict[str, int]) -> dict[str, float]:
    """Dual prices of the fleet LP's device rows (tokens/s a device of each class is worth)."""
    names = sorted(capacity)
    if not patterns:
        return dict.fromkeys(names, 0.0)
    res = linprog(
        -np.array([p.ev.tokens_per_s for p in patterns]),
        A_ub=_usage(patterns, names).T,
        b_ub=[capacity[c] for c in names],
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0:
        return dict.fromkeys(names, 0.0)
    return {c: -float(y) for c, y in zip(names, res.ineqlin.marginals)}


def balanced_prices(
    patterns: list[Pattern], capacity: dict[str, int], prices: dict[str, float], rates: dict[str, float]
) -> dict[str, float]:
    """Among the fleet LP's optimal dual prices (`prices` is one), the ones that keep every class
    at the largest common share t of its per-device rate bound: max t s.t. every pattern is worth
    at most its devices' prices, the devices are worth the LP's value, and pi_c >= t rate_c. The
    duals of a fleet LP are often not unique, and the vertex the solver returns may price a class
    near zero, which makes any replica on it look profitable to the price bound. Classes whose
    rate bound is not finite take no such row."""
    names = sorted(capacity)
    worth = sum(capacity[c] * prices[c] for c in names)
    if not patterns or worth <= 0:
        return prices
    k = len(names)
    rows = np.vstack(
        [
            np.hstack([-_usage(patterns, names), np.zeros((len(patterns), 1))]),
            [[capacity[c] for c in names] + [0.0]],
            np.hstack([-np.eye(k), [[rates[c] if math.isfinite(rates[c]) else 0.0] for c in names]]),
        ]
    )
    limits = np.concatenate([[-p.ev.tokens_per_s for p in patterns], [worth * (1 + 1e-9)], np.zeros(k)])
    res = linprog(np.r_[np.zeros(k), -1.0], A_ub=rows, b_ub=limits, bounds=(0, None), method="highs")
    return {c: float(y) for c, y in zip(names, res.x)} if res.status == 0 else prices


def priced_order(layouts: list[Layout], prices: dict[str, float], optimistic: OptimisticTokens) -> list[Layout]:
    """Layouts that could still improve the fleet LP (optimistic value above the devices' prices), the
    largest gain per device first, then the fewest devices: copies of a small layout do what one large
    layout of the same efficiency does, and a fleet has many more large layouts than small ones."""
    scored = []
    for layout in layouts:
        gain = optimistic(layout) - sum(n * prices[c] for c, n in layout_usage(layout).items())
        if gain > 1e-9:
            devices = sum(seg.devices for seg in layout)
            scored.append((-gain / devices, devices, len(scored), layout))
    return [layout for *_, layout in sorted(scored)]


NEAR_EVEN = 0.9  # a pattern's variants are tried when it earns at least this share of its devices' prices


def near_even(found: list[Pattern], prices: dict[str, float]) -> list[Pattern]:
    """The patterns of `found` that earn at least NEAR_EVEN of what their devices are worth in
    the fleet LP (`prices`): moving a stage to the end changes a replica's tokens/s by a few
    percent, so only these may gain a place in the fleet."""
    return [p for p in found if p.ev.tokens_per_s >= NEAR_EVEN * sum(n * prices[c] for c, n in p.usage.items())]


def micro_batch_options(ctx: ServingContext, stages: int) -> list[int]:
    """Micro-batches in flight tried for a pipeline of `stages`: 1, p/2 and p, at most --max-micro-batches;
    what --exportable's engine runs (one batch per stage) when it names one."""
    fixed = engine_micro_batches(ctx.options.exportable, stages)
    if fixed is not None:
        return [fixed]
    top = min(stages, ctx.options.max_micro_batches or stages)
    return sorted({1, max(1, top // 2), top})


@dataclasses.dataclass(frozen=True)
class SearchStats:
    """How the layout search went: candidates (every layout it may evaluate, variants included),
    those evaluated, and those still worth pricing when the time limit stopped it (the rest were
    priced out: they could not improve the fleet LP)."""

    candidates: int
    evaluated: int
    left: int


def solve_serving(ctx: ServingContext, engineer: dict | None = None) -> tuple[FleetChoice, SearchStats]:
    """The best fleet found and how the search went.

    Column generation with an optimistic price check: a layout whose optimistic tokens/s does
    not exceed what its devices earn in the fleet LP (their dual prices) cannot improve the LP
    and is skipped; the others are evaluated best first, the prices renewed every `BATCH`
    layouts, until none is left or the time limit (the plan says how many were evaluated; the
    price bound measures what the layouts left out may add)."""
    started = time.monotonic()
    deadline = started + ctx.options.time_limit_s
    engineer = engineer_options(ctx) if engineer is None else engineer
    engineer_patterns = [p for found in engineer.values() for p, _ in found]
    patterns = [p for p in engineer_patterns if exportable_layout(ctx, p.layout, p.ev.micro_batches)]
    layouts = candidate_layouts(ctx)
    rates = {sc.name: device_rate_bound(ctx.cache, sc, ctx.workload.tpot_slo_s) for sc in ctx.classes}
    prices = fleet_prices(patterns, ctx.capacity)
    optimistic = OptimisticTokens(ctx)
    todo = priced_order(layouts, prices, optimistic)
    evaluated = added = 0
    while todo and time.monotonic() < deadline:
        found, done = evaluate_layouts(ctx, todo[:BATCH], deadline)
        patterns += found
        evaluated += done
        prices = fleet_prices(patterns, ctx.capacity)
        ends = [v for p in near_even(found, prices) for v in with_ends(ctx, p.layout)]
        added += len(ends)
        todo = priced_order(todo[done:] + ends, prices, optimistic)
    if todo:
        log.warning("serving search stopped at its time limit with %d layouts left to price", len(todo))
    left = max(5.0, deadline - time.monotonic())
    fleet = solve_fleet(patterns, ctx.capacity, time_limit_s=left)
    prices = balanced_prices(patterns, ctx.capacity, prices, rates)  # the last batch's LP is over every pattern
    fleet = dataclasses.replace(fleet, prices=prices)
    return fleet, SearchStats(candidates=len(layouts) + added, evaluated=evaluated, left=len(todo))
