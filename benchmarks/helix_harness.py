"""Score one Helix layout with Helix's own simulator; run by benchmarks/bench_helix.py.

This script runs under the Python of a Helix checkout's environment (Python >= 3.10, Helix's
requirements), with the checkout on PYTHONPATH, in a scratch working directory; it does not
import llm_planner. It drives Helix's simulator through its public classes with the settings
of Helix's offline experiments (artifact_evaluation/single_cluster/step3_simulation.py):
requests of the Azure Conversation length distribution, a warm-up of 60 s, decode tokens
counted over the next 600 s, seed 0; MaxFlow scheduling with KV expectation (hwm 0.85, output
ratio 1) and a feed high-water mark of 0.8 and 20 initial queries, or the naive scheduler
(Helix's "separate pipelines" runs) with a fixed number of queries in flight.

When no simulator cluster file is given, it writes one for the layout, as Helix's layout
tools do: each machine holding layers with its KV-cache capacity for that many layers (from
Helix's model tables), links from the coordinator to machines whose range starts at layer 0,
from machines whose range ends at the last layer to it, and from machine a to machine b when
a's range ends where b's starts, each with the cluster file's bandwidth and latency for the
pair; machines that no request can pass through are left out.

The last line of stdout is `HELIX_RESULT {json}` with decode_tokens_per_s and counts.
"""

from __future__ import annotations

import argparse
import ast
import collections
import configparser
import json
import os
import re
import sys
import time

UNITS = {
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
    "Byte": 1.0,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "Sec": 1.0,
    "MilliSec": 1e-3,
}


def value(text):
    match = re.match(r"^\s*([-+0-9.eE]+)\s*(?:\*\s*([A-Za-z]+))?\s*$", text)
    return float(match.group(1)) * (UNITS[match.group(2)] if match.group(2) else 1.0)


def read_ini(path):
    parser = configparser.ConfigParser(interpolation=None)
    with open(path) as f:
        parser.read_file(f)
    return parser


def layout_ranges(path):
    parser = read_ini(path)
    ranges = {}
    for key, text in parser["Solution"].items():
        layers = ast.literal_eval(text.strip())
        if layers:
            ranges[key] = (min(layers), min(layers) + len(layers))
    return ranges


