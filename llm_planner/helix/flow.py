"""Any Helix layout under the engine model, routed by a max flow as Helix's scheduler routes it
(docs/helix.md, "Scoring any layout").

Helix builds a graph from a layout: the coordinator to every machine whose range starts at layer
0, machine a to machine b when a's range ends where b's starts, machines ending at the last
layer to the coordinator; it solves one max flow over it and splits requests among the edges by
that flow, so machines the flow leaves at zero get no requests. `flow_estimate` does the same
on that graph with networkx's `maximum_flow`, with capacities in decode tokens/s: a machine's
decode rate at its batch limit, `limit / (layers x decode(limit))`, and a link's bandwidth over
a token's bytes (activation + token id). Helix's own machine capacities come from its
"typical" throughput formula (docs/helix.md, Routing), which this does not reproduce, so the
flow can differ from Helix's where capacities are close.

Then the engine model (llm_planner.helix.engine) on the flow: machine m gets the fraction f_m
of the queries (its flow over the total); Helix admits queries while the fullest machine's
expected KV use stays under 80%, so C = min over used machines of room_queries(blocks(l_m)) / f_m.
The flow splits into paths (a standard decomposition); a query on path p takes one round
through its machines, each running its C f_m requests in batches (stage_round_s with width 1)
and sending them on the link to the next machine (that pair's region network,
llm_planner.helix.regions; the last hop the coordinator's). Decode tokens/s = sum over paths of
C w_p / round_p, w_p the path's share of the flow. For a layout of stages whose flow splits
evenly this is the stage model itself.
"""

from __future__ import annotations

import networkx as nx

from llm_planner.helix.engine import TOKEN_BYTES, EngineTables, Estimate, Stage, room_queries, stage_round_s
from llm_planner.helix.inputs import NODE_INDEX_OFFSET, HelixCluster, HelixError
from llm_planner.helix.regions import Regions
from llm_planner.helix.rules import machine_types

SOURCE, SINK = "source", "sink"


def machine_rate(table: EngineTables, layers: int) -> float:
    """Decode tokens/s of one machine holding `layers` layers at its batch limit."""
    limit = table.decode_limit[layers]
    return limit / (layers * table.decode_s(limit))


def layout_flow(
    ranges: dict[str, tuple[int, int]], kinds: dict[str, str], tables: dict[str, EngineTables], num_layers: int, regions
) -> tuple[float, dict[str, dict[str, float]]]:
    """(max flow value, flow by edge) over the layout's graph (module docstring)."""
    graph = nx.DiGraph()
    for node, (first, end) in ranges.items():
        graph.add_edge(f"{node}/in", f"{node}/out", capacity=machine_rate(tables[kinds[node]], end - first))
        if first == 0:
            graph.add_edge(SOURCE, f"{node}/in", capacity=regions.coordinator.bw_bytes_per_s / TOKEN_BYTES)
        if end == num_layers:
            graph.add_edge(f"{node}/out", SINK, capacity=regions.coordinator.bw_bytes_per_s / TOKEN_BYTES)
        for other, (start, _) in ranges.items():
            if start == end and other != node:
                net = hop_network(node, other, regions)
                graph.add_edge(
                    f"{node}/out", f"{other}/in", capacity=net.bw_bytes_per_s / (net.activation_bytes + TOKEN_BYTES)
                )
    return nx.maximum_flow(graph, SOURCE, SINK)


def hop_network(a: str, b: str, regions: Regions):
    """The network of a hop between two Helix node names: their region's, or the link between regions."""
    ra, rb = (regions.region_of(int(n.rsplit("_", 1)[1]) - NODE_INDEX_OFFSET) for n in (a, b))
    return regions.inside[ra] if ra == rb else regions.between


def flow_paths(flows: dict[str, dict[str, float]], value: float) -> list[tuple[list[str], float]]:
    """The flow as paths of machines with their share of it (greedy decomposition)."""
    left = {u: dict(vs) for u, vs in flows.items()}
    paths, tiny = [], value * 1e-9
    while True:
        path, node = [], SOURCE
        while node != SINK:
            nxt = max(left.get(node, {}), key=lambda v: left[node][v], default=None)
            if nxt is None or left[node][nxt] <= tiny:
                return paths
            path.append((node, nxt))
            node = nxt
        amount = min(left[u][v] for u, v in path)
        for u, v in path:
            left[u][v] -= amount
        paths.append(([v.rsplit("/", 1)[0] for u, v in path if v.endswith("/in")], amount / value))


def flow_estimate(
    ranges: dict[str, tuple[int, int]],
    cluster: HelixCluster,
    tables: dict[str, EngineTables],
    num_layers: int,
    prompt_len: float,
    regions: Regions,
) -> Estimate:
    """Decode tokens/s of any layout Helix accepts (module docstring)."""
    kinds = machine_types(cluster)
    value, flows = layout_flow(ranges, kinds, tables, num_layers, regions)
    if value <= 0:
        raise HelixError(f"{cluster.source}: the layout's graph carries no flow from layer 0 to the last")
    paths = flow_paths(flows, value)
    share = {n: flows[f"{n}/in"][f"{n}/out"] / value for n in ranges}
    used = [n for n in ranges if share[n] > 1e-9]
    queries = min(
        room_queries(tables[kinds[n]].kv_blocks[ranges[n][1] - ranges[n][0]], prompt_len) / share[n] for n in used
    )
    rate = 0.0
    for nodes, weight in paths:
        round_s = regions.coordinator.latency_s
        for i, node in enumerate(nodes):
            net = hop_network(node, nodes[i + 1], regions) if i + 1 < len(nodes) else regions.coordinator
            stage = Stage(kinds[node], 1, ranges[node][1] - ranges[node][0])
            round_s += stage_round_s(stage, tables[kinds[node]], queries * share[node], net)
        rate += queries * weight / round_s
    return Estimate(tokens_per_s=rate, queries=queries, round_s=queries / rate)
