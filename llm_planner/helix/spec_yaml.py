"""Our cluster spec (docs/cluster-spec.md) for a Helix cluster file: what `llm-planner import helix`
writes (llm_planner.helix.inputs reads the files and names the machines).

One node template per machine type (per type and region on a cluster of several regions,
llm_planner.helix.inputs.machine_templates), device kinds from the GPU data sheets, memory from
Helix's machine profile. Links: Helix gives one per pair of machines; the spec gets, per pair of
regions, the slowest pair of machines between the two regions (bandwidth with both ends' NICs, the
largest latency) as a `between_regions` rule, and inside a region the slowest pair inside it
(`region_links`); a cluster of one region gets its slowest pair as `inter_node`. The YAML's
comments say which pairs each link stands for.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from llm_planner.helix.inputs import (
    HelixCluster,
    HelixError,
    HelixMachineType,
    device_helix_names,
    find_regions,
    kind_for,
    load_datasheets,
    machine_templates,
    pair_bw,
    region_name,
    slowest_link,
)


def _fmt(value: float, unit: str) -> str:
    """1.555e12, "B/s" -> "1555 GB/s"; plain base units below a thousand."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.6g} {prefix}{unit}"
    return f"{value:.6g} {unit}"


def _seconds(value: float) -> str:
    for suffix, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{value / scale:.6g} {suffix}"
    return f"{value / 1e-9:.6g} ns" if value else "0"


def region_links(cluster: HelixCluster) -> dict[tuple[int, int], tuple[float, float, int]]:
    """(region i, region j), i <= j -> (bytes/s, seconds, machine pairs): the slowest pair of
    machines between the two regions (inside region i when i = j), NICs included, the largest
    latency, and how many of the cluster file's links they stand for."""
    where = {i: r for r, members in enumerate(find_regions(cluster)) for i in members}
    out: dict[tuple[int, int], tuple[float, float, int]] = {}
    for link in cluster.links:
        if not (link.a.isdigit() and link.b.isdigit()) or link.a == link.b:
            continue
        a, b = int(link.a), int(link.b)
        key = (min(where[a], where[b]), max(where[a], where[b]))
        bw0, lat0, n = out.get(key, (math.inf, 0.0, 0))
        out[key] = (min(bw0, pair_bw(cluster, a, b, link.bw_bytes_per_s)), max(lat0, link.latency_s), n + 1)
    return dict(sorted(out.items()))


def _link_text(bw: float, latency: float) -> str:
    return f"bw_bytes_per_s: {_fmt(bw, 'B/s')}, latency_s: {_seconds(latency)}"


def _links_lines(cluster: HelixCluster) -> tuple[list[str], list[str]]:
    """(comment lines, YAML lines) of the spec's links (module docstring)."""
    regions = find_regions(cluster)
    pair_bws = sorted({link.bw_bytes_per_s for link in cluster.links if link.a.isdigit() and link.b.isdigit()})
    listed = ", ".join(_fmt(b, "B/s") for b in pair_bws) if len(pair_bws) <= 8 else None
    listed = listed or (f"{_fmt(pair_bws[0], 'B/s')} to {_fmt(pair_bws[-1], 'B/s')}" if pair_bws else "none")
    comments = [
        f"# Links: Helix gives one per pair of machines ({len(pair_bws)} distinct bandwidths: "
        f"{listed}) and NICs that a machine's links share;",
    ]
    if len(regions) == 1:
        bw, latency = slowest_link(cluster)
        comments += [
            "# our format has one link between nodes, so inter_node is the slowest pair (NICs included) with the",
            "# largest latency. Links to Helix's coordinator (source/sink) are not imported.",
        ]
        return comments, ["links:", f"  inter_node: {{{_link_text(bw, latency)}}}"]
    comments += [
        f"# its machines form {len(regions)} regions (machines joined by links much faster than the others):",
        *(f"#   {region_name(r)}: ComputeNode-{', '.join(map(str, members))}" for r, members in enumerate(regions)),
        "# links.between_regions gives per pair of regions the slowest pair of machines between the two regions",
        "# (NICs included) with the largest latency, and per region the slowest pair inside it. Links to Helix's",
        "# coordinator (source/sink) are not imported.",
    ]
    lines = ["links:", "  between_regions:"]
    found = region_links(cluster)
    for (i, j), (bw, latency, n) in found.items():
        what = f"slowest of the {n} pairs " + (f"inside {region_name(i)}" if i == j else "between the two regions")
        lines.append(f"    - {{between: [{region_name(i)}, {region_name(j)}], {_link_text(bw, latency)}}}  # {what}")
    sizes = [len(m) for m in regions]
    missing = [(i, j) for i in range(len(regions)) for j in range(i, len(regions)) if (i, j) not in found]
    if any(i != j or sizes[i] > 1 for i, j in missing):
        bw, latency = slowest_link(cluster)
        names = ", ".join(f"{region_name(i)}-{region_name(j)}" for i, j in missing)
        lines += [
            f"  # no Helix link joins machines of {names}: those pairs take the slowest pair of the cluster",
            f"  inter_node: {{{_link_text(bw, latency)}}}",
        ]
    return comments, lines


