"""A layout for Helix's engine: the stages that maximise llm_planner.helix.engine's estimate
over a family that uses identical machines as counts, then machines assigned and written as
Helix's layout file (docs/helix.md, "Planning for Helix's engine").

The family: each machine type covers some of the layers with stages of one width (machines per
stage) whose layer counts differ by at most one; every split of the model's layers among the
types, every width and stage count a type's machines allow, within each type's max_num_layers
(148,622 layouts on Helix's 24-machine cluster with LLaMA-2 70B). llm_planner.helix.search
finds the family's best exactly without enumerating it; llm_planner.helix.chains compares it
with one chain per type side by side. On a geo cluster, `regions="route"` plans one chain over
the best set of regions instead (llm_planner.helix.regions; not the default, docs/helix.md).

Order (`ORDERS`): by default ("slow-ends") stages are sorted from slowest to fastest per layer
and dealt alternately to the front and the back, so the slowest sit at both ends and the
fastest in the middle; "fast-first" puts them fastest first. The model does not see the order:
the default is what scored better under Helix's simulator, by 1% on Helix's 24-machine
cluster (docs/helix.md). A chain of one machine type, whose stages differ only in their layer
counts, puts those with fewer layers first under either order, as Helix's own layouts of one
type do (its LLaMA-1 30B answer); under its simulator that scored 1.3% above the slow-ends order
of the same stages on its eight-L4 chain (docs/helix.md).

`layout_stages` reads a layout back as chains of stages, so the model can score a layout it did
not write, when its machines form them (each range held by machines of one type, the ranges
splitting into chains that each run from layer 0 to the last).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from llm_planner.core.fileio import read_text
from llm_planner.cost.serving_profile import LayerTable
from llm_planner.graph.hf_config import named_config
from llm_planner.helix.chains import Chains, candidate_chains, combined
from llm_planner.helix.deployments import cluster_text, deployment
from llm_planner.helix.engine import EngineTables, Estimate, Network, Stage, estimate, load_engine_tables
from llm_planner.helix.flow import flow_estimate
from llm_planner.helix.inputs import (
    HelixCluster,
    HelixError,
    default_model,
    helix_node_index,
    helix_node_name,
    load_helix_cluster,
    slowest_link,
)
from llm_planner.helix.layout_file import LayoutError, helix_layout, read_helix_layout
from llm_planner.helix.lengths import Lengths, find_helix_lengths, load_helix_lengths
from llm_planner.helix.model_card import load_model_card, model_card_path
from llm_planner.helix.regions import (
    MAX_REGIONS,
    Regions,
    assign_near,
    assign_region_machines,
    plan_regions,
    region_networks,
    route_estimate,
)
from llm_planner.helix.rules import check_helix_layout, machine_types
from llm_planner.helix.search import Kind
from llm_planner.helix.simulator_file import simulator_hops
from llm_planner.helix.typical import (
    TypicalGuesses,
    TypicalRates,
    load_prompt_table,
    load_typical_guesses,
    typical_rates,
)


@dataclass(frozen=True, kw_only=True)
class HelixPlan:
    stages: tuple[Stage, ...]  # chain after chain, each in route order
    machines: tuple[tuple[str, ...], ...]  # Helix node names of each stage
    estimate: Estimate
    layouts: int  # in the family searched
    solve_s: float
    chain_sizes: tuple[int, ...] = ()  # stages of each chain (llm_planner.helix.chains); () is one chain

    def chain_of(self) -> list[int]:
        """The chain of each stage, by index."""
        sizes = self.chain_sizes or (len(self.stages),)
        return [i for i, size in enumerate(sizes) for _ in range(size)]

    def layout_text(self, inputs: HelixInputs, chain: int | None = None) -> str:
        """Helix's layout file of the plan (of one of its chains), checked against what Helix
        accepts (llm_planner.helix.rules); machines named as in the full cluster file."""
        triples = self.chain_triples(chain)
        check_helix_layout(triples, inputs.cluster, inputs.tables, inputs.num_layers)
        return helix_layout(triples, num_layers=inputs.num_layers)

    def deployment(self, inputs: HelixInputs, chain: int) -> tuple[HelixCluster, list[tuple[str, int, int]]]:
        """The cluster a chain runs on and its machines' (node, first, end) in that cluster's names:
        the inputs' own for a plan of one chain, else the chain's machines alone
        (llm_planner.helix.deployments)."""
        triples = self.chain_triples(chain)
        return (inputs.cluster, triples) if len(self.chain_sizes) <= 1 else deployment(inputs.cluster, triples)

    def deployments(self, inputs: HelixInputs) -> list[tuple[str, str]]:
        """(cluster file, layout file) texts of each chain as its own Helix deployment."""
        out = []
        for chain in range(len(self.chain_sizes or (1,))):
            self.layout_text(inputs, chain)  # checked in the full cluster's names
            cluster, triples = self.deployment(inputs, chain)
            out.append((cluster_text(cluster), helix_layout(triples, num_layers=inputs.num_layers)))
        return out

    def chain_triples(self, chain: int | None) -> list[tuple[str, int, int]]:
        """(Helix node, first layer, end layer) of every machine (of one chain)."""
        triples, first, current = [], 0, 0
        for stage, nodes, c in zip(self.stages, self.machines, self.chain_of()):
            first, current = (0, c) if c != current else (first, current)
            if chain is None or c == chain:
                triples += [(node, first, first + stage.layers) for node in nodes]
            first += stage.layers
        return triples


ORDERS = ("slow-ends", "fast-first")
# ignore: plan as if every hop had the slowest pair's link; route: llm_planner.helix.regions (measured
# worse under Helix's simulator on 3cluster24, docs/helix.md, so not the default)
REGION_MODES = ("ignore", "route")
# The search prices every stage (width x layers of a type) for every room a stage can have, so its
# work grows with the square of the stage shapes: machines x the most layers their type's tables
# list, summed over the types, and with the number of candidates (llm_planner.helix.chains). Helix's
# 24-machine cluster has a few hundred (0.3 s), four copies of it (96 machines) a few times that
# (6.6 s, docs/inputs.md); past the limit the search is refused before it starts.
MAX_STAGE_SHAPES = 1536
# On a geo cluster the planner scores the distinct orders of a chain's stages (9 stages of 3 shapes on
# 3cluster24: 630 orders, most of its 2.6 s); past this many it keeps the default order.
MAX_GEO_ORDERS = 1000


@dataclass(frozen=True, kw_only=True)
class HelixInputs:
    """What plan-helix reads: Helix's cluster, its engine tables per machine type, the model."""

    cluster: HelixCluster
    tables: dict[str, EngineTables]
    num_layers: int
    network: Network
    guesses: TypicalGuesses | None = None  # Helix's routing statistics (llm_planner.helix.typical); None: not stated
    prompts: dict[str, LayerTable] | None = None  # per type, the prompt profile they need
    trace: Path | None = None  # the folder of Helix's request lengths (llm_planner.helix.lengths); None: not found

    def rates_for(self, cluster: HelixCluster) -> TypicalRates | None:
        """The capacities Helix's max flow routes by on `cluster` (these inputs' or a deployment's)."""
        if cluster is self.cluster:
            return self.rates
        return self._rates(cluster)

    def regions_for(self, cluster: HelixCluster) -> Regions:
        """The regions and their networks of `cluster` (these inputs' or a deployment's)."""
        return self.regions if cluster is self.cluster else region_networks(cluster, self.network.activation_bytes)

    @cached_property
    def rates(self) -> TypicalRates | None:  # the planner routes every candidate of a cluster over these
        return self._rates(self.cluster)

    @cached_property
    def lengths(self) -> Lengths | None:  # read when a replay needs them, not before
        return load_helix_lengths(self.trace) if self.trace else None

    @cached_property
    def regions(self) -> Regions:
        return region_networks(self.cluster, self.network.activation_bytes)

    def _rates(self, cluster: HelixCluster) -> TypicalRates | None:
        if self.guesses is None or self.prompts is None:
            return None
        counts = {name: cluster.node_types.count(name) for name in sorted(set(cluster.node_types))}
        return typical_rates(self.guesses, counts, self.tables, self.prompts, self.num_layers)


