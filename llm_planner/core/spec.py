"""Cluster specs: the YAML file that describes servers, devices and links.

The format is documented field by field in docs/cluster-spec.md. YAML keys map
one to one to dataclass fields; values may carry human units ("80 GiB",
"25 GB/s", "2 us") which are converted here, once. Every error names the file,
the path of the field and what is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llm_planner.core.catalog import (
    DEFAULT_EFFICIENCY,
    catalog_entry,
    catalog_names,
    engine_entries,
    engine_fields,
    engine_names,
)
from llm_planner.core.fileio import load_document
from llm_planner.core.names import hostname_problem
from llm_planner.core.spec_fields import (
    Reader,
    SpecError,
    as_hostname,
    as_int,
    as_name,
    as_safe_name,
    as_str,
    as_text,
)
from llm_planner.core.spec_kinds import REQUIRED_KIND_FIELDS, read_kind_fields
from llm_planner.core.spec_links import (
    IntraLinkSpec,
    LinkSpec,
    RegionLinkSpec,
    check_intra_links,
    check_regions,
    check_server_links,
    read_intra_links,
    read_link,
    read_region_links,
    region_pairs,
)

__all__ = ["ClusterSpec", "DeviceKindSpec", "DeviceSpec", "IntraLinkSpec", "LinkSpec", "NodeSpec", "RegionLinkSpec"]

# Default share of a device's memory that a plan may fill, by device type. vLLM's
# gpu_memory_utilization defaults to 0.9 for the same reason: the CUDA context, the
# allocator's fragmentation and NCCL's buffers live in the rest. A CPU's host memory
# is the spec's number (set usable_mem_fraction to keep room for the OS).
USABLE_MEM_DEFAULT = {"cpu": 1.0, "gpu": 0.9, "accelerator": 0.9}
# Devices of the expanded cluster: far beyond this the placement problem no longer fits in
# memory or in minutes (docs/inputs.md).
MAX_DEVICES = 65536
# Fixed time a serving engine spends per iteration on each pipeline stage besides the model's
# kernels (scheduling, input preparation, sampling, launch and the stage's hand-off bookkeeping),
# by device type. An order-of-magnitude default: the vLLM and SGLang teams report CPU-side work
# of the order of a millisecond per decode step before their overlapped schedulers (vLLM
# v0.6.0 performance update, 2024-09; SGLang v0.4 "zero-overhead batch scheduler", 2024-12).
# Set `step_overhead_s` per kind from a measurement (docs/serving.md).
STEP_OVERHEAD_DEFAULT = {"cpu": 1e-3, "gpu": 1e-3, "accelerator": 1e-3}
# Fixed time per collective call (an all-reduce of a tensor-parallel group) besides its link
# latencies and size term, by device type: the catalog's figure (core/data/gpu_catalog.yaml),
# fitted on measured vLLM and TensorRT-LLM decode, whose all-reduces run inside captured CUDA graphs with a
# one-shot kernel for small messages (docs/fidelity.md); NCCL called outside graphs takes 18-99 us
# per call at 18 KB-4 MB on A100 and H100 servers (Vidur's network profiles). CPU groups (MPI over
# shared memory) carry it in the link's latency. Set `collective_overhead_s` per kind from a
# measurement.
COLLECTIVE_OVERHEAD_DEFAULT = {"cpu": 0.0, "gpu": 8e-6, "accelerator": 8e-6}
# The share of their link's bandwidth a tensor-parallel group's collectives reach (the size term's
# bandwidth over the link's), by device type. GPUs and accelerators: the catalog's A100 figure,
# the slope of NCCL all-reduce time over message size from 1 to 64 MiB in Vidur's network profiles
# against the servers' NVLink bandwidth (core/data/gpu_catalog.yaml; docs/fidelity.md). CPU groups:
# 1, their links being measured figures (`llm-planner profile`). Set `collective_efficiency` per
# kind from a measurement.
COLLECTIVE_EFFICIENCY_DEFAULT = {"cpu": 1.0, "gpu": 0.61, "accelerator": 0.61}
# Whether devices of a kind may form tensor-parallel groups, by device type: GPUs and accelerators
# do (NCCL-style collectives over NVLink or PCIe); CPU sockets do not (no engine shards a layer
# over sockets with all-reduces per layer). A kind's `tensor_parallel` overrides it.
TENSOR_PARALLEL_DEFAULT = {"cpu": False, "gpu": True, "accelerator": True}


@dataclass(frozen=True, kw_only=True)
class DeviceKindSpec:
    """One kind of device (a GPU model, a CPU socket)."""

    name: str
    type: str  # one of DEVICE_TYPES
    peak_flops: tuple[tuple[str, float], ...]  # (dtype, FLOP/s) pairs
    mem_bytes: float  # math.inf for unlimited (CPUs sharing host memory)
    mem_bw_bytes_per_s: float
    # Fractions of peak FLOP/s and of peak memory bandwidth reached in practice. A kind read from a file
    # that states neither and names no catalog entry gets its type's DEFAULT_EFFICIENCY (llm_planner.core.catalog).
    compute_efficiency: float = 1.0
    mem_efficiency: float = 1.0
    overhead_s: float = 0.0  # fixed time per task (kernel launches, dispatch)
    # Fixed time per collective call of a tensor-parallel group; None: COLLECTIVE_OVERHEAD_DEFAULT.
    collective_overhead_s: float | None = None
    # Share of the link's bandwidth its collectives reach; None: COLLECTIVE_EFFICIENCY_DEFAULT.
    collective_efficiency: float | None = None
    # Share of mem_bytes a plan may fill; None: the type's default (USABLE_MEM_DEFAULT).
    usable_mem_fraction: float | None = None
    # Serving: fixed time per engine iteration on a stage of this kind; None: STEP_OVERHEAD_DEFAULT.
    step_overhead_s: float | None = None
    # Serving: the engine's time per sequence in an iteration (scheduling it, sampling, detokenizing
    # and streaming its token), on the last stage; None: 0 (catalog entries state it; docs/cluster-spec.md).
    sequence_overhead_s: float | None = None
    # Whether its devices may form tensor-parallel groups; None: the type's TENSOR_PARALLEL_DEFAULT.
    tensor_parallel: bool | None = None
    # Weights the kind dequantizes in its kernels (int4-awq, int4-gptq; fp8 without an fp8 peak): the
    # factor on the linear layers' compute time (llm_planner.core.precision; docs/cluster-spec.md).
    dequant_factor: float = 1.0
    # Serving, a KV cache stored below the activation dtype (fp8): the factor on attention's time for
    # its bytes (1: read at the stored bytes, a kernel that dequantizes in registers as it reads; 2 for
    # fp8 under 16-bit activations: at the 16-bit cache's time, an engine that gains no latency from it).
    kv_dequant_factor: float = 1.0
    # Serving and decoder layers, a precision whose linear layers compute in 8 bits (W8A8: fp8, int8):
    # the fixed time per decoder layer its own kernels add (quantizing each projection's input,
    # scaling its output), on top of overhead_s; 0 unless set (docs/cluster-spec.md).
    w8a8_overhead_s: float = 0.0
    # Serving, decode attention: the least time per key of one sequence's KV cache (an engine whose
    # decode kernel streams one sequence's cache on a few of the GPU's cores takes at least a
    # sequence's keys times this, however few sequences run); 0 unless set (docs/cluster-spec.md).
    decode_key_s: float = 0.0
    # Where its figures came from (not figures themselves, so kinds compare by their numbers alone):
    # the catalog entry it names, the engine whose factor set it takes over the entry's, and the
    # fields the loader filled with a type's default.
    catalog: str | None = field(default=None, compare=False)
    engine: str | None = field(default=None, compare=False)
    defaulted: tuple[str, ...] = field(default=(), compare=False)

    @property
    def forms_tensor_groups(self) -> bool:
        """Whether devices of this kind may form tensor-parallel groups (TENSOR_PARALLEL_DEFAULT)."""
        return TENSOR_PARALLEL_DEFAULT[self.type] if self.tensor_parallel is None else self.tensor_parallel

    @property
    def serving_step_s(self) -> float:
        """Fixed time per engine iteration on a serving stage of this kind (STEP_OVERHEAD_DEFAULT)."""
        return STEP_OVERHEAD_DEFAULT[self.type] if self.step_overhead_s is None else self.step_overhead_s

    @property
    def serving_sequence_s(self) -> float:
        """The engine's time per sequence per iteration on a serving replica's last stage (0 unless set)."""
        return 0.0 if self.sequence_overhead_s is None else self.sequence_overhead_s

    @property
    def collective_call_s(self) -> float:
        """Fixed time per collective call on a group of this kind (COLLECTIVE_OVERHEAD_DEFAULT)."""
        default = COLLECTIVE_OVERHEAD_DEFAULT[self.type]
        return default if self.collective_overhead_s is None else self.collective_overhead_s

    @property
    def collective_bw_efficiency(self) -> float:
        """Share of the link's bandwidth a group's collectives reach (COLLECTIVE_EFFICIENCY_DEFAULT)."""
        default = COLLECTIVE_EFFICIENCY_DEFAULT[self.type]
        return default if self.collective_efficiency is None else self.collective_efficiency

    @property
    def usable_mem_bytes(self) -> float:
        """Memory a plan may fill: mem_bytes times the usable fraction (serving engines keep the
        rest for the runtime: CUDA context, allocator fragmentation, collectives' buffers)."""
        fraction = USABLE_MEM_DEFAULT[self.type] if self.usable_mem_fraction is None else self.usable_mem_fraction
        return self.mem_bytes * fraction

    @property
    def peak_dtypes(self) -> tuple[str, ...]:
        """The dtypes its peak_flops give."""
        return tuple(name for name, _ in self.peak_flops)

    def flops_for(self, dtype: str) -> float:
        for name, value in self.peak_flops:
            if name == dtype:
                return value
        raise KeyError(dtype)


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """A server template; `count` identical copies of it are in the cluster."""

    name: str
    devices: tuple[tuple[str, int], ...]  # (kind name, how many)
    count: int = 1
    hostname: str | None = None  # may contain "{i}" for the copy index
    slots: int | None = None  # MPI slots; defaults to the number of devices
    links: tuple[IntraLinkSpec, ...] = ()  # overrides of the cluster's intra-node links
    region: str | None = None  # where its servers sit (links.between_regions); None: the cluster has no regions


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One concrete device of the expanded cluster."""

    name: str  # "<node>/<kind>:<index>"
    kind: str
    node: str  # expanded node name ("dgx-1")
    node_template: str  # NodeSpec.name ("dgx")
    index: int  # index among devices of its kind in its node (a group: its first member's)
    hostname: str | None
    members: tuple[
        str, ...
    ] = ()  # a tensor-parallel group (llm_planner.core.tensor_groups): its devices; () for one device

    @property
    def degree(self) -> int:
        """Devices that run a task placed here: 1, or the group's size."""
        return max(1, len(self.members))


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    device_kinds: tuple[DeviceKindSpec, ...]
    nodes: tuple[NodeSpec, ...]
    intra_node_default: LinkSpec | None = None
    intra_node: tuple[IntraLinkSpec, ...] = ()
    inter_node: LinkSpec | None = None  # between two servers that no between_regions rule names
    between_regions: tuple[RegionLinkSpec, ...] = ()
    description: str = ""
    source: str = field(default="<memory>", compare=False)
    sha256: str = field(default="", compare=False)

    def kind(self, name: str) -> DeviceKindSpec:
        for kind in self.device_kinds:
            if kind.name == name:
                return kind
        raise KeyError(name)

    def node_names(self) -> list[tuple[str, NodeSpec, int]]:
        """Expanded nodes as (name, template, copy index)."""
        out = []
        for node in self.nodes:
            for i in range(node.count):
                out.append((node.name if node.count == 1 else f"{node.name}-{i}", node, i))
        return out

    def devices(self) -> tuple[DeviceSpec, ...]:
        return self._devices

    def device_map(self) -> Mapping[str, DeviceSpec]:
        """Device name -> device (a read-only view; the cached dict itself stays picklable)."""
        return MappingProxyType(self._device_map)

    @functools.cached_property
    def _device_map(self) -> dict[str, DeviceSpec]:
        return {d.name: d for d in self._devices}

    @functools.cached_property
    def _devices(self) -> tuple[DeviceSpec, ...]:
        out = []
        for node_name, node, i in self.node_names():
            host = node.hostname.format(i=i) if node.hostname else None
            for kind, num in node.devices:
                for j in range(num):
                    out.append(
                        DeviceSpec(
                            name=f"{node_name}/{kind}:{j}",
                            kind=kind,
                            node=node_name,
                            node_template=node.name,
                            index=j,
                            hostname=host,
                        )
                    )
        return tuple(out)

    def link(self, a: DeviceSpec, b: DeviceSpec) -> LinkSpec | None:
        """The link class between two devices; None for the same device."""
        path = self.link_path(a, b)
        return None if path is None else self.link_at(path)

    def region_of(self, template: str) -> str | None:
        """The region of a node template's servers (None: the cluster names no regions)."""
        return self.nodes[self._template_index[template]].region

    def regions(self) -> tuple[str, ...]:
        """The regions the nodes name, in spec order (() when none does)."""
        return tuple(dict.fromkeys(n.region for n in self.nodes if n.region is not None))

    @functools.cached_property
    def _template_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    def server_link_path(self, region_a: str | None, region_b: str | None) -> tuple[str | int, ...] | None:
        """The rule of the link between a server of region_a and another server of region_b: the
        `between_regions` rule for the pair, else ("links", "inter_node"); None when the spec has
        neither (no two such servers exist: the loader checks every pair of servers has one)."""
        pair = {region_a, region_b}
        for i, rule in enumerate(self.between_regions):
            if set(rule.between) == pair:
                return ("links", "between_regions", i)
        return ("links", "inter_node") if self.inter_node is not None else None

    def server_link(self, region_a: str | None, region_b: str | None) -> LinkSpec | None:
        """The link of `server_link_path` (None where it names none)."""
        path = self.server_link_path(region_a, region_b)
        return None if path is None else self.link_at(path)

    def link_path(self, a: DeviceSpec, b: DeviceSpec) -> tuple[str | int, ...] | None:
        """Where the rule for the link between two devices lives in the spec (the one rule every
        link is chosen by): across nodes the rule for their regions ("links", "between_regions", i)
        or ("links", "inter_node"); in one node the template's rule for the pair of kinds
        ("nodes", t, "links", i), the cluster's ("links", "intra_node", i), or
        ("links", "intra_node_default"); None for the same device."""
        if a.name == b.name:
            return None
        if a.node != b.node:
            path = self.server_link_path(self.region_of(a.node_template), self.region_of(b.node_template))
            assert path is not None, "checked by the loader"
            return path
        t = self._template_index[a.node_template]
        pair = {a.kind, b.kind}
        for i, rule in enumerate(self.nodes[t].links):
            if set(rule.between) == pair:
                return ("nodes", t, "links", i)
        for i, rule in enumerate(self.intra_node):
            if set(rule.between) == pair:
                return ("links", "intra_node", i)
        assert self.intra_node_default is not None, "checked by the loader"
        return ("links", "intra_node_default")

    def link_at(self, path: tuple[str | int, ...]) -> LinkSpec:
        """The link of a rule `link_path` names."""
        if path == ("links", "inter_node"):
            return self.inter_node
        if path == ("links", "intra_node_default"):
            return self.intra_node_default
        if path[0] == "nodes":
            return self.nodes[path[1]].links[path[3]].link
        if path[1] == "between_regions":
            return self.between_regions[path[2]].link
        return self.intra_node[path[2]].link


# ----------------------------------------------------------------------------
# Loading


def _read_kind(c: Reader) -> DeviceKindSpec:
    """A device kind: the fields it states, over those of the catalog entry it names (if any); the
    efficiencies neither gives are the type's DEFAULT_EFFICIENCY, recorded in `defaulted`."""
    name = c.get("name", as_safe_name)
    catalog = c.get("catalog", as_str, default=None)
    engine = c.get("engine", as_str, default=None)
    fields = read_kind_fields(c)
    if catalog is not None:
        if catalog not in catalog_names():
            c.fail(f"unknown catalog entry {catalog!r} (known: {', '.join(catalog_names())})", "catalog")
        fields = {**catalog_entry(catalog), **_engine_fields(c, engine, catalog), **fields}
    elif engine is not None:
        c.fail("an engine's factors stand over a catalog entry's: name one with `catalog`", "engine")
    for key in REQUIRED_KIND_FIELDS:
        if key not in fields:
            c.fail("missing required field (state it, or name a catalog entry with `catalog`)", key)
    c.done()
    defaulted = []
    for key, default in zip(("compute_efficiency", "mem_efficiency"), DEFAULT_EFFICIENCY[fields["type"]]):
        if key not in fields:
            fields[key] = default
            defaulted.append(key)
    return DeviceKindSpec(name=name, catalog=catalog, engine=engine, defaulted=tuple(defaulted), **fields)


def _engine_fields(c: Reader, engine: str | None, catalog: str) -> dict:
    """The fields engine's factor set gives a kind of catalog entry `catalog` ({} for no engine)."""
    if engine is None:
        return {}
    if engine not in engine_names():
        c.fail(f"unknown engine {engine!r} (known: {', '.join(engine_names())})", "engine")
    try:
        return engine_fields(engine, catalog)
    except KeyError:
        entries = ", ".join(engine_entries(engine))
        c.fail(
            f"engine {engine!r} has no factors fitted for catalog entry {catalog!r} (it has for: {entries}); "
            "leave `engine` out to take the catalog's, or state the factors",
            "engine",
        )


def _read_node(c: Reader, kinds: set[str]) -> NodeSpec:
    devices_raw = c.get("devices")
    if not isinstance(devices_raw, dict) or not devices_raw:
        c.fail("expected a mapping of device kind to count, e.g. {a100: 8}", "devices")
    dev_reader = c.child("devices", devices_raw)
    devices = []
    for kind in devices_raw:
        if kind not in kinds:
            dev_reader.fail(f"unknown device kind {kind!r} (known: {', '.join(sorted(kinds))})", str(kind))
        devices.append((kind, dev_reader.get(kind, as_int, positive=True)))
    node = NodeSpec(
        name=c.get("name", as_safe_name),
        devices=tuple(devices),
        count=c.get("count", as_int, default=1, positive=True),
        hostname=c.get("hostname", as_hostname, default=None),
        slots=c.get("slots", as_int, default=None),
        links=read_intra_links(c, "links", kinds),
        region=c.get("region", as_safe_name, default=None),
    )
    if node.slots is not None and not 0 < node.slots <= MAX_DEVICES:
        c.fail(f"must be in 1..{MAX_DEVICES:,} (a host's MPI slots), got {node.slots}", "slots")
    c.done()
    return node


def _check_hostnames(top: Reader, nodes: tuple[NodeSpec, ...]) -> None:
    """Every copy's host name (as_hostname checked copy 0), and copies of a template with count > 1 on distinct
    hosts: copies on one host would be exported as engines (or ranks) on the same GPUs of that host. Run once the
    copies are known to be few (the device limit is checked from the counts first)."""
    for t, node in enumerate(nodes):
        seen: dict[str, int] = {}
        for i in range(node.count) if node.hostname else ():
            host = node.hostname.format(i=i)
            problem = hostname_problem(host) if i else None
            if problem is not None:
                top.fail(f"{problem} (copy {i} of {node.hostname!r})", f"nodes[{t}].hostname")
            if host in seen:
                top.fail(
                    f"{node.hostname!r} gives copies {seen[host]} and {i} of node {node.name!r} (count: {node.count}) "
                    'the same host; write {i} where the copy index goes (e.g. "gpu-{i}"), or one node per host',
                    f"nodes[{t}].hostname",
                )
            seen[host] = i


def _as_list(r: Reader, key: str) -> list:
    items = r.get(key)
    if not isinstance(items, list) or not items:
        r.fail("expected a non-empty list", key)
    return items


def parse_cluster(data: Any, source: str = "<memory>") -> ClusterSpec:
    """Build a ClusterSpec from parsed YAML; raises SpecError naming `source`."""
    top = Reader(source, "", data)
    kinds = tuple(_read_kind(top.child(f"device_kinds[{i}]", d)) for i, d in enumerate(_as_list(top, "device_kinds")))
    kind_names = [k.name for k in kinds]
    if len(set(kind_names)) != len(kind_names):
        top.fail(f"duplicate device kind names in {kind_names}", "device_kinds")
    nodes = tuple(
        _read_node(top.child(f"nodes[{i}]", n), set(kind_names)) for i, n in enumerate(_as_list(top, "nodes"))
    )
    first = {}
    for i, node in enumerate(nodes):  # a template is named in replicas and links: one name, one template
        if first.setdefault(node.name, i) != i:
            top.fail(f"duplicate node name {node.name!r} (nodes[{first[node.name]}] has it too)", f"nodes[{i}].name")
    num_devices = sum(node.count * num for node in nodes for _, num in node.devices)
    if num_devices > MAX_DEVICES:
        top.fail(
            f"the cluster has {num_devices:,} devices (count x devices of every node); the limit is {MAX_DEVICES:,}",
            "nodes",
        )
    _check_hostnames(top, nodes)
    check_regions(top, nodes)
    links = top.child("links", top.get("links", default={}))
    default_raw = links.get("intra_node_default", default=None)
    inter_raw = links.get("inter_node", default=None)
    cluster = ClusterSpec(
        name=top.get("name", as_name),
        description=top.get("description", as_text, default=""),
        device_kinds=kinds,
        nodes=nodes,
        intra_node_default=read_link(links.child("intra_node_default", default_raw))
        if default_raw is not None
        else None,
        intra_node=read_intra_links(links, "intra_node", set(kind_names)),
        inter_node=read_link(links.child("inter_node", inter_raw)) if inter_raw is not None else None,
        between_regions=read_region_links(links, "between_regions", {n.region for n in nodes if n.region}),
        source=source,
    )
    links.done()
    top.done()
    _check_links(cluster, links)
    return cluster


def _check_links(cluster: ClusterSpec, links: Reader) -> None:
    names = [n for n, _, _ in cluster.node_names()]
    if len(set(names)) != len(names):
        raise SpecError(f"{cluster.source}: nodes: duplicate node names after expanding `count`: {names}")
    servers = [template.region for _, template, _ in cluster.node_names()]
    check_server_links(links, region_pairs(servers), cluster.between_regions, cluster.inter_node, len(names))
    if cluster.intra_node_default is None:
        check_intra_links(links, cluster.nodes, cluster.intra_node)


def check_memory_limited(cluster: ClusterSpec, kinds: set[str], purpose: str) -> None:
    """Refuse `mem_bytes: unlimited` on the named kinds where a planner sizes something by memory
    (a serving plan's KV cache: unlimited memory holds unboundedly many sequences)."""
    for i, kind in enumerate(cluster.device_kinds):
        if kind.name in kinds and math.isinf(kind.mem_bytes):
            raise SpecError(
                f"{cluster.source}: device_kinds[{i}].mem_bytes: `unlimited` cannot be used for {purpose} "
                f"(kind {kind.name!r}); give the device's memory in bytes, e.g. '512 GiB'"
            )


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster YAML file. Raises SpecError with the file, field and problem."""
    data, text = load_document(path, SpecError, finite=True)
    cluster = parse_cluster(data, source=str(path))
    digest = hashlib.sha256(text.encode()).hexdigest()
    return dataclasses.replace(cluster, sha256=digest)
