"""A Helix layout as the replay's graph (llm_planner.helix.replay): the hops Helix's scheduler may
send a request on, each with its max-flow share, the bandwidth a send on it gets and its link's
latency, and the machines with their tables (docs/helix.md, "The engine, replayed").

A send's bandwidth is Helix's (`scheduler_core.py`, schedule_initialization): the link's, capped by
the sender's outbound NIC times the hop's share of the sender's outgoing flow and by the receiver's
inbound NIC times its share of the receiver's incoming flow (the coordinator's NICs for the first
and last hop).
"""

from __future__ import annotations

import math

from llm_planner.cost.serving_profile import LayerTable
from llm_planner.helix.engine import TOKEN_BYTES, EngineTables
from llm_planner.helix.flow import SINK, SOURCE, coordinator_nics, layout_flow, layout_hops, link_end_names
from llm_planner.helix.inputs import HelixCluster, HelixError, helix_node_index
from llm_planner.helix.replay import PROMPT_TOKENS, Hop, ReplayGraph, ReplayMachine
from llm_planner.helix.rules import machine_types
from llm_planner.helix.typical import TypicalRates


def replay_graph(
    ranges: dict[str, tuple[int, int]],
    cluster: HelixCluster,
    tables: dict[str, EngineTables],
    prompts: dict[str, LayerTable],
    num_layers: int,
    activation_bytes: float,
    rates: TypicalRates | None = None,
    hops: dict[tuple[str, str], float] | None = None,
) -> ReplayGraph:
    """The replay's graph of a layout (module docstring); `hops` as in llm_planner.helix.flow.layout_flow."""
    edges = layout_hops(ranges, cluster, num_layers) if hops is None else hops
    value, flows = layout_flow(ranges, cluster, tables, num_layers, activation_bytes, rates, edges)
    if value <= 0:
        raise HelixError(f"{cluster.source}: the layout's graph carries no flow from layer 0 to the last")
    sent, received = {}, {}
    for a, b in edges:
        sent[a] = sent.get(a, 0.0) + flows[a][b]
        received[b] = received.get(b, 0.0) + flows[a][b]
    latency, nics = _latencies(cluster), _nics(cluster, edges)
    out: dict[str, dict[str, Hop]] = {}
    for (a, b), bw in edges.items():
        flow = flows[a][b]
        caps = [bw]
        if flow > 0:
            caps += [nics[a][1] * flow / sent[a], nics[b][0] * flow / received[b]]
        if (a, b) not in latency:
            raise HelixError(f"{cluster.source}: no link between {a} and {b}, which the layout's graph uses")
        between = SOURCE not in (a, b) and SINK not in (a, b)
        out.setdefault(a, {})[b] = Hop(
            flow=flow,
            bw=float(math.floor(min(caps))),  # Helix floors a send's bandwidth
            latency_s=latency[(a, b)],
            token_bytes=TOKEN_BYTES + activation_bytes if between else TOKEN_BYTES,
        )
    kinds, held = machine_types(cluster), {}
    for node, (first, end) in ranges.items():
        held.setdefault(kinds[node], set()).add(end - first)
    for kind, layer_counts in held.items():
        _check_prompt_rows(tables[kind], prompts[kind], layer_counts)
    machines = {
        node: ReplayMachine(table=tables[kinds[node]], prompt=prompts[kinds[node]], first=first, layers=end - first)
        for node, (first, end) in ranges.items()
    }
    return ReplayGraph(machines=machines, hops=out, activation_bytes=activation_bytes)


def _check_prompt_rows(table: EngineTables, prompt: LayerTable, layer_counts: set[int]) -> None:
    """A type's prompt profile must reach the largest prompt batch its machines' limits allow (prompts
    x 2,048 tokens, at the layer counts they hold); Helix's simulator stops on a batch past its last row."""
    need = max(table.prompt_limit(n) for n in layer_counts) * PROMPT_TOKENS
    if prompt.sizes[-1] < need:
        raise HelixError(
            f"{table.name}/prompt_bs2time.csv: its rows stop at {prompt.sizes[-1]:,} tokens, below the "
            f"{need:,} of a full prompt batch (Helix's prompt limit x its {PROMPT_TOKENS:,}-token prompts), "
            "where Helix's simulator would stop"
        )


def _latencies(cluster: HelixCluster) -> dict[tuple[str, str], float]:
    """Each link's latency both ways, by Helix node name ("source", "sink" for the coordinator)."""
    name = link_end_names(cluster)
    out = {}
    for link in cluster.links:
        a, b = name[link.a], name[link.b]
        out[(a, b)] = out[(b, a)] = link.latency_s
    return out


def _nics(cluster: HelixCluster, edges: dict[tuple[str, str], float]) -> dict[str, tuple[float, float]]:
    """(inbound, outbound) NIC bytes/s of every end of `edges`; the coordinator's as llm_planner.helix.flow
    takes them (its links together where the file does not state them)."""
    out_nic, in_nic = coordinator_nics(cluster, edges)
    nics = {SOURCE: (0.0, out_nic), SINK: (in_nic, 0.0)}
    for node in {n for pair in edges for n in pair} - {SOURCE, SINK}:
        machine = cluster.machine_type(cluster.node_types[helix_node_index(node)])
        nics[node] = (machine.inbound_nic_bytes_per_s, machine.outbound_nic_bytes_per_s)
    return nics