def load_inputs(
    cluster_path: str | Path, machine_profiles: str | Path | None, profiles_dir: str | Path, model: str | None
) -> HelixInputs:
    """Read Helix's cluster file and model manager folder; `model` defaults to the folder's."""
    cluster = load_helix_cluster(cluster_path, machine_profiles)
    num_layers, activation_bytes = model_shapes(profiles_dir, model)
    tables = {name.lower(): load_engine_tables(profiles_dir, name) for name in sorted(set(cluster.node_types))}
    bw, latency = slowest_link(cluster)
    network = Network(latency_s=latency, bw_bytes_per_s=bw, activation_bytes=activation_bytes)
    guesses = load_typical_guesses(model_card_path(profiles_dir))  # Helix's routing, when its files state it
    types = sorted(set(cluster.node_types))
    prompts = {m.lower(): load_prompt_table(profiles_dir, m) for m in types} if guesses else None
    trace = find_helix_lengths(profiles_dir) if guesses else None
    inputs = HelixInputs(
        cluster=cluster,
        tables=tables,
        num_layers=num_layers,
        network=network,
        guesses=guesses,
        prompts=prompts,
        trace=trace,
    )
    inputs.rates  # noqa: B018 (every type the cluster has must be routable, as Helix's own code requires)
    return inputs