def write_simulator_cluster(cluster_path, profiles_path, layout_path, model_manager, num_layers, out_path):
    cluster, profiles = read_ini(cluster_path), read_ini(profiles_path)
    ranges = layout_ranges(layout_path)
    index = {f"compute_node_{i + 2}": i for i in range(int(cluster["NodeNames"]["total_compute_nodes"]))}
    node_type = {name: cluster[f"ComputeNode-{i}"]["type"].strip() for name, i in index.items()}

    def valid(a, b):  # a request can go from a to b: a's range ends where b's starts
        if a == "source":
            return b in ranges and ranges[b][0] == 0
        if b == "sink":
            return a in ranges and ranges[a][1] == num_layers
        return a in ranges and b in ranges and ranges[a][1] == ranges[b][0]

    name = {str(i): n for n, i in index.items()}
    name.update(source="source", sink="sink")
    edges = {}  # in the cluster file's order of links, each pair forward then backward (as Helix's tools)
    for section in cluster.sections():
        if not section.startswith("Link-"):
            continue
        x, y = (name[e] for e in section.split("-")[1:])
        pair = (value(cluster[section]["bandwidth"]), value(cluster[section]["latency"]))
        for a, b in ((x, y), (y, x)):
            if a != "sink" and b != "source" and valid(a, b):
                edges[(a, b)] = pair
    while True:  # drop machines a request cannot reach or leave
        has_in = {b for _, b in edges}
        has_out = {a for a, _ in edges}
        kept = {
            e: v
            for e, v in edges.items()
            if (e[0] == "source" or e[0] in has_in) and (e[1] == "sink" or e[1] in has_out)
        }
        if kept == edges:
            break
        edges = kept
    used = sorted({n for e in edges for n in e} - {"source", "sink"}, key=lambda n: int(n.rsplit("_", 1)[1]))
    mbps, mb = 1e6, 1e6
    lines = [
        "# Simulator cluster file written by llm_planner's benchmarks/helix_harness.py",
        "",
        "[Coordinator]",
        f"inbound_nic_speed={value(profiles['SinkNode']['inbound_nic_speed']) / mbps} * mbps",
        f"outbound_nic_speed={value(profiles['SourceNode']['outbound_nic_speed']) / mbps} * mbps",
        "",
        "[MachineTypes]",
        f"types={[s for s in profiles.sections() if s not in ('SourceNode', 'SinkNode')]}",
        "",
        "[ComputeNodes]",
        f"names={used}",
        "",
    ]
    for name in used:
        machine = profiles[node_type[name]]
        num = ranges[name][1] - ranges[name][0]
        if num > model_manager.get_max_num_layers(machine_type=node_type[name]):
            raise SystemExit(
                f"{name} ({node_type[name]}) holds {num} layers; Helix's model tables stop at "
                f"{model_manager.get_max_num_layers(machine_type=node_type[name])}"
            )
        lines += [
            f"[{name}]",
            f"vram_size={value(machine['vram_size']) / mb} * MB",
            f"inbound_nic_speed={value(machine['inbound_nic_speed']) / mbps} * mbps",
            f"outbound_nic_speed={value(machine['outbound_nic_speed']) / mbps} * mbps",
            f"disk_speed={value(machine['disk_speed']) / mbps} * mbps",
            f'machine_type="{node_type[name]}"',
            "kv_cache_capacity="
            f"{model_manager.get_kv_cache_capacity(machine_type=node_type[name], num_on_node_layers=num)}",
            "activation_backup_capacity="
            f"{model_manager.get_activation_backup_capacity(machine_type=node_type[name], num_on_node_layers=num)}",
            "",
        ]
    names = [f"link_{a}_{b}" for a, b in edges]
    lines += ["[Links]", f"names={names}", ""]
    for (a, b), (bw, latency) in edges.items():
        lines += [
            f"[link_{a}_{b}]",
            f"in={a}",
            f"out={b}",
            f"latency={latency * 1000} * MilliSec",
            f"bandwidth={bw / mbps} * mbps",
            "",
        ]
    with open(out_path, "w") as f:
        f.write("\n".join(lines))
    return len(used)


class _Discarded(list):
    """A list that keeps nothing appended to it."""

    def append(self, _):
        pass


class _Forgetting(dict):
    """A dict that keeps nothing stored in it (lookups find nothing, as for new keys)."""

    def __setitem__(self, *_):
        pass


def drop_records(simulator):
    """Stop keeping what the simulator records but never reads back; its results are unchanged.

    The simulator keeps every past event (its only use: an assertion that event ids, unique by
    construction, are not repeated) and an event log nobody reads; a finished request keeps its
    per-layer inference, routing and location records, read only while it travels (its query
    copies what it needs when it finishes); a finished query keeps one record per token, read
    only when it finishes. They grow with simulated time; docs/helix.md gives a run's peak
    memory with and without them. What is lost: two of its self-checks (no event id repeats,
    log entries come in time order), not a number it computes.
    """
    simulator.logger.add_log = lambda *_, **__: None
    simulator.previous_events_list, simulator.previous_events_dict = _Discarded(), _Forgetting()
    gather = simulator.handle_gather_finished

    def gather_and_drop(event):
        finished = list(simulator.sink_node.inbound_request_queue)
        gather(event=event)
        for request in finished:
            request.inference_history, request.routing_history, request.location_history = [], [], []

    simulator.handle_gather_finished = gather_and_drop
    queries = simulator.query_manager
    collect = queries.collect_finished_request

    def collect_and_drop(current_time, request):
        finished = collect(current_time=current_time, request=request)
        if finished:  # its latency totals are taken; its per-token records are not read again
            queries.finished_queries[request.base_query_uid][1].inference_history = []
        return finished

    queries.collect_finished_request = collect_and_drop


def record_latencies(simulator):
    """Keep (finish time, is prompt, latency) of every finished request, latency from its first to
    its last location as Helix's online script reads it, before drop_records clears the histories."""
    simulator.latencies = []
    gather = simulator.handle_gather_finished

    def gather_and_record(event):
        finished = list(simulator.sink_node.inbound_request_queue)
        gather(event=event)
        for request in finished:
            first, last = request.location_history[0][1], request.location_history[-1][1]
            prompt = request.phase.name == "Initialization"
            simulator.latencies.append((simulator.current_time, prompt, last - first))

    simulator.handle_gather_finished = gather_and_record


