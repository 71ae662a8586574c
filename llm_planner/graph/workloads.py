"""Importer of the dnn-partitioning workload format (Tarnawski et al., NeurIPS 2020).

"Efficient Algorithms for Device Placement of DNN Graph Operators", repository
msr-fiddle/dnn-partitioning. One JSON object per file:

    maxFPGAs        accelerators, all identical          maxCPUs   CPU cores
    maxSizePerFPGA  memory of one accelerator (bytes)
    nodes[]         id, name, cpuLatency, fpgaLatency, supportedOnFpga (bool or 0/1),
                    size (bytes the node holds on an accelerator), colorClass
                    (optional: nodes of one class share a device), isBackwardNode,
                    layerId (optional)
    edges[]         sourceId, destId, cost (time to move the source's output between
                    an accelerator and CPU memory; the same on every edge out of a
                    node), size (bytes, informative)

How we read it (docs/graph-format.md has the full table):
- The file defines its own devices: one node "host" with maxFPGAs devices of kind
  "accelerator" (type accelerator, mem_bytes = maxSizePerFPGA) and maxCPUs of
  kind "cpu" (type cpu, unlimited memory); a kind with count 0 is left out. Every
  time is explicit, so peak_flops and memory bandwidth are placeholders (1.0)
  and the intra-node link is free (infinite bandwidth, no latency).
- Times are kept as the file gives them and called seconds (the files do not
  state a unit; the published optima are in the same unit).
- Task name = node name; when names repeat (or are missing) every task is named
  "<id>:<name>" (or "<id>"), so names stay unique and stable.
- time_s_by_kind = accelerator: fpgaLatency, cpu: cpuLatency; supportedOnFpga 0 ->
  device_types ("cpu",); colorClass -> colocate_group (its decimal string) when
  the class has more than one member; size -> weight_bytes, counted against
  accelerator memory only (mem_device_types ("accelerator",)).
- Edge: bytes_per_sample = size, hop_s_per_sample = cost. A transfer costs `cost`
  once per accelerator end (accelerator -> CPU: cost, accelerator -> accelerator:
  2 cost, CPU -> CPU: 0), see llm_planner.cost.roofline.transfer_hops; under the
  throughput objective an accelerator pays `cost` once per own node whose output
  leaves it and once per outside node whose output enters it, a CPU pays only its
  nodes' times (llm_planner.placement.schedule.device_loads, "host_staged").
Unknown keys are ignored: the format allows extra debug information.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_planner.core.fileio import read_document
from llm_planner.core.spec import MAX_DEVICES, ClusterSpec, DeviceKindSpec, LinkSpec, NodeSpec
from llm_planner.graph.ir import MAX_EDGES, MAX_TASKS, Edge, GraphError, Task, TaskGraph

WORKLOAD_FORMAT = "dnn-partitioning"
ACCELERATOR = "accelerator"
CPU = "cpu"
HOST = "host"
_TOP_KEYS = ("maxFPGAs", "maxCPUs", "maxSizePerFPGA")
_PLACEHOLDER = 1.0  # peak_flops and mem_bw of the device kinds: never used, every time is explicit


@dataclass(frozen=True, kw_only=True)
class _Node:
    id: int
    name: str | None
    cpu_latency: float
    fpga_latency: float
    supported_on_fpga: bool
    size: float
    color_class: int | None
    is_backward: bool
    layer_id: int | None


def is_workload(data: Any) -> bool:
    """Whether parsed JSON looks like a dnn-partitioning workload (not one of our graph files)."""
    return isinstance(data, dict) and "format" not in data and "nodes" in data and any(k in data for k in _TOP_KEYS)


# ----------------------------------------------------------------------------
# Field readers: every error names the file, the record and the field.


def _fail(where: str, key: str, what: str) -> GraphError:
    return GraphError(f"{where}: field {key!r}: {what}")


def _int(raw: dict, key: str, where: str, *, required: bool = True) -> int | None:
    if key not in raw:
        if required:
            raise _fail(where, key, "missing required field")
        return None
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, key, f"expected an integer, got {value!r}")
    return value


def _number(raw: dict, key: str, where: str, *, default: float | None = None) -> float:
    if key not in raw:
        if default is None:
            raise _fail(where, key, "missing required field")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _fail(where, key, f"expected a finite number >= 0, got {value!r}")
    return float(value)


def _flag(raw: dict, key: str, where: str, *, default: bool | None = None) -> bool:
    if key not in raw:
        if default is None:
            raise _fail(where, key, "missing required field")
        return default
    value = raw[key]
    if value not in (0, 1) or not isinstance(value, (bool, int)):
        raise _fail(where, key, f"expected true/false or 0/1, got {value!r}")
    return bool(value)


def _list(data: dict, key: str, source: str, limit: int) -> list:
    if key not in data:
        raise _fail(source, key, "missing required field")
    if not isinstance(data[key], list):
        raise _fail(source, key, f"expected a list, got {type(data[key]).__name__}")
    if len(data[key]) > limit:
        raise _fail(source, key, f"{len(data[key]):,} records; the limit is {limit:,} (docs/inputs.md)")
    return data[key]


def _read_node(raw: Any, i: int, source: str) -> _Node:
    where = f"{source}: nodes[{i}]"
    if not isinstance(raw, dict):
        raise GraphError(f"{where}: expected an object, got {type(raw).__name__}")
    node_id = _int(raw, "id", where)
    where = f"{where} (id {node_id})"
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise _fail(where, "name", f"expected a non-empty string, got {name!r}")
    return _Node(
        id=node_id,  # type: ignore[arg-type]
        name=name,
        cpu_latency=_number(raw, "cpuLatency", where),
        fpga_latency=_number(raw, "fpgaLatency", where),
        supported_on_fpga=_flag(raw, "supportedOnFpga", where),
        size=_number(raw, "size", where),
        color_class=_int(raw, "colorClass", where, required=False),
        is_backward=_flag(raw, "isBackwardNode", where, default=False),
        layer_id=_int(raw, "layerId", where, required=False),
    )


def _read_nodes(data: dict, source: str) -> list[_Node]:
    nodes = [_read_node(raw, i, source) for i, raw in enumerate(_list(data, "nodes", source, MAX_TASKS))]
    if not nodes:
        raise _fail(source, "nodes", "the workload has no nodes")
    seen: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.id in seen:
            raise _fail(f"{source}: nodes[{i}]", "id", f"duplicate id {n.id} (also nodes[{seen[n.id]}])")
        seen[n.id] = i
    return nodes


def _task_names(nodes: list[_Node]) -> dict[int, str]:
    """Node id -> task name: the node's name, or "<id>:<name>" for all when names repeat or miss."""
    names = [n.name for n in nodes]
    if None not in names and len(set(names)) == len(names):
        return {n.id: n.name for n in nodes}  # type: ignore[misc]
    return {n.id: f"{n.id}:{n.name}" if n.name is not None else str(n.id) for n in nodes}