def model_shapes(profiles_dir: str | Path, model: str | None) -> tuple[int, int]:
    """(layers, bytes of a token's hidden state): `model` (a preset or config.json) when given,
    else what Helix's folder states (llm_planner.helix.model_card), else the preset named after it."""
    card = None if model else load_model_card(profiles_dir)
    if card is not None:
        return card.num_layers, int(card.activation_bytes)
    name = model or default_model(profiles_dir)
    config = named_config(name)
    if config is None:
        raise HelixError(
            f"--model {name!r}: not a decoder preset, a config.json or a folder holding one, and "
            f"{model_card_path(profiles_dir)} (Helix's statistics of the model) is not there to read instead"
        )
    return config.num_layers, 2 * config.hidden_size


def score_layout(inputs: HelixInputs, layout_path: str | Path, prompt_len: float, simulator_cluster=None):
    """(stages, machines, stages per chain, Estimate) of a Helix layout file Helix accepts, run as one
    deployment on the inputs' cluster (score_ranges, over the links of Helix's own `simulator_cluster`
    file when given, llm_planner.helix.simulator_file); HelixError for one Helix would refuse."""
    hops = simulator_hops(simulator_cluster) if simulator_cluster else None
    return score_ranges(inputs, read_checked_layout(inputs, layout_path), str(layout_path), prompt_len, hops)


def score_ranges(inputs: HelixInputs, ranges: dict[str, tuple[int, int]], source: str, prompt_len: float, hops=None):
    """score_layout of a layout's checked ranges (read from `source`): routed by a max flow with
    Helix's own capacities (llm_planner.helix.flow) when its files state them, else by the chain
    model when its ranges split into chains of one-type stages, else by a max flow at the machines'
    batch-limit rates. Stages, machines and chains are empty for a layout that is not chains (or
    routed over `hops`, the links of Helix's own simulator cluster file)."""
    routed = lambda: flow_estimate(  # noqa: E731
        ranges, inputs.cluster, inputs.tables, inputs.num_layers, prompt_len, inputs.regions, inputs.rates, hops
    )
    if hops is not None:  # Helix's own graph for the layout: routed over it whatever its shape
        return (), (), (), routed()
    try:
        stages, machines, sizes = layout_stages(ranges, inputs.cluster, inputs.tables, inputs.num_layers, source)
    except HelixError:
        return (), (), (), routed()
    if inputs.guesses is not None:  # Helix's routing is known: the layout as one deployment, routed by it
        return stages, machines, sizes, routed()
    per_chain, first = [], 0
    for size in sizes:
        per_chain.append(estimate(list(stages[first : first + size]), inputs.tables, prompt_len, inputs.network))
        first += size
    return stages, machines, sizes, combined(per_chain)


