"""Regions of a geo-distributed Helix cluster, and chains that cross them as few times as pays
(docs/helix.md, "Regions").

Helix's geo cluster files (`3cluster24.ini`) give every pair of machines its own link: fast ones
(about 1e9 bytes/s, 1 ms) inside a region, slow ones (1e7 bytes/s, 40-59 ms) between regions.
`find_regions` groups machines by the links that are fast: sorting the distinct pair bandwidths,
the largest ratio between neighbours splits them into fast and slow when it is at least
`REGION_GAP` (llm_planner.helix.inputs, where the import finds the same regions); machines joined
by fast links (transitively) are one region. Without such a gap the
cluster is one region and nothing below changes the plan.

`region_networks` gives each region its own network (its slowest pair, NICs included, and its
largest latency), the slowest link between regions, and the coordinator's (source and sink)
slowest link, over which only token ids travel.

The model of a chain that visits regions one after another (`route_estimate`): each stage's hop
to the next stage of its region costs that region's network; the hop out of a region's last stage
costs the link between regions (the chain's last stage: the coordinator's), and the first hop
from the coordinator its latency. `plan_regions` tries every set of regions (a chain uses the
machines of those regions only, so it crosses between regions once per region after the first),
finds the best stages for it with llm_planner.helix.search (machine types per region are kinds,
identical machines counted) and keeps the set whose route the model rates highest.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from llm_planner.helix.engine import EngineTables, Estimate, Network, Stage, queries_in_flight, stage_round_s
from llm_planner.helix.inputs import HelixCluster, find_regions, helix_node_name, pair_bw
from llm_planner.helix.search import Kind, best_stages, count_layouts

MAX_REGIONS = 6  # sets of regions tried: 2^regions - 1


@dataclass(frozen=True, kw_only=True)
class Regions:
    members: tuple[tuple[int, ...], ...]  # ComputeNode indices of each region
    inside: tuple[Network, ...]  # by region
    between: Network  # the slowest link between two regions
    coordinator: Network  # source and sink links (token ids only)

    def region_of(self, index: int) -> int:
        return next(r for r, members in enumerate(self.members) if index in members)


def region_networks(cluster: HelixCluster, activation_bytes: int) -> Regions:
    """Each region's network, the slowest link between regions and the coordinator's (module docstring)."""
    members = find_regions(cluster)
    where = {i: r for r, group in enumerate(members) for i in group}
    inside = [[math.inf, 0.0] for _ in members]
    between, coordinator = [math.inf, 0.0], [math.inf, 0.0]
    for link in cluster.links:
        if link.a.isdigit() and link.b.isdigit():
            a, b = int(link.a), int(link.b)
            slot = inside[where[a]] if where[a] == where[b] else between
            bw = pair_bw(cluster, a, b, link.bw_bytes_per_s)
        else:
            slot, bw = coordinator, link.bw_bytes_per_s
        slot[0], slot[1] = min(slot[0], bw), max(slot[1], link.latency_s)
    for slot in (*inside, between, coordinator):
        if not math.isfinite(slot[0]):  # no such link (one machine, or one region): never used
            slot[0] = 1e9
    return Regions(
        members=members,
        inside=tuple(Network(latency_s=s[1], bw_bytes_per_s=s[0], activation_bytes=activation_bytes) for s in inside),
        between=Network(latency_s=between[1], bw_bytes_per_s=between[0], activation_bytes=activation_bytes),
        coordinator=Network(latency_s=coordinator[1], bw_bytes_per_s=coordinator[0], activation_bytes=0),
    )


def route_estimate(
    blocks: list[tuple[int, tuple[Stage, ...]]], tables: dict[str, EngineTables], prompt_len: float, regions: Regions
) -> Estimate:
    """Decode tokens/s of a chain visiting `blocks` (region, its stages in route order) in order."""
    stages = [s for _, block in blocks for s in block]
    queries = queries_in_flight(stages, tables, prompt_len)
    round_s = regions.coordinator.latency_s
    for b, (region, block) in enumerate(blocks):
        for i, stage in enumerate(block):
            last = i == len(block) - 1
            net = regions.inside[region] if not last else regions.between
            net = regions.coordinator if last and b == len(blocks) - 1 else net
            round_s += stage_round_s(stage, tables[stage.kind], queries, net)
    return Estimate(tokens_per_s=queries / round_s, queries=queries, round_s=round_s)


def region_kind(machine_type: str, region: int) -> str:
    """The search's kind for the machines of one type in one region: `t4@1`."""
    return f"{machine_type.lower()}@{region}"


