"""One replica scored at one operating point, no search: `llm-planner score`.

The replica's layout, its concurrency C and micro-batches m are given; its layer split is given or
is the one `ReplicaModel.split_layers` picks at (C, m). The figures are the cost model's, exactly
what a serving plan states for the same replica (llm_planner.serving.replica):

    TPOT = cycle = max(round trip, busiest stage's period)    tokens/s = C / TPOT
    TTFT from the per-iteration token budget                  decode step: the cycle with no prompt work

With `closed_loop_rounds` the replica is also run through llm_planner.serving.closed_loop: the
figures a closed-loop benchmark of C requests of the workload's one shape, all sent at once, reports
(one micro-batch: the simulation steps one iteration through every stage in turn). Where memory
does not hold C full contexts (and no split is given), a closed loop is still what an engine runs:
it admits the most sequences memory holds, `admitted`, and queues the rest. The split and the
steady-state figures are then those of `admitted` sequences, and the closed loop runs C with at
most `admitted` running, the queue's wait in its TTFT.

No TPOT or TTFT target applies (the context's workload carries the loosest target it accepts, and
nothing here reads it). A split over a stage's memory, or a C whose micro-batches overrun the
token budget, is still scored: `fits_memory` and `within_token_budget` say so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from llm_planner.serving.closed_loop import ROUNDS, ClosedLoopResult, closed_loop
from llm_planner.serving.context import ServingContext, usable_bytes
from llm_planner.serving.layout import Layout, Pattern, describe
from llm_planner.serving.layout_text import LayoutError
from llm_planner.serving.replica import ReplicaEval, ReplicaModel


@dataclass(frozen=True, kw_only=True)
class ReplicaScore:
    replica: str  # the layout as `describe` writes it
    ev: ReplicaEval
    decode_step_s: float
    usable_bytes: tuple[float, ...]  # per device of each stage
    caps: tuple[int, ...]  # the most layers each stage holds at this C and m
    within_token_budget: bool
    max_batched_tokens: int
    chunked_prefill: bool = True  # False: the engine runs prompts whole (llm_planner.cost.chunks)
    dense_layers: int = 0  # DeepSeek's dense first layers, which the first stage holds beside its share
    closed_loop: ClosedLoopResult | None = None  # a closed-loop benchmark's figures (None: not asked for)
    queued: int = 0  # of the C sent, those the engine's memory cannot hold at once (closed loop only)

    @property
    def fits_memory(self) -> bool:
        """Every stage within the layers its memory holds (the rule `split_layers` applies to a fixed split)."""
        return all(n <= c for n, c in zip(self.ev.layers, self.caps))

    def over_memory(self) -> list[int]:
        """The stages whose layers exceed what their memory holds."""
        return [s for s, (n, c) in enumerate(zip(self.ev.layers, self.caps)) if n > c]

    def to_dict(self) -> dict[str, Any]:
        """What `score --json` writes."""
        ev = self.ev
        return {
            "replica": self.replica,
            "layers": list(ev.layers),
            "concurrency": ev.concurrency + self.queued,
            "admitted": ev.concurrency,
            "micro_batches": ev.micro_batches,
            "tpot_s": ev.tpot_s,
            "tokens_per_s": ev.tokens_per_s,
            "ttft_s": ev.ttft_s,
            "decode_step_s": self.decode_step_s,
            "round_trip_s": ev.round_trip_s,
            "stage_s": list(ev.stage_s),
            "mem_bytes": list(ev.mem_bytes),
            "usable_bytes": list(self.usable_bytes),
            "fits_memory": self.fits_memory,
            "within_token_budget": self.within_token_budget,
            "max_batched_tokens": self.max_batched_tokens,
            "chunked_prefill": self.chunked_prefill,
            **({"closed_loop": asdict(self.closed_loop)} if self.closed_loop else {}),
        }


def score_replica(
    ctx: ServingContext,
    layout: Layout,
    *,
    concurrency: int,
    micro_batches: int,
    layers: tuple[int, ...] | None = None,
    closed_loop_rounds: int = 0,
    front_end_s: float = 0.0,
) -> ReplicaScore:
    """The replica's figures at (C, m) with `layers` (None: split_layers' choice), and with
    `closed_loop_rounds` a closed loop's (module docstring); LayoutError naming the flag when C < m,
    the split does not match the stages and layers, or no split fits memory."""
    if concurrency < micro_batches:
        raise LayoutError(
            f"--concurrency {concurrency} is below --micro-batches {micro_batches}: every micro-batch needs a sequence"
        )
    if closed_loop_rounds and micro_batches > 1:
        raise LayoutError(
            f"--closed-loop runs one micro-batch through the stages in turn; --micro-batches {micro_batches} is not "
            "simulated: drop one of the two"
        )
    model = ctx.replica(layout)
    split, running = _split_and_running(ctx, model, layers, concurrency, micro_batches, bool(closed_loop_rounds))
    ev = model.evaluate(split, running, micro_batches)
    return ReplicaScore(
        replica=describe(layout, ctx.by_name),
        ev=ev,
        decode_step_s=model.decode_step_s(split, running, micro_batches),
        usable_bytes=tuple(usable_bytes(ctx, Pattern(layout=layout, ev=ev))),
        caps=tuple(model.caps(running, micro_batches)),
        within_token_budget=model.within_budget(running, micro_batches),
        max_batched_tokens=ctx.tasks.token_budget,
        chunked_prefill=ctx.tasks.chunked_prefill,
        dense_layers=ctx.tasks.dense_layers,
        closed_loop=closed_loop_of(ctx, model, split, concurrency, closed_loop_rounds, running, front_end_s)
        if closed_loop_rounds
        else None,
        queued=concurrency - running,
    )


def _split_and_running(
    ctx: ServingContext, model: ReplicaModel, layers, concurrency: int, micro_batches: int, closed: bool
) -> tuple[tuple[int, ...], int]:
    """The split scored and the sequences it runs: C on the given split or split_layers' choice; in a
    closed loop where no split holds C, the most it holds (module docstring)."""
    if layers is not None:
        return _check_split(ctx, model, layers), concurrency
    if closed:  # one micro-batch (score_replica refuses more)
        split, running = queued_split(model, concurrency)
    else:
        split, running = model.split_layers(concurrency, micro_batches), concurrency
    if split is None:
        caps = tuple(model.caps(1 if closed else concurrency, micro_batches))  # closed: not even one fits
        raise LayoutError(_no_split_text(ctx, model, caps, concurrency, micro_batches, closed))
    return split, running


def queued_split(model: ReplicaModel, concurrency: int) -> tuple[tuple[int, ...] | None, int]:
    """What a closed loop of `concurrency` runs in one micro-batch: the split and the sequences it runs
    at once, all C where a split holds their full contexts, else the most some split holds (the
    engine queues the rest); (None, 0) where not one fits. Memory grows with the sequences, so the
    search halves."""
    split = model.split_layers(concurrency, 1)
    if split is not None:
        return split, concurrency
    lo, hi, held = 0, concurrency - 1, None  # held: the split of lo sequences (lo only moves to one that fits)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        found = model.split_layers(mid, 1)
        lo, hi, held = (mid, hi, found) if found is not None else (lo, mid - 1, held)
    return held, lo


def closed_loop_of(
    ctx: ServingContext,
    model: ReplicaModel,
    layers: tuple[int, ...],
    concurrency: int,
    rounds: int = ROUNDS,
    max_running: int | None = None,
    front_end_s: float = 0.0,
    token_budget: int | None = None,
) -> ClosedLoopResult:
    """The replica with `layers` in a closed loop of `concurrency` requests of the workload's one shape
    (llm_planner.serving.closed_loop), at the context's prefill mode and token budget (or
    `token_budget`), at most `max_running` of them running (None: all), through a front end of
    `front_end_s` a request."""
    shapes = ctx.workload.requests
    if len(shapes) != 1:
        raise LayoutError(f"a closed loop sends requests of one shape; the workload has {len(shapes)}")
    return closed_loop(
        lambda decodes, prompt_tokens: model.iteration_s(layers, decodes, prompt_tokens),
        concurrency=concurrency,
        prompt_len=shapes[0].prompt_len,
        output_len=shapes[0].output_len,
        token_budget=token_budget or ctx.tasks.token_budget,
        chunked_prefill=ctx.tasks.chunked_prefill,
        rounds=rounds,
        max_running=max_running,
        front_end_s=front_end_s,
    )


def _check_split(ctx: ServingContext, model: ReplicaModel, layers: tuple[int, ...]) -> tuple[int, ...]:
    total = ctx.tasks.num_layers
    if len(layers) != model.p:
        raise LayoutError(f"--layers gives {len(layers)} number(s), one per stage is needed: the replica has {model.p}")
    if min(layers) < 1:
        raise LayoutError(f"--layers {_csv(layers)}: every stage holds at least 1 layer")
    if sum(layers) != total:
        raise LayoutError(f"--layers {_csv(layers)} sums to {sum(layers)}, not the model's {total} layers")
    return tuple(layers)


def _no_split_text(
    ctx: ServingContext, model: ReplicaModel, caps: tuple[int, ...], c: int, m: int, closed: bool
) -> str:
    total = ctx.tasks.num_layers
    where = f"at --concurrency {c} with --micro-batches {m}"
    if model.p > total:
        return f"the replica has {model.p} stages for the model's {total} layers: a stage holds at least one"
    held = f"the stages hold at most {', '.join(map(str, caps))} layers (together {sum(caps)})"
    if closed:
        return f"no split of the model's {total} layers holds even one sequence's full context: {held} at 1"
    return (
        f"no split of the model's {total} layers fits memory {where}: {held}; lower --concurrency, give --layers "
        "to score a split over memory, or --closed-loop for what an engine does (run what memory holds, queue the rest)"
    )


def _csv(values) -> str:
    return ",".join(map(str, values))