def record_batches(simulator, begin, end):
    """Per machine, from `begin` to `end` simulated seconds: the share of time it computes, the
    batches it starts at its first layer (requests it takes in), their decode requests, and those
    holding a single decode request and no prompt; added up as batches start, nothing kept per
    batch. Wraps the class's start_execution (every machine of this process is the simulator's)."""
    from simulator.event_simulator.compute_node import ComputeNode

    stats = collections.defaultdict(lambda: {"busy_s": 0.0, "first_batches": 0, "first_decodes": 0, "single": 0})
    start = ComputeNode.start_execution

    def start_and_count(node, requests):
        batch = start(node, requests)
        if begin <= simulator.current_time <= end:
            row = stats[node.node_uid]
            row["busy_s"] += batch.duration
            if node.current_layer_id == min(node.in_vram_model_layers):
                decodes = sum(r.phase.name == "Increment" for r in requests)
                row["first_batches"] += 1
                row["first_decodes"] += decodes
                row["single"] += decodes == len(requests) == 1
        return batch

    ComputeNode.start_execution = start_and_count
    return stats


def batch_summary(stats, duration, latencies):
    """The per-machine figures of record_batches as rates and means, and the mean decode latency
    (one token's trip from the coordinator round the route and back) over the window."""
    machines = {
        str(uid): {
            "busy_share": round(row["busy_s"] / duration, 4),
            "first_batches_per_s": round(row["first_batches"] / duration, 3),
            "mean_decode_batch": round(row["first_decodes"] / max(1, row["first_batches"]), 2),
            "single_per_s": round(row["single"] / duration, 3),
        }
        for uid, row in sorted(stats.items())
    }
    decode = [latency for prompt, latency in latencies if not prompt]
    return {"machines": machines, "decode_latency_mean_s": sum(decode) / len(decode) if decode else None}


def percentiles(values):
    """Helix's analyze_latency: the sorted list at int(n x q) for q = 5, 25, 50, 75, 95%."""
    values = sorted(values)
    if not values:
        return None
    return {f"p{int(q * 100)}": values[int(len(values) * q)] for q in (0.05, 0.25, 0.5, 0.75, 0.95)}


