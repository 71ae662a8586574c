"""Chains as separate Helix deployments: one cluster file and one layout file per chain
(docs/helix.md, "Separate chains").

Chains that run side by side (llm_planner.helix.chains) are modelled as independent: each keeps
its own queries in flight, admitted against its own machines' KV cache, and its requests never
leave it. Written into one Helix layout they are not: Helix's scheduler routes a request from
any machine whose range ends at layer e to any machine whose range starts at e, so chains that
share a boundary layer merge into one graph, and one query feeder admits for all of them against
the fullest machine of any. Helix runs its own answer for LLaMA-1 30B on its 24-machine cluster
the way the model assumes: one deployment per machine type, each simulated on its own
sub-cluster (`artifact_evaluation/single_cluster/config/a100.ini`, `l4.ini`, `t4.ini`) and the
rates summed. `deployment` gives a chain's machines as such a sub-cluster (their links to each
other and to the coordinator as the full file gives them, the machines numbered 0..n-1 in the full
file's order) with its layout in that cluster's names, and `cluster_text` writes its file.
"""

from __future__ import annotations

from pathlib import Path

from llm_planner.helix.inputs import HelixCluster, HelixLink, helix_node_index, helix_node_name

ENDS = ("source", "sink")


def chain_indices(nodes: list[str]) -> list[int]:
    """The full cluster file's ComputeNode indices of Helix node names, ascending."""
    return sorted(helix_node_index(n) for n in nodes)


def renumber(nodes: list[str]) -> dict[str, str]:
    """Helix node name in the full cluster -> its name in the chain's own cluster file."""
    indices = chain_indices(nodes)
    return {helix_node_name(old): helix_node_name(new) for new, old in enumerate(indices)}


def chain_cluster(cluster: HelixCluster, nodes: list[str]) -> HelixCluster:
    """The machines `nodes` alone as a cluster (module docstring): numbered 0..n-1 in the full
    file's order, with their links to each other and to the coordinator."""
    indices = chain_indices(nodes)
    new = {str(old): str(i) for i, old in enumerate(indices)} | {end: end for end in ENDS}
    links = tuple(
        sorted(
            (
                HelixLink(a=new[k.a], b=new[k.b], bw_bytes_per_s=k.bw_bytes_per_s, latency_s=k.latency_s)
                for k in cluster.links
                if k.a in new and k.b in new
            ),
            key=lambda k: (_order(k.a), _order(k.b)),
        )
    )  # in the order cluster_text writes them (the coordinator's, then machine pairs, then the sink's)
    types = tuple(cluster.node_types[i] for i in indices)
    source = f"{Path(cluster.source).name} (its ComputeNode {', '.join(map(str, indices))})"
    machine_types = tuple(m for m in cluster.machine_types if m.name in types)
    return HelixCluster(
        source=source,
        machine_types=machine_types,
        node_types=types,
        links=links,
        coordinator_nics=cluster.coordinator_nics,
    )


def deployment(cluster: HelixCluster, triples: list[tuple[str, int, int]]):
    """A chain's machines (Helix node, first layer, end layer) as their own deployment: its cluster
    (chain_cluster) and the triples in that cluster's names."""
    nodes = [node for node, _, _ in triples]
    names = renumber(nodes)
    return chain_cluster(cluster, nodes), [(names[node], a, b) for node, a, b in triples]


def cluster_text(cluster: HelixCluster) -> str:
    """Helix's cluster file of a deployment's cluster (chain_cluster), its links in their order."""
    lines = [
        f"# {len(cluster.node_types)} machines of {cluster.source}, written by llm-planner plan-helix as one "
        "deployment",
        "",
        "[NodeNames]",
        f"total_compute_nodes={len(cluster.node_types)}",
        "",
    ]
    for end, section in (("source", "SourceNode"), ("sink", "SinkNode")):
        lines += [f"[{section}]", f"connected_nodes={_neighbours(cluster.links, end, numbers=True)}", ""]
    for i, name in enumerate(cluster.node_types):
        lines += [
            f"[ComputeNode-{i}]",
            f"type={name}",
            f"connected_nodes={_neighbours(cluster.links, str(i), False)}",
            "",
        ]
    for link in cluster.links:
        lines += [
            f"[Link-{link.a}-{link.b}]",
            f"bandwidth={_number(link.bw_bytes_per_s / 1e6)} * mbps",
            f"latency={_number(link.latency_s * 1e3)} * MilliSec",
            "",
        ]
    return "\n".join(lines)


def _neighbours(links: tuple[HelixLink, ...], node: str, numbers: bool) -> str:
    """`connected_nodes` of `node`: the other ends of its links, as Helix writes them."""
    ends = {link.b for link in links if link.a == node} | {link.a for link in links if link.b == node}
    return "[" + ", ".join(e if numbers or e.isdigit() else repr(e) for e in sorted(ends, key=_order)) + "]"


def _order(end: str) -> tuple[int, int]:
    """source first, then machines by number, then sink."""
    return (0, 0) if end == "source" else (2, 0) if end == "sink" else (1, int(end))


def _number(x: float) -> str:
    return f"{x:.12g}"