def read_checked_layout(inputs: HelixInputs, layout_path: str | Path) -> dict[str, tuple[int, int]]:
    """A layout file's ranges by Helix node name; HelixError for one Helix would refuse."""
    try:
        ranges = read_helix_layout(read_text(layout_path, HelixError), source=str(layout_path))
    except LayoutError as exc:
        raise HelixError(str(exc)) from None
    try:
        return check_helix_layout(ranges, inputs.cluster, inputs.tables, inputs.num_layers)
    except LayoutError as exc:
        raise HelixError(f"{layout_path}: Helix would refuse it: {exc}") from None


def plan_helix(inputs: HelixInputs, prompt_len: float, order: str = "slow-ends", regions: str = "ignore") -> HelixPlan:
    """The best layout of the family (module docstring) for the machines of the cluster by the routed
    estimate; with regions="route" on a geo cluster, one chain over the best set of regions
    (llm_planner.helix.regions)."""
    return max(helix_candidates(inputs, prompt_len, order, regions), key=lambda p: p.estimate.tokens_per_s)


def helix_candidates(
    inputs: HelixInputs, prompt_len: float, order: str = "slow-ends", regions: str = "ignore"
) -> list[HelixPlan]:
    """Every candidate plan (llm_planner.helix.chains: one chain, one per type, k equal chains), each
    with its routed estimate; `layouts` is the family's total and `solve_s` the search's time."""
    started = time.monotonic()
    cluster, tables, num_layers, network = inputs.cluster, inputs.tables, inputs.num_layers, inputs.network
    counts = {name: cluster.node_types.count(name) for name in sorted(set(cluster.node_types))}
    missing = [name for name in counts if name.lower() not in tables]
    if missing:
        raise HelixError(f"{cluster.source}: no tables for machine types {missing} in the model manager folder")
    shapes = sum(n * tables[name.lower()].max_layers for name, n in counts.items())
    if shapes > MAX_STAGE_SHAPES:
        raise HelixError(
            f"{cluster.source}: {len(cluster.node_types):,} machines make {shapes:,} stage shapes to search "
            f"(machines x the most layers their type's tables list, summed over the types); the limit is "
            f"{MAX_STAGE_SHAPES:,} (docs/inputs.md)"
        )
    if regions not in REGION_MODES:
        raise ValueError(f"regions must be one of {REGION_MODES}, got {regions!r}")
    found_regions = inputs.regions
    if regions == "route" and len(found_regions.members) > 1:
        return [_plan_geo(inputs, found_regions, prompt_len, order, started)]
    kinds = [Kind(name.lower(), n, tables[name.lower()]) for name, n in counts.items()]
    plans = [_as_plan(found, inputs, order) for found in candidate_chains(kinds, num_layers, prompt_len, network)]
    if not plans:
        raise HelixError(f"{cluster.source}: its machines cannot hold the model's {num_layers} layers")
    if len(found_regions.members) > 1:  # a geo cluster: each one-chain candidate in its best region-aware order
        plans = [_geo_order(p, inputs, found_regions, prompt_len) if len(p.chain_sizes) <= 1 else p for p in plans]
    routed = [routed_estimate(plan, inputs, prompt_len) for plan in plans]
    layouts, elapsed = sum(p.layouts for p in plans), time.monotonic() - started
    return [replace(p, estimate=r, layouts=layouts, solve_s=elapsed) for p, r in zip(plans, routed)]