def cluster_spec_yaml(
    cluster: HelixCluster, *, name: str | None = None, datasheets: dict[str, dict] | None = None
) -> str:
    """Our cluster spec (docs/cluster-spec.md) for a Helix cluster, as YAML text with comments."""
    datasheets = load_datasheets() if datasheets is None else datasheets
    name = name or Path(cluster.source).stem
    counts = {m.name: cluster.node_types.count(m.name) for m in cluster.machine_types}
    summary = ", ".join(f"{n}x {m}" for m, n in counts.items())
    link_comments, link_lines = _links_lines(cluster)
    lines = [
        f"# Imported from the Helix cluster file {Path(cluster.source).name} (llm-planner import helix):",
        f"# {len(cluster.node_types)} machines: {summary}.",
        "# GPU compute and memory bandwidth: vendor data sheets (llm_planner/core/data/gpu_datasheets.yaml,",
        "# sources there); memory: Helix's machine profile (vram_size, split evenly over a machine's GPUs).",
        "# Helix's units are powers of 1000 and its simulator divides bytes by them, so a `1000 * mbps`",
        "# link moves 1e9 bytes/s there; the bandwidths below are those the simulator uses.",
        *link_comments,
        "# Device -> Helix node (a plan written back as a Helix layout uses these names):",
    ]
    lines += [f"#   {device} -> {helix}" for device, helix in device_helix_names(cluster, datasheets).items()]
    description = f"Helix cluster {Path(cluster.source).name}: {summary}"
    lines += [f"name: {json.dumps(name)}", f"description: {json.dumps(description)}", "device_kinds:"]
    lines += _kinds_lines(cluster, datasheets)
    lines.append("nodes:")
    for template, region, indices in machine_templates(cluster):
        machine = cluster.machine_type(cluster.node_types[indices[0]])
        kind = kind_for(machine.gpu, datasheets, cluster.source)
        lines += [f"  - name: {template}", f"    count: {len(indices)}", f"    devices: {{{kind}: {machine.num_gpus}}}"]
        if region is not None:
            lines.append(f"    region: {region}")
        if machine.num_gpus > 1:
            link = datasheets[kind]["intra_node_link"]
            lines.append(
                f"    links: [{{between: [{kind}, {kind}], bw_bytes_per_s: {link['bw_bytes_per_s']}, "
                f"latency_s: {link['latency_s']}}}]"
            )
    return "\n".join(lines + link_lines) + "\n"


def _kinds_lines(cluster: HelixCluster, datasheets: dict[str, dict]) -> list[str]:
    """The device kinds: one per GPU of the machine types, memory split over a machine's GPUs."""
    kinds: dict[str, HelixMachineType] = {}
    for machine in cluster.machine_types:
        kind = kind_for(machine.gpu, datasheets, cluster.source)
        mem = machine.vram_bytes / machine.num_gpus
        if kind in kinds and kinds[kind].vram_bytes / kinds[kind].num_gpus != mem:
            raise HelixError(
                f"{cluster.source}: machine types {kinds[kind].name} and {machine.name} "
                f"give {kind} different memory per GPU"
            )
        kinds.setdefault(kind, machine)
    lines = []
    for kind, machine in kinds.items():
        sheet = datasheets[kind]
        flops = ", ".join(f"{k}: {v}" for k, v in sheet["peak_flops"].items())
        lines += [
            f"  - name: {kind}",
            "    type: gpu",
            f"    peak_flops: {{{flops}}}",
            f"    mem_bytes: {_fmt(machine.vram_bytes / machine.num_gpus, 'B')}",
            f"    mem_bw_bytes_per_s: {sheet['mem_bw_bytes_per_s']}",
        ]
    return lines
