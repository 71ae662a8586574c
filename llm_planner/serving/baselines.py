"""What an LLM-serving engineer would deploy by hand, scored by the same model.

engineer-best: every layout vLLM or SGLang can run on one class of identical servers: a
tensor-parallel degree k over GPUs of one server (one degree per replica), n pipeline stages
(inside a server, or over whole servers), the layers split evenly (vLLM's default) or as
VLLM_PP_LAYER_PARTITION would balance them, n micro-batches in flight (vLLM runs one per
pipeline stage), as many replicas as the class holds, and each replica at the largest
concurrency (--max-num-seqs) that meets the TPOT target and fits every sequence's KV cache.
Heterogeneous classes run as separate engines behind a load balancer weighted by their
tokens/s; each class takes its best layout. Never CPUs.

megatron: tensor parallelism over all GPUs of a kind in a server, pipeline over as few
servers as hold the model, replicas, the same concurrency rule.
"""

from __future__ import annotations

from llm_planner.serving.context import ServingContext
from llm_planner.serving.fleet import FleetChoice
from llm_planner.serving.layout import Pattern, Segment, runs_somewhere


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """As even as possible; the extra layers go to the stages before the last (which holds the head)."""
    base, extra = divmod(layers, stages)
    out = [base] * stages
    for i in range(extra):
        out[-2 - i if stages > 1 else 0] += 1
    return tuple(out)


def class_patterns(ctx: ServingContext, class_name: str) -> list[tuple[Pattern, int]]:
    """(pattern, replicas the class holds) for every engineer layout of one class."""
    sc = ctx.by_name[class_name]
    out = []
    for k, attention in sc.shapes:
        for n in range(1, min(ctx.tasks.num_layers, sc.num_devices // k) + 1):
            layout = (Segment(class_name, k, n, attention),)
            if not sc.block_ok(n * k) or not runs_somewhere(layout):
                continue
            cands = [ctx.best(layout, [n], even_split(ctx.tasks.num_layers, n)), ctx.best(layout, [n])]
            best = max((e for e in cands if e is not None), key=lambda e: e.tokens_per_s, default=None)
            if best is not None:
                out.append((Pattern(layout=layout, ev=best), sc.num_devices // (n * k)))
    return out


def engineer_options(ctx: ServingContext) -> dict[str, list[tuple[Pattern, int]]]:
    """class_patterns of every GPU class (the serving search takes them as candidates too)."""
    return {sc.name: class_patterns(ctx, sc.name) for sc in ctx.classes if sc.kind.type != "cpu"}


def engineer_best(ctx: ServingContext, options: dict[str, list[tuple[Pattern, int]]] | None = None) -> FleetChoice:
    """Each class's best layout (options: engineer_options, when already computed)."""
    options = engineer_options(ctx) if options is None else options
    chosen = [max(found, key=lambda pn: pn[0].ev.tokens_per_s * pn[1]) for found in options.values() if found]
    return FleetChoice(chosen=tuple(chosen))


def megatron(ctx: ServingContext) -> FleetChoice:
    chosen = []
    for sc in ctx.classes:
        if sc.kind.type == "cpu":
            continue
        k = max(sc.degrees)
        for n in range(1, sc.num_devices // k + 1):
            if not sc.block_ok(n * k):
                continue
            ev = ctx.best((Segment(sc.name, k, n),), [n], even_split(ctx.tasks.num_layers, n))
            if ev is not None:
                chosen.append((Pattern(layout=(Segment(sc.name, k, n),), ev=ev), sc.num_devices // (n * k)))
                break
    return FleetChoice(chosen=tuple(chosen))