def _geo_order(plan: HelixPlan, inputs: HelixInputs, regions, prompt_len: float) -> HelixPlan:
    """On a geo cluster, the plan's stages in the order (of at most MAX_GEO_ORDERS distinct ones,
    machines taken near the previous stage's region: regions.assign_near) whose routed estimate is
    highest, the plan as it is included."""
    best, best_rate = plan, routed_estimate(plan, inputs, prompt_len).tokens_per_s
    for order in _distinct_orders(plan.stages, MAX_GEO_ORDERS):
        candidate = replace(plan, stages=order, machines=assign_near(order, inputs.cluster, regions))
        rate = routed_estimate(candidate, inputs, prompt_len).tokens_per_s
        if rate > best_rate:
            best, best_rate = candidate, rate
    return best


def _distinct_orders(stages: tuple[Stage, ...], cap: int) -> list[tuple[Stage, ...]]:
    """Distinct orders of `stages` (equal stages not told apart); [] when there are more than `cap`."""
    counts: dict[Stage, int] = {}
    for stage in stages:
        counts[stage] = counts.get(stage, 0) + 1
    total = math.factorial(len(stages))
    for n in counts.values():
        total //= math.factorial(n)
    if total > cap:
        return []
    out: list[tuple[Stage, ...]] = []

    def extend(prefix: list[Stage]) -> None:
        if len(prefix) == len(stages):
            out.append(tuple(prefix))
            return
        for stage in list(counts):
            if counts[stage]:
                counts[stage] -= 1
                extend([*prefix, stage])
                counts[stage] += 1

    extend([])
    return out


def _as_plan(found: Chains, inputs: HelixInputs, order: str) -> HelixPlan:
    """A candidate's chains, ordered and given machines (the estimate its chain model's)."""
    ordered = tuple(s for chain in found.chains for s in order_stages(chain, inputs.tables, order))
    return HelixPlan(
        stages=ordered,
        machines=assign_machines(ordered, inputs.cluster),
        estimate=found.estimate,
        layouts=found.layouts,
        solve_s=0.0,
        chain_sizes=tuple(len(chain) for chain in found.chains),
    )


def routed_estimate(plan: HelixPlan, inputs: HelixInputs, prompt_len: float) -> Estimate:
    """The plan's decode tokens/s with each deployment routed as Helix routes it: a max flow with
    Helix's own capacities over its own cluster file (llm_planner.helix.flow; the cluster file
    given for a plan of one chain), the deployments' rates summed. The chain model's estimate
    when Helix's files do not state its routing statistics."""
    if inputs.guesses is None:
        return plan.estimate
    parts = []
    for chain in range(len(plan.chain_sizes or (1,))):
        cluster, triples = plan.deployment(inputs, chain)
        ranges = {node: (a, b) for node, a, b in triples}
        regions, rates = inputs.regions_for(cluster), inputs.rates_for(cluster)
        parts.append(flow_estimate(ranges, cluster, inputs.tables, inputs.num_layers, prompt_len, regions, rates))
    return combined(parts)


def _plan_geo(inputs: HelixInputs, regions, prompt_len: float, order: str, started: float) -> HelixPlan:
    """One chain over the best set of regions, region after region (llm_planner.helix.regions)."""
    if len(regions.members) > MAX_REGIONS:
        raise HelixError(
            f"{inputs.cluster.source}: {len(regions.members)} regions; the planner tries every set of them "
            f"and takes at most {MAX_REGIONS} (docs/helix.md)"
        )
    found = plan_regions(inputs.cluster, inputs.tables, inputs.num_layers, prompt_len, regions)
    if found is None:
        raise HelixError(f"{inputs.cluster.source}: its machines cannot hold the model's {inputs.num_layers} layers")
    blocks, _, by_kind, layouts = found
    blocks = [(r, order_stages(block, by_kind, order)) for r, block in blocks]
    stages = tuple(s for _, block in blocks for s in block)
    plan = HelixPlan(
        stages=stages,
        machines=assign_region_machines(stages, inputs.cluster, regions),
        estimate=route_estimate(blocks, by_kind, prompt_len, regions),
        layouts=layouts,
        solve_s=0.0,
    )
    routed = routed_estimate(plan, inputs, prompt_len)
    return replace(plan, estimate=routed, solve_s=time.monotonic() - started)