# ----------------------------------------------------------------------------
# Graph and devices


def _tasks(nodes: list[_Node], names: dict[int, str], num_cpus: int, source: str) -> list[Task]:
    class_sizes = Counter(n.color_class for n in nodes if n.color_class is not None)
    tasks = []
    for i, n in enumerate(nodes):
        if not n.supported_on_fpga and num_cpus == 0:
            raise _fail(
                f"{source}: nodes[{i}] (id {n.id})",
                "supportedOnFpga",
                "the node cannot run on an accelerator and maxCPUs is 0",
            )
        labels: list[tuple[str, Any]] = [("id", n.id), ("is_backward", n.is_backward)]
        if n.color_class is not None:
            labels.append(("color_class", n.color_class))
        if n.layer_id is not None:
            labels.append(("layer_id", n.layer_id))
        grouped = n.color_class is not None and class_sizes[n.color_class] > 1
        tasks.append(
            Task(
                name=names[n.id],
                kind="backward" if n.is_backward else "forward",
                weight_bytes=n.size,
                time_s_by_kind=((ACCELERATOR, n.fpga_latency), (CPU, n.cpu_latency)),
                device_types=() if n.supported_on_fpga else ("cpu",),
                colocate_group=str(n.color_class) if grouped else "",
                mem_device_types=("accelerator",),
                labels=tuple(labels),
            )
        )
    return tasks


