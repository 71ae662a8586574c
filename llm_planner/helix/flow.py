"""Any Helix layout under the engine model, routed by a max flow as Helix's scheduler routes it
(docs/helix.md, "Routing as Helix routes").

Helix builds a graph from a layout (scheduler/global_maxflow/network_flow.py): the coordinator's
source and sink (capacity: its NICs over a token id's bytes), each machine as in-NIC -> compute ->
out-NIC edges, and one edge per hop a request may take, with the link's bandwidth: the
coordinator to every machine whose range starts at layer 0, machine a to machine b when a's range
ends where b's starts, machines ending at the last layer to the coordinator. It solves one max
flow over it and splits requests among the edges by that flow, so machines the flow leaves at
zero get no requests. `layout_flow` builds the same graph in the same order and solves it with
networkx's `maximum_flow`; capacities in tokens/s, a machine's compute its Helix "typical"
throughput (llm_planner.helix.typical) or, where Helix's files do not state its routing
statistics, its decode rate at its batch limit. Helix's own simulator cluster files may leave out
some hops a layout allows (its layout tools prune them); the graph here has every one.

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
from llm_planner.helix.inputs import NODE_INDEX_OFFSET, HelixCluster, HelixError, helix_node_index, helix_node_name
from llm_planner.helix.regions import Regions
from llm_planner.helix.rules import machine_types
from llm_planner.helix.typical import TypicalRates

SOURCE, SINK = "source", "sink"
SOURCE_UID, SINK_UID = 0, 1  # Helix's simulator numbers the coordinator's source and sink 0 and 1


def machine_rate(table: EngineTables, layers: int) -> float:
    """Decode tokens/s of one machine holding `layers` layers at its batch limit."""
    limit = table.decode_limit[layers]
    return limit / (layers * table.decode_s(limit))


def layout_flow(
    ranges: dict[str, tuple[int, int]],
    cluster: HelixCluster,
    tables: dict[str, EngineTables],
    num_layers: int,
    activation_bytes: float,
    rates: TypicalRates | None = None,
    hops: dict[tuple[str, str], float] | None = None,
) -> tuple[float, dict[str, dict[str, float]]]:
    """(max flow value, flow between machines: SOURCE -> node -> ... -> SINK) over the graph Helix
    builds from the layout (module docstring), in the order Helix builds it; `hops`: the links of
    Helix's own simulator cluster file for it (llm_planner.helix.simulator_file) instead of every
    hop the layout allows."""
    kinds, index = machine_types(cluster), {n: int(n.rsplit("_", 1)[1]) for n in ranges}
    edges = layout_hops(ranges, cluster, num_layers) if hops is None else hops
    strangers = sorted({n for pair in edges for n in pair} - set(ranges) - {SOURCE, SINK})
    if strangers:
        raise HelixError(f"the simulator cluster file links machines the layout does not place: {strangers}")
    sizes = {"in": {}, "out": {}}
    for a, b in edges:
        sizes["out"][a] = sizes["out"].get(a, TOKEN_BYTES) if b == SINK else TOKEN_BYTES + activation_bytes
        sizes["in"][b] = sizes["in"].get(b, TOKEN_BYTES) if a == SOURCE else TOKEN_BYTES + activation_bytes
    graph = nx.DiGraph()
    out_nic, in_nic = coordinator_nics(cluster, edges)
    graph.add_edge("source", f"{SOURCE_UID}_out", capacity=out_nic / TOKEN_BYTES)
    graph.add_edge(f"{SINK_UID}_in", "sink", capacity=in_nic / TOKEN_BYTES)
    between = TOKEN_BYTES + activation_bytes  # a machine no hop reaches or leaves: Helix's size for it
    for node in sorted(ranges, key=index.get):
        kind, layers = kinds[node], ranges[node][1] - ranges[node][0]
        machine = cluster.machine_type(cluster.node_types[index[node] - NODE_INDEX_OFFSET])
        rate = rates.rate(kind, layers) if rates is not None else machine_rate(tables[kind], layers)
        uid = index[node]
        graph.add_edge(
            f"{uid}_in", f"{uid}_start", capacity=machine.inbound_nic_bytes_per_s / sizes["in"].get(node, between)
        )
        graph.add_edge(f"{uid}_start", f"{uid}_end", capacity=rate)
        graph.add_edge(
            f"{uid}_end", f"{uid}_out", capacity=machine.outbound_nic_bytes_per_s / sizes["out"].get(node, between)
        )
    uid = {SOURCE: SOURCE_UID, SINK: SINK_UID} | index
    for (a, b), bw in edges.items():
        size = TOKEN_BYTES if SOURCE in (a, b) or SINK in (a, b) else TOKEN_BYTES + activation_bytes
        graph.add_edge(f"{uid[a]}_out", f"{uid[b]}_in", capacity=bw / size)
    value, flows = nx.maximum_flow(graph, "source", "sink")
    machine_flows: dict[str, dict[str, float]] = {}
    for a, b in edges:
        machine_flows.setdefault(a, {})[b] = flows[f"{uid[a]}_out"][f"{uid[b]}_in"]
    for node in ranges:
        machine_flows.setdefault(node, {})["/through"] = flows[f"{index[node]}_start"][f"{index[node]}_end"]
    return value, machine_flows


def layout_hops(
    ranges: dict[str, tuple[int, int]], cluster: HelixCluster, num_layers: int
) -> dict[tuple[str, str], float]:
    """The hops a request may take, with the link's bandwidth, in the cluster file's order of links
    (each pair forward, then backward): the coordinator to machines starting at layer 0, a to b when
    a's range ends where b's starts, machines ending at the last layer to the coordinator."""
    name = link_end_names(cluster)

    def valid(a: str, b: str) -> bool:
        if a == SOURCE:
            return b in ranges and ranges[b][0] == 0
        if b == SINK:
            return a in ranges and ranges[a][1] == num_layers
        return a in ranges and b in ranges and ranges[a][1] == ranges[b][0]

    edges = {}
    for link in cluster.links:
        x, y = name[link.a], name[link.b]
        for a, b in ((x, y), (y, x)):
            if a != SINK and b != SOURCE and valid(a, b):
                edges[(a, b)] = link.bw_bytes_per_s
    return edges


def link_end_names(cluster: HelixCluster) -> dict[str, str]:
    """A cluster file's link ends (a node index as text, "source", "sink") -> the simulator's node names."""
    return {str(i): helix_node_name(i) for i in range(len(cluster.node_types))} | {"source": SOURCE, "sink": SINK}


def coordinator_nics(cluster: HelixCluster, edges: dict[tuple[str, str], float]) -> tuple[float, float]:
    """The coordinator's (outbound, inbound) NIC bytes/s: the cluster file's, else its links in `edges` together."""
    return cluster.coordinator_nics or (
        sum(bw for (a, _), bw in edges.items() if a == SOURCE),
        sum(bw for (_, b), bw in edges.items() if b == SINK),
    )


def hop_network(a: str, b: str, regions: Regions):
    """The network of a hop between two Helix node names: their region's, or the link between regions."""
    ra, rb = (regions.region_of(helix_node_index(n)) for n in (a, b))
    return regions.inside[ra] if ra == rb else regions.between


def flow_paths(flows: dict[str, dict[str, float]], value: float) -> list[tuple[list[str], float]]:
    """The flow between machines as paths of machines with their share of it (greedy decomposition)."""
    left = {u: {v: f for v, f in vs.items() if v != "/through"} for u, vs in flows.items()}
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
        paths.append(([v for _, v in path[:-1]], amount / value))


def flow_estimate(
    ranges: dict[str, tuple[int, int]],
    cluster: HelixCluster,
    tables: dict[str, EngineTables],
    num_layers: int,
    prompt_len: float,
    regions: Regions,
    rates: TypicalRates | None = None,
    hops: dict[tuple[str, str], float] | None = None,
) -> Estimate:
    """Decode tokens/s of any layout Helix accepts (module docstring); `hops` as in layout_flow."""
    kinds = machine_types(cluster)
    act = regions.coordinator.activation_bytes
    value, flows = layout_flow(ranges, cluster, tables, num_layers, act, rates, hops)
    if value <= 0:
        raise HelixError(f"{cluster.source}: the layout's graph carries no flow from layer 0 to the last")
    paths = flow_paths(flows, value)
    share = {n: flows[n]["/through"] / value for n in ranges}
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