def _version(module):
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--machine-profiles", required=True)
    p.add_argument("--layout", required=True)
    p.add_argument("--simulator-cluster", help="Helix simulator cluster file (default: written for the layout)")
    p.add_argument("--model", choices=("llama70b", "llama30b"), default="llama70b")
    p.add_argument("--scheduler", choices=("maxflow", "naive"), default="maxflow")
    p.add_argument("--initial-queries", type=int, default=20)
    p.add_argument(
        "--force-set",
        action="store_true",
        help="let machines hold more layers than Helix's tables (separate pipelines)",
    )
    p.add_argument(
        "--keep-records",
        action="store_true",
        help="keep the simulator's event log and each finished request's per-layer records: nothing reads "
        "them once written, and they make a long run's memory grow with simulated time",
    )
    p.add_argument(
        "--watch", type=float, default=200.0, help="print the queries in flight and KV use every this many seconds"
    )
    p.add_argument(
        "--online",
        type=float,
        help="Helix's online mode: requests arrive at this mean rate of tokens/s (its avg_throughput; "
        "its runs use --warm-up 0 --duration 1800)",
    )
    p.add_argument(
        "--batch-stats",
        action="store_true",
        help="add, per machine, its busy share, the batches it starts at its first layer per second, their mean "
        "decode requests and the single-request ones per second, and the mean decode latency (batch_stats)",
    )
    p.add_argument("--warm-up", type=float, default=60.0)
    p.add_argument("--duration", type=float, default=600.0)
    args = p.parse_args()

    from simulator.event_simulator.cluster_simulator import ClusterSimulator, ModelName, RequestPhase, SchedulingMethod
    from simulator.initial_layout.layout_synthesizer import LayoutMethod, LayoutSynthesizer
    from simulator.scheduler.global_maxflow.global_maxflow_scheduler import KVParameters, SchedulingMode
    from simulator.trace_generator.simulator_query_feeder import OfflineRequestFeeder, OnlineRequestFeeder

    model = {"llama70b": ModelName.LLaMa70B, "llama30b": ModelName.LLaMa30B}[args.model]
    cluster = read_ini(args.cluster)
    counts = collections.Counter(
        cluster[f"ComputeNode-{i}"]["type"].strip() for i in range(int(cluster["NodeNames"]["total_compute_nodes"]))
    )
    machine_num_dict = dict(sorted(counts.items()))
    synthesizer = LayoutSynthesizer(
        complete_cluster_file_name=args.cluster,
        machine_profile_name=args.machine_profiles,
        model_name=model,
        workspace_path="./workspace",
        layout_method=LayoutMethod.LoadExisting,
        machine_num_dict=machine_num_dict,
    )
    simulator_cluster = args.simulator_cluster
    if simulator_cluster is None:
        simulator_cluster = os.path.abspath("simulator_cluster.ini")
        num_layers = len(synthesizer.model_manager.get_model_params())
        write_simulator_cluster(
            args.cluster, args.machine_profiles, args.layout, synthesizer.model_manager, num_layers, simulator_cluster
        )
    path = synthesizer.synthesize(
        args={"solution_file_name": args.layout, "simulator_cluster_file_name": simulator_cluster}
    )
    simulator = ClusterSimulator(model_name=model, machine_num_dict=machine_num_dict)
    simulator.model_manager.allow_force_set = args.force_set
    simulator.from_ini_file(config_file_name=path)
    if args.scheduler == "maxflow":
        online = args.online is not None  # Helix's online runs: KV expectation 0.9 and 0.6 of the output
        simulator.init_scheduler(
            scheduling_method=SchedulingMethod.MaxFlow,
            args={
                "kv_param": KVParameters(expected_kv_hwm=0.9, expected_output_length_ratio=0.6)
                if online
                else KVParameters(expected_kv_hwm=0.85, expected_output_length_ratio=1),
                "scheduling_mode": SchedulingMode.Online if online else SchedulingMode.Offline,
            },
        )
    else:
        simulator.init_scheduler(scheduling_method=SchedulingMethod.Naive, args=None)
    simulator.init_query_manager()
    record_latencies(simulator)
    if not args.keep_records:
        drop_records(simulator)
    simulator.mark_as_ready()
    loaded_at = synthesizer.set_layout(simulator=simulator)
    simulator.update_scheduler()
    begin, end = loaded_at + args.warm_up, loaded_at + args.warm_up + args.duration
    batches = record_batches(simulator, begin, end) if args.batch_stats else None
    started = time.time()
    if args.online is not None:  # requests arrive at this mean rate of tokens (Helix's avg_throughput)
        feeder = OnlineRequestFeeder(
            cluster_token_throughput=args.online, start_time=loaded_at, duration=args.warm_up + args.duration, seed=0
        )
    else:
        feeder = OfflineRequestFeeder(
            initial_query_count=args.initial_queries,
            start_time=loaded_at,
            duration=args.warm_up + args.duration,
            stop_at_duration=True,
            feed_hwm=0.8,
            seed=0,
        )
    feeder.auto_simulate(simulator=simulator, watch_items=["all"], watch_interval=args.watch)
    decoded = prompts = 0
    for finished_at, request in simulator.finished_requests.values():
        if begin <= finished_at <= end:
            if request.phase == RequestPhase.Initialization:
                prompts += 1
            else:
                decoded += request.token_seq_length
    window = [(prompt, latency) for at, prompt, latency in simulator.latencies if begin <= at <= end]
    result = {
        "decode_tokens_per_s": decoded / args.duration,
        "online_tokens_per_s": args.online,
        "prompt_latency_s": percentiles([lat for prompt, lat in window if prompt]),
        "decode_latency_s": percentiles([lat for prompt, lat in window if not prompt]),
        "decode_tokens": decoded,
        "prompts": prompts,
        "machines": len(simulator.compute_nodes),
        "simulated_s": args.duration,
        "wall_s": time.time() - started,
        "max_flow_tokens_per_s": getattr(getattr(simulator.scheduler, "flow_graph", None), "flow_value", None),
        "python": sys.version.split()[0],
        "numpy": _version("numpy"),
        "networkx": _version("networkx"),
    }
    if batches is not None:
        result["batch_stats"] = batch_summary(batches, args.duration, window)
    print("HELIX_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
