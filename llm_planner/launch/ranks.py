"""One MPI rank per device a plan uses: the rank entries, their order by host in cluster order, and the
check that no node gets more ranks than it has slots."""

from __future__ import annotations

import logging

from llm_planner.core.names import check_host
from llm_planner.core.plan import Plan
from llm_planner.core.spec import ClusterSpec
from llm_planner.core.tensor_groups import is_group_name, member_names
from llm_planner.launch.launch_types import LaunchError
from llm_planner.runtime.table import RankEntry

log = logging.getLogger(__name__)


def rank_entries(plan: Plan, cluster: ClusterSpec, source: str) -> tuple[RankEntry, ...]:
    """One rank per device the plan uses, grouped by host in cluster order."""
    used = plan.physical_devices_used()
    serves = {m: d for d in plan.devices_used() for m in member_names(d)}
    order = rank_order(used, cluster, source)
    entries = []
    for rank, name in enumerate(order):
        plan_device = serves[name]
        tasks = {
            str(s): [
                t.task
                for t in sorted(plan.schedule, key=lambda t: (t.start_s, t.finish_s))
                if t.shard == s and t.device == plan_device
            ]
            for s in range(len(plan.shard_sizes))
        }
        group = [order.index(m) for m in member_names(plan_device)] if is_group_name(plan_device) else []
        tasks = {k: v for k, v in tasks.items() if v}
        entries.append(rank_entry(rank, name, cluster, plan_device=plan_device, group=group, tasks=tasks))
    return tuple(entries)


def rank_entry(
    rank: int, name: str, cluster: ClusterSpec, *, plan_device: str, group: list[int], tasks: dict[str, list[str]]
) -> RankEntry:
    """The rank table's row of the rank on device `name` (its host, type and CUDA index from the cluster)."""
    d = cluster.device_map()[name]
    gpus = [x.name for x in cluster.devices() if x.node == d.node and cluster.kind(x.kind).type == "gpu"]
    return RankEntry(
        rank=rank,
        device=name,
        node=d.node,
        hostname=str(d.hostname),
        device_type=cluster.kind(d.kind).type,
        gpu_index=gpus.index(name) if name in gpus else None,
        tasks=tasks,
        plan_device=plan_device,
        group=group,
    )


def rank_order(used, cluster: ClusterSpec, source: str) -> list[str]:
    """The devices `used`, one rank each, grouped by host in cluster order; LaunchError naming the file and
    field for a device the cluster lacks, a node without a (valid) hostname, or more ranks than a node's slots."""
    devices = cluster.device_map()
    unknown = [d for d in used if d not in devices]
    if unknown:
        raise LaunchError(f"{source}: the plan uses device(s) {unknown} that cluster {cluster.source} does not have")
    templates = {n.name: (i, n) for i, n in enumerate(cluster.nodes)}
    for name in used:
        d = devices[name]
        i, _ = templates[d.node_template]
        if not d.hostname:
            raise LaunchError(
                f"{cluster.source}: nodes[{i}].hostname: missing for node {d.node!r}; "
                f"launch needs the hostname of every node the plan uses (device {name})"
            )
        check_host(d.hostname, f"{cluster.source}: nodes[{i}].hostname (node {d.node!r})", LaunchError)
    order = [d.name for d in cluster.devices() if d.name in used]
    hosts = list(dict.fromkeys(devices[d].hostname for d in order))
    order.sort(key=lambda d: hosts.index(devices[d].hostname))
    check_slots(order, devices, templates, cluster)
    return order


def check_slots(order: list[str], devices: dict, templates: dict, cluster: ClusterSpec) -> None:
    """LaunchError naming the node when the ranks `order` puts on it exceed its MPI slots."""
    per_node: dict[str, int] = {}
    for name in order:
        per_node[devices[name].node] = per_node.get(devices[name].node, 0) + 1
    for name in order:
        d = devices[name]
        i, node = templates[d.node_template]
        if node.slots is not None and per_node[d.node] > node.slots:
            raise LaunchError(
                f"{cluster.source}: nodes[{i}].slots: node {d.node!r} has {node.slots} MPI slots "
                f"but the plan puts {per_node[d.node]} ranks on it"
            )
