"""A layout for Helix's engine: the stages that maximise llm_planner.helix_engine's estimate
over a family that uses identical machines as counts, then machines assigned and written as
Helix's layout file (docs/helix.md, "Planning for Helix's engine").

The family: each machine type covers a number of consecutive-or-not layers with stages of one
width (machines per stage) whose layer counts differ by at most one; every split of the model's
layers among the types, every width and stage count a type's machines allow. A machine type
with n machines and at most m layers gives O(n^2 m) choices for a given number of layers, so
Helix's 24-machine cluster has about 150,000 layouts, all evaluated.

Order: stages are sorted from slowest to fastest per layer and dealt alternately to the front
and the back, so the slowest sit at both ends and the fastest in the middle. This is a rule,
not part of the model: on Helix's 24-machine cluster the same stages scored 277.3 decode
tokens/s under Helix's simulator in this order and 247.5 with the A100 stages first
(docs/helix.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from llm_planner.helix_engine import EngineTables, Estimate, Network, Stage, estimate
from llm_planner.helix_export import helix_layout
from llm_planner.helix_import import HelixCluster, HelixError, helix_node_name


@dataclass(frozen=True, kw_only=True)
class HelixPlan:
    stages: tuple[Stage, ...]  # in route order
    machines: tuple[tuple[str, ...], ...]  # Helix node names of each stage
    estimate: Estimate
    layouts: int  # evaluated
    solve_s: float

    def layout_text(self, num_layers: int) -> str:
        triples, first = [], 0
        for stage, nodes in zip(self.stages, self.machines):
            triples += [(node, first, first + stage.layers) for node in nodes]
            first += stage.layers
        return helix_layout(triples, num_layers=num_layers)


def type_choices(kind: str, machines: int, max_layers: int, layers: int) -> Iterator[tuple[Stage, ...]]:
    """The stages of one type covering `layers` layers: one width, counts that differ by <= 1."""
    if layers == 0:
        yield ()
        return
    for width in range(1, machines + 1):
        for count in range(math.ceil(layers / max_layers), min(machines // width, layers) + 1):
            base, extra = divmod(layers, count)
            yield tuple(Stage(kind, width, base + (i < extra)) for i in range(count))


def plan_helix(
    cluster: HelixCluster, tables: dict[str, EngineTables], num_layers: int, prompt_len: float, network: Network
) -> HelixPlan:
    """The best layout of the family (module docstring) for the machines of `cluster`."""
    started = time.monotonic()
    counts = {name: cluster.node_types.count(name) for name in sorted(set(cluster.node_types))}
    missing = [name for name in counts if name.lower() not in tables]
    if missing:
        raise HelixError(f"{cluster.source}: no tables for machine types {missing} in the model manager folder")
    kinds = [name.lower() for name in counts]
    per_kind = [
        {n: list(type_choices(k, counts[name], tables[k].max_layers, n)) for n in range(num_layers + 1)}
        for k, name in zip(kinds, counts)
    ]
    cached = lru_cache(maxsize=None)(lambda stages: estimate(list(stages), tables, prompt_len, network))
    best, best_stages, evaluated = None, None, 0
    for split in _splits(num_layers, len(kinds)):
        for parts in _product([per_kind[i][n] for i, n in enumerate(split)]):
            stages = tuple(s for part in parts for s in part)
            if not stages:
                continue
            guess = cached(tuple(sorted(stages, key=_key)))
            evaluated += 1
            if best is None or guess.tokens_per_s > best.tokens_per_s:
                best, best_stages = guess, stages
    if best is None:
        raise HelixError(f"{cluster.source}: its machines cannot hold the model's {num_layers} layers")
    ordered = order_stages(best_stages, tables)
    return HelixPlan(
        stages=ordered,
        machines=assign_machines(ordered, cluster),
        estimate=best,
        layouts=evaluated,
        solve_s=time.monotonic() - started,
    )


def _key(stage: Stage) -> tuple:
    return (stage.kind, stage.width, stage.layers)


def _splits(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _splits(total - first, parts - 1):
            yield (first, *rest)


def _product(lists: list[list]) -> Iterator[tuple]:
    if not lists:
        yield ()
        return
    for head in lists[0]:
        for tail in _product(lists[1:]):
            yield (head, *tail)


def order_stages(stages: tuple[Stage, ...], tables: dict[str, EngineTables]) -> tuple[Stage, ...]:
    """Slowest per layer at both ends, fastest in the middle (module docstring)."""
    slow_first = sorted(stages, key=lambda s: (-tables[s.kind].decode_s(1), -s.layers, s.width))
    front, back = slow_first[0::2], slow_first[1::2]
    return tuple(front + back[::-1])


def assign_machines(stages: tuple[Stage, ...], cluster: HelixCluster) -> tuple[tuple[str, ...], ...]:
    """Helix node names per stage, each type's machines in the cluster file's order."""
    free = {}
    for index, name in enumerate(cluster.node_types):
        free.setdefault(name.lower(), []).append(helix_node_name(index))
    out = []
    for stage in stages:
        out.append(tuple(free[stage.kind][: stage.width]))
        del free[stage.kind][: stage.width]
    return tuple(out)