def _edges(data: dict, names: dict[int, str], source: str) -> list[Edge]:
    edges: list[Edge] = []
    first: dict[tuple[int, int], int] = {}
    cost_of: dict[int, tuple[float, int]] = {}  # source id -> (cost, first edge index)
    for i, raw in enumerate(_list(data, "edges", source, MAX_EDGES)):
        where = f"{source}: edges[{i}]"
        if not isinstance(raw, dict):
            raise GraphError(f"{where}: expected an object, got {type(raw).__name__}")
        src, dst = _int(raw, "sourceId", where), _int(raw, "destId", where)
        where = f"{where} ({src} -> {dst})"
        for key, end in (("sourceId", src), ("destId", dst)):
            if end not in names:
                raise _fail(where, key, f"no node has id {end}")
        if src == dst:
            raise GraphError(f"{where}: an edge from a node to itself")
        if (src, dst) in first:
            raise GraphError(f"{where}: duplicate of edges[{first[(src, dst)]}]")
        first[(src, dst)] = i
        cost = _number(raw, "cost", where)
        known = cost_of.setdefault(src, (cost, i))  # type: ignore[arg-type]
        if known[0] != cost:
            raise _fail(
                where,
                "cost",
                f"{cost} differs from {known[0]} on edges[{known[1]}]; edges out of one node must share their cost",
            )
        edges.append(
            Edge(
                src=names[src],
                dst=names[dst],
                bytes_per_sample=_number(raw, "size", where, default=0.0),
                hop_s_per_sample=cost,
            )
        )  # type: ignore[index]
    return edges


def _cluster(data: dict, name: str, source: str) -> ClusterSpec:
    num_acc, num_cpu = _int(data, "maxFPGAs", source), _int(data, "maxCPUs", source)
    assert num_acc is not None and num_cpu is not None, "required fields"
    mem = _number(data, "maxSizePerFPGA", source)
    for key, count in (("maxFPGAs", num_acc), ("maxCPUs", num_cpu)):
        if count < 0:
            raise _fail(source, key, f"must be >= 0, got {count}")
    if num_acc + num_cpu == 0:
        raise _fail(source, "maxFPGAs", "maxFPGAs and maxCPUs are both 0: no device to place on")
    if num_acc + num_cpu > MAX_DEVICES:
        raise _fail(
            source,
            "maxFPGAs",
            f"maxFPGAs + maxCPUs = {num_acc + num_cpu:,} devices; the limit is {MAX_DEVICES:,} (docs/inputs.md)",
        )
    if num_acc and mem <= 0:
        raise _fail(source, "maxSizePerFPGA", f"must be positive, got {mem}")
    placeholder = (("fp16", _PLACEHOLDER),)
    kinds = []
    if num_acc:
        kinds.append(
            DeviceKindSpec(
                name=ACCELERATOR,
                type="accelerator",
                peak_flops=placeholder,
                mem_bytes=mem,
                mem_bw_bytes_per_s=_PLACEHOLDER,
                usable_mem_fraction=1.0,
            )
        )  # the file's memory is the budget it was solved with
    if num_cpu:
        kinds.append(
            DeviceKindSpec(
                name=CPU, type="cpu", peak_flops=placeholder, mem_bytes=math.inf, mem_bw_bytes_per_s=_PLACEHOLDER
            )
        )
    counts = {ACCELERATOR: num_acc, CPU: num_cpu}
    devices_key = {key: data[key] for key in _TOP_KEYS}
    return ClusterSpec(
        name=f"{name}-devices",
        description=f"devices of the {WORKLOAD_FORMAT} workload {name}: {num_acc} accelerators, {num_cpu} CPU cores",
        device_kinds=tuple(kinds),
        nodes=(NodeSpec(name=HOST, devices=tuple((k.name, counts[k.name]) for k in kinds)),),
        intra_node_default=LinkSpec(bw_bytes_per_s=math.inf, latency_s=0.0),
        source=source,
        sha256=hashlib.sha256(json.dumps(devices_key, sort_keys=True).encode()).hexdigest(),
    )


def workload_from_dict(data: Any, source: str = "<memory>") -> tuple[TaskGraph, ClusterSpec]:
    """A parsed dnn-partitioning file -> (task graph, its devices); GraphError naming `source`."""
    if not isinstance(data, dict):
        raise GraphError(f"{source}: a {WORKLOAD_FORMAT} workload is a JSON object, got {type(data).__name__}")
    name = Path(source).stem if source != "<memory>" else "workload"
    cluster = _cluster(data, name, source)
    nodes = _read_nodes(data, source)
    names = _task_names(nodes)
    num_cpus = sum(count for kind, count in cluster.nodes[0].devices if kind == CPU)
    tasks = _tasks(nodes, names, num_cpus, source)
    edges = _edges(data, names, source)
    meta = (("source", source), ("workload_format", WORKLOAD_FORMAT))
    graph = TaskGraph(name=name, tasks=tuple(tasks), edges=tuple(edges), meta=meta)
    try:
        graph.validate()
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None
    return graph, cluster


def load_workload(path: str | Path) -> tuple[TaskGraph, ClusterSpec]:
    """Read a dnn-partitioning JSON file."""
    data = read_document(path, GraphError, finite=True)
    return workload_from_dict(data, source=str(path))