def order_stages(
    stages: tuple[Stage, ...], tables: dict[str, EngineTables], order: str = "slow-ends"
) -> tuple[Stage, ...]:
    """Route order of `stages` (module docstring)."""
    slow_first = sorted(stages, key=lambda s: (-tables[s.kind].decode_s(1), -s.layers, s.width))
    if len({s.kind for s in stages}) == 1 and order in ORDERS:  # one type: fewer layers first, as Helix orders it
        return tuple(sorted(stages, key=lambda s: (s.layers, s.width)))
    if order == "fast-first":
        return tuple(slow_first[::-1])
    if order != "slow-ends":
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    front, back = slow_first[0::2], slow_first[1::2]
    return tuple(front + back[::-1])


def layout_stages(
    ranges: dict[str, tuple[int, int]],
    cluster: HelixCluster,
    tables: dict[str, EngineTables],
    num_layers: int,
    source: str,
) -> tuple[tuple[Stage, ...], tuple[tuple[str, ...], ...], tuple[int, ...]]:
    """A layout's machines (Helix node name -> layer range) as chains of stages (stages, their
    machines, stages per chain); HelixError naming `source` when they do not form chains: each
    range held by machines of one type, the ranges splitting into chains from layer 0 to the last."""
    kind_of = machine_types(cluster)
    by_range: dict[tuple[int, int], list[str]] = {}
    for node, span in ranges.items():
        if node not in kind_of:
            raise HelixError(f"{source}: {node} is not a machine of {cluster.source}")
        by_range.setdefault(span, []).append(node)
    chains = _split_chains(sorted(by_range), num_layers)
    if chains is None:
        raise HelixError(
            f"{source}: its ranges ({', '.join(f'{a}-{b - 1}' for a, b in sorted(by_range))}) do not split into "
            f"chains from layer 0 to {num_layers - 1}, each range following the last: the model scores such layouts"
        )
    stages, machines = [], []
    for span in (span for chain in chains for span in chain):
        nodes = sorted(by_range[span], key=helix_node_index)
        kinds = {kind_of[n] for n in nodes}
        if len(kinds) > 1:
            raise HelixError(
                f"{source}: the range {span[0]}-{span[1] - 1} ({', '.join(nodes)}) mixes machine types: "
                "the model scores stages of machines of one type"
            )
        stages.append(Stage(kinds.pop(), len(nodes), span[1] - span[0]))
        machines.append(tuple(nodes))
    return tuple(stages), tuple(machines), tuple(len(chain) for chain in chains)


def _split_chains(spans: list[tuple[int, int]], num_layers: int) -> list[list[tuple[int, int]]] | None:
    """`spans` as chains from 0 to num_layers, each span in one chain; None when they do not split so."""
    left, chains = list(spans), []
    while left:
        path = _path(left, 0, num_layers)
        if path is None:
            return None
        chains.append(path)
        left = [s for s in left if s not in path]
    return chains


def _path(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]] | None:
    """Spans that follow each other from `start` to `end` (depth first, shortest spans first)."""
    if start == end:
        return []
    for span in sorted((s for s in spans if s[0] == start), key=lambda s: s[1]):
        rest = _path(spans, span[1], end)
        if rest is not None:
            return [span, *rest]
    return None


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
