"""Links of the cluster spec (docs/cluster-spec.md, "links"): the link classes, their readers, and the
rule that every pair of servers has a link.

Between two devices of one server the link is a rule per pair of kinds (the server template's, then
the cluster's `intra_node`) or `intra_node_default`. Between two servers it is a rule per pair of
regions (`between_regions`, the servers' templates naming their `region`; a rule may name one region
twice, the link between two servers of that region) or `inter_node`, the link of every pair of
servers no rule names. A cluster without regions has `inter_node` alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llm_planner.core.spec_fields import Reader, bandwidth, nonneg_seconds


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """A link class: time to move n bytes is latency_s + n / bw_bytes_per_s."""

    bw_bytes_per_s: float
    latency_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class IntraLinkSpec:
    """The link between two device kinds inside one node (unordered pair)."""

    between: tuple[str, str]
    bw_bytes_per_s: float
    latency_s: float = 0.0

    @property
    def link(self) -> LinkSpec:
        return LinkSpec(bw_bytes_per_s=self.bw_bytes_per_s, latency_s=self.latency_s)


@dataclass(frozen=True, kw_only=True)
class RegionLinkSpec:
    """The link between a server of one region and a server of another (unordered pair; a region
    named twice: two servers of that region)."""

    between: tuple[str, str]
    bw_bytes_per_s: float
    latency_s: float = 0.0

    @property
    def link(self) -> LinkSpec:
        return LinkSpec(bw_bytes_per_s=self.bw_bytes_per_s, latency_s=self.latency_s)


def read_link(r: Reader) -> LinkSpec:
    return LinkSpec(**_read_link_fields(r))


def _read_link_fields(c: Reader) -> dict[str, float]:
    fields = {
        "bw_bytes_per_s": c.get("bw_bytes_per_s", bandwidth, positive=True),
        "latency_s": c.get("latency_s", nonneg_seconds, default=0.0),
    }
    c.done()
    return fields


def _read_pair_rules(r: Reader, key: str, known: set[str], what: str, plural: str) -> list[tuple[tuple, dict]]:
    """The rules of list `key`: (between pair, link fields), each pair named once, every name in `known`."""
    items = r.get(key, default=[])
    if not isinstance(items, list):
        r.fail("expected a list", key)
    out, first_of = [], {}
    for i, item in enumerate(items):
        c = r.child(f"{key}[{i}]", item)
        between = c.get("between")
        if not (isinstance(between, list) and len(between) == 2 and all(isinstance(k, str) for k in between)):
            c.fail(f"expected a list of two {what} names", "between")
        for k in between:
            if k not in known:
                c.fail(f"unknown {what} {k!r} (known: {', '.join(sorted(known)) or 'none'})", "between")
        pair = frozenset(between)
        if pair in first_of:
            first = f"{key}[{first_of[pair]}] is the first"
            c.fail(f"a second rule for {plural} {between[0]!r} and {between[1]!r} ({first})")
        first_of[pair] = i
        out.append(((between[0], between[1]), _read_link_fields(c)))
    return out


def read_intra_links(r: Reader, key: str, kinds: set[str]) -> tuple[IntraLinkSpec, ...]:
    return tuple(IntraLinkSpec(between=b, **f) for b, f in _read_pair_rules(r, key, kinds, "device kind", "kinds"))


def read_region_links(r: Reader, key: str, regions: set[str]) -> tuple[RegionLinkSpec, ...]:
    return tuple(RegionLinkSpec(between=b, **f) for b, f in _read_pair_rules(r, key, regions, "region", "regions"))


def region_pairs(servers: Iterable[str | None]) -> list[tuple[str | None, str | None]]:
    """The unordered pairs of regions (one region twice when it has two servers) that some two of
    `servers` (each server's region) form, in the order the regions first appear."""
    count: dict[str | None, int] = {}
    for region in servers:
        count[region] = count.get(region, 0) + 1
    names = list(count)
    return [(a, b) for i, a in enumerate(names) for b in names[i:] if a != b or count[a] > 1]


def check_server_links(links: Reader, pairs, rules: tuple[RegionLinkSpec, ...], default, num_servers: int) -> None:
    """Every pair of servers has a link: a `between_regions` rule for its regions, or `inter_node`."""
    if default is not None:
        return
    if all(a is None for pair in pairs for a in pair):  # no region named
        if num_servers > 1:
            links.fail(f"the cluster has {num_servers} nodes but no link between nodes", "inter_node")
        return
    named = {frozenset(r.between) for r in rules}
    for a, b in pairs:
        if frozenset((a, b)) not in named:
            where = f"two servers of region {a!r}" if a == b else f"regions {a!r} and {b!r}"
            links.fail(
                f"no link between {where}: add a rule {{between: [{a}, {b}], bw_bytes_per_s: ..., latency_s: ...}} "
                "or links.inter_node (the link of every pair no rule names)",
                "between_regions",
            )


def check_regions(top: Reader, nodes) -> None:
    """Either every node names its region or none does (a server in no region has no link rule)."""
    named = [i for i, n in enumerate(nodes) if n.region is not None]
    if named and len(named) < len(nodes):
        t = next(i for i, n in enumerate(nodes) if n.region is None)
        top.fail(
            f"node {nodes[t].name!r} names no region but node {nodes[named[0]].name!r} does "
            f"({nodes[named[0]].region!r}): when one node names its region every node must",
            f"nodes[{t}].region",
        )


def check_intra_links(links: Reader, nodes, rules: tuple[IntraLinkSpec, ...]) -> None:
    """Every pair of devices in one node has a rule (the node's or the cluster's), when the cluster
    has no `intra_node_default`."""
    for node in nodes:
        kinds = [k for k, _ in node.devices]
        pairs = [(a, b) for i, a in enumerate(kinds) for b in kinds[i:] if a != b or dict(node.devices)[a] > 1]
        for a, b in pairs:
            if not any(set(r.between) == {a, b} for r in (*node.links, *rules)):
                links.fail(
                    f"no link between kinds {a!r} and {b!r} in node {node.name!r}; add a rule or a default",
                    "intra_node_default",
                )