def plan_regions(cluster: HelixCluster, tables: dict[str, EngineTables], num_layers: int, prompt_len: float, regions):
    """(blocks, Estimate, tables by kind, layouts searched) of the best chain over the sets of regions;
    None when none holds the model."""
    kinds_by_region = []
    for r, members in enumerate(regions.members):
        types = sorted({cluster.node_types[i] for i in members})
        counts = {t: sum(cluster.node_types[i] == t for i in members) for t in types}
        kinds_by_region.append([Kind(region_kind(t, r), counts[t], tables[t.lower()]) for t in types])
    by_kind = {k.name: k.table for ks in kinds_by_region for k in ks}
    best, layouts = None, 0
    for size in range(1, len(regions.members) + 1):
        for subset in itertools.combinations(range(len(regions.members)), size):
            kinds = [k for r in subset for k in kinds_by_region[r]]
            slowest = min((regions.inside[r] for r in subset), key=lambda n: n.bw_bytes_per_s / (1 + n.latency_s))
            layouts += count_layouts(kinds, num_layers)
            stages = best_stages(kinds, num_layers, prompt_len, slowest)
            if stages is None:
                continue
            blocks = [(r, tuple(s for s in stages if s.kind.endswith(f"@{r}"))) for r in subset]
            blocks = [(r, block) for r, block in blocks if block]
            est = route_estimate(blocks, by_kind, prompt_len, regions)
            if best is None or est.tokens_per_s > best[1].tokens_per_s:
                best = (blocks, est)
    return None if best is None else (*best, by_kind, layouts)


def assign_region_machines(stages: tuple[Stage, ...], cluster: HelixCluster, regions: Regions):
    """Helix node names per stage whose kind is `type@region`, in the cluster file's order."""
    free: dict[str, list[str]] = {}
    for index, name in enumerate(cluster.node_types):
        free.setdefault(region_kind(name, regions.region_of(index)), []).append(helix_node_name(index))
    out = []
    for stage in stages:
        out.append(tuple(free[stage.kind][: stage.width]))
        del free[stage.kind][: stage.width]
    return tuple(out)


def assign_near(stages: tuple[Stage, ...], cluster: HelixCluster, regions: Regions) -> tuple[tuple[str, ...], ...]:
    """Helix node names per stage (kinds are machine types), each stage's machines taken first from
    the region most of the previous stage's machines are in (the first stage's: the region with
    most machines of its type), then in the cluster file's order: a chain that stays in a region
    as long as its stages allow."""
    free: dict[str, list[int]] = {}
    for index, name in enumerate(cluster.node_types):
        free.setdefault(name.lower(), []).append(index)
    out, here = [], None
    for stage in stages:
        pool = free[stage.kind]
        if here is None:
            counts = [sum(regions.region_of(i) == r for i in pool) for r in range(len(regions.members))]
            here = counts.index(max(counts))
        chosen = sorted(pool, key=lambda i: (regions.region_of(i) != here, i))[: stage.width]
        for index in chosen:
            pool.remove(index)
        regions_of = [regions.region_of(i) for i in chosen]
        here = max(sorted(set(regions_of)), key=regions_of.count)
        out.append(tuple(helix_node_name(i) for i in chosen))
    return tuple(out)
