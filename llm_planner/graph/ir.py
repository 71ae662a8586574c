"""Task graph IR: plain numbers that every solver reads (no torch, no solver).

A task is one unit of placement (a decoder block, a conv layer, an fx node). Its
costs are given either analytically (FLOPs and bytes moved per sample, turned
into time by the roofline in llm_planner.cost.roofline) or explicitly (seconds per sample
on each device kind, e.g. from a profile or an imported workload file).

JSON form (docs/graph-format.md):
    {"format": "llm_planner.graph", "version": 1, "name": ..., "meta": {...},
     "tasks": [{"name": ..., "kind": ..., "flops_per_sample": ..., ...}, ...],
     "edges": [{"src": ..., "dst": ..., "bytes_per_sample": ..., ...}, ...]}
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import networkx as nx

from llm_planner.core.constants import DEVICE_TYPES
from llm_planner.core.fileio import is_version, read_document
from llm_planner.core.fmt import quote

GRAPH_FORMAT = "llm_planner.graph"
GRAPH_VERSION = 1
# Largest graph a file may hold: planned at these sizes in minutes and under 2 GB on two cores
# with the default solver (benchmarks/bench_limits.py; docs/inputs.md has the figures).
MAX_TASKS = 50_000
MAX_EDGES = 200_000
# A plan names every task four times and its device three (once per shard): with names within
# these limits and the cluster spec's (spec_fields.MAX_NAME_CHARS), a 50,000-task plan stays well
# inside the 64 MiB a file may hold, so it can be read back (docs/inputs.md).
MAX_TASK_NAME_CHARS = 128
MAX_GRAPH_NAME_CHARS = 256


class GraphError(ValueError):
    """A task graph that is malformed (cycle, unknown task, bad number)."""


@dataclass(frozen=True, kw_only=True)
class Task:
    name: str
    kind: str = "op"  # free-form label: "decoder_block", "attention", "conv", ...
    flops_per_sample: float = 0.0
    bytes_per_sample: float = 0.0  # activation bytes read + written per sample
    weight_bytes: float = 0.0  # parameters held in device memory, read once per call
    mem_bytes_per_sample: float = 0.0  # extra device memory per sample that stays (KV cache)
    # Activation workspace per sample while the task runs (freed after; a device needs its largest).
    workspace_bytes_per_sample: float = 0.0
    # Explicit costs: device kind -> seconds per sample; bypasses the roofline when set.
    time_s_by_kind: tuple[tuple[str, float], ...] = ()
    # Device types ("cpu", "gpu", "accelerator") the task may run on; empty = any.
    device_types: tuple[str, ...] = ()
    # Tasks with the same non-empty group must share a device (colour classes).
    colocate_group: str = ""
    # Memory only counts against devices of these types; empty = all.
    mem_device_types: tuple[str, ...] = ()
    # Free-form labels kept through the pipeline (e.g. "layer": 3 for the runtime).
    labels: tuple[tuple[str, Any], ...] = ()
    # Of weight_bytes: tables whose rows are read only where the inputs index them (an
    # embedding), held but not streamed per call (the rows read are in bytes_per_sample).
    weight_bytes_indexed: float = 0.0
    # Tensor parallelism (Megatron layout; llm_planner.cost.roofline.group_task_time_pieces): a group of
    # k devices may run the task when k divides every number of tp_divides (heads, KV heads,
    # widths); empty: the task does not shard. Each member holds and moves 1/k of the task's
    # weights and bytes except the replicated parts below, does 1/k of its FLOPs, and the
    # group runs the collectives listed (bytes per sample, summed over the calls).
    tp_divides: tuple[int, ...] = ()
    tp_replicated_weight_bytes: float = 0.0  # of weight_bytes: what every member holds whole (norms, biases)
    tp_replicated_indexed_bytes: float = 0.0  # of those, indexed tables (learned positions)
    tp_replicated_bytes_per_sample: float = 0.0  # of bytes_per_sample: what every member moves whole
    tp_replicated_mem_bytes_per_sample: float = (
        0.0  # of mem_bytes_per_sample: what every member holds whole (MLA's cache)
    )
    tp_allreduces: int = 0  # all-reduces per call (each over the group's link, ring algorithm)
    tp_allreduce_bytes_per_sample: float = 0.0  # their payloads together
    tp_allgathers: int = 0  # all-gathers per call
    tp_allgather_bytes_per_sample: float = 0.0  # what each member contributes to them, together

    def shards_over(self, k: int) -> bool:
        """Whether a group of k devices may run this task (k = 1: always)."""
        return k == 1 or (bool(self.tp_divides) and k >= 1 and all(d % k == 0 for d in self.tp_divides))

    def label(self, key: str, default: Any = None) -> Any:
        return dict(self.labels).get(key, default)


@dataclass(frozen=True, kw_only=True)
class Edge:
    src: str
    dst: str
    bytes_per_sample: float = 0.0  # tensor bytes that cross the edge, per sample
    # Explicit transfer cost: seconds per sample for each hop through host memory
    # (the imported workload format); 0 = use bytes and the link instead.
    hop_s_per_sample: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TaskGraph:
    name: str
    tasks: tuple[Task, ...]
    edges: tuple[Edge, ...]
    meta: tuple[tuple[str, Any], ...] = ()
    _index: dict = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    _topo: tuple[str, ...] | None = field(
        default=None, init=False, compare=False, repr=False
    )  # topological_order, once computed

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {t.name: i for i, t in enumerate(self.tasks)})

    # -- queries -------------------------------------------------------------
    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    def index(self, name: str) -> int:
        return self._index[name]

    def task(self, name: str) -> Task:
        return self.tasks[self._index[name]]

    def meta_dict(self) -> dict[str, Any]:
        return dict(self.meta)

    def to_networkx(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(t.name for t in self.tasks)
        for e in self.edges:
            g.add_edge(e.src, e.dst, bytes_per_sample=e.bytes_per_sample)
        return g

    def topological_order(self) -> list[str]:
        """Tasks in a deterministic topological order (ties broken by position); computed once."""
        if self._topo is None:
            object.__setattr__(
                self,
                "_topo",
                tuple(nx.lexicographical_topological_sort(self.to_networkx(), key=self._index.__getitem__)),
            )
        return list(self._topo)

    @property
    def has_explicit_costs(self) -> bool:
        return any(t.time_s_by_kind for t in self.tasks)

    def total_weight_bytes(self) -> float:
        return sum(t.weight_bytes for t in self.tasks)

    # -- checks --------------------------------------------------------------
    def validate(self) -> "TaskGraph":
        """Raise GraphError on duplicate names, unknown endpoints, bad numbers or a cycle; the
        message names the record (`tasks[3]`, `edges[0].dst`) as the graph file numbers it."""
        seen: dict[str, int] = {}
        for i, t in enumerate(self.tasks):
            if t.name in seen:
                raise GraphError(
                    f"graph {self.name!r}: tasks[{i}].name: duplicate task name {t.name!r} (also tasks[{seen[t.name]}])"
                )
            seen[t.name] = i
            _check_task_numbers(f"graph {self.name!r}: tasks[{i}] ({t.name!r})", t)
            _check_tensor_parallel(self.name, t)
        pairs: dict[tuple[str, str], int] = {}
        for i, e in enumerate(self.edges):
            where = f"graph {self.name!r}: edges[{i}] ({e.src!r} -> {e.dst!r})"
            for key, end in (("src", e.src), ("dst", e.dst)):
                if end not in self._index:
                    raise GraphError(f"{where}.{key}: names unknown task {end!r}")
            if e.src == e.dst:
                raise GraphError(f"{where}: self-loop on {e.src!r}")
            if (e.src, e.dst) in pairs:
                raise GraphError(
                    f"{where}: duplicate edge {e.src!r} -> {e.dst!r} (also edges[{pairs[(e.src, e.dst)]}])"
                )
            pairs[(e.src, e.dst)] = i
            _plausible(e.bytes_per_sample, MAX_BYTES, f"{where}: bytes_per_sample")
            _plausible(e.hop_s_per_sample, MAX_SECONDS, f"{where}: hop_s_per_sample")
        g = self.to_networkx()
        if not nx.is_directed_acyclic_graph(g):
            cycle = nx.find_cycle(g)
            raise GraphError(f"graph {self.name!r} is not a DAG: cycle through {[u for u, _ in cycle]}")
        return self

    # -- serialisation ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": GRAPH_FORMAT,
            "version": GRAPH_VERSION,
            "name": self.name,
            "meta": dict(self.meta),
            "tasks": [_task_to_dict(t) for t in self.tasks],
            "edges": [{k: v for k, v in asdict(e).items() if v or k in ("src", "dst")} for e in self.edges],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False)

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


_TASK_SIZES = (
    "flops_per_sample",
    "bytes_per_sample",
    "weight_bytes",
    "mem_bytes_per_sample",
    "workspace_bytes_per_sample",
    "weight_bytes_indexed",
    "tp_replicated_weight_bytes",
    "tp_replicated_indexed_bytes",
    "tp_replicated_bytes_per_sample",
    "tp_replicated_mem_bytes_per_sample",
    "tp_allreduce_bytes_per_sample",
    "tp_allgather_bytes_per_sample",
)


# The plausible range of a task's or edge's numbers (docs/inputs.md), far past any model (GPT-3's
# weights are 350 GB, its forward pass 0.35 TFLOP a token): a size of 1e24 bytes broke the MILP's
# arithmetic (a schedule it called a formulation bug), and 1e300 FLOP planned as a 1e285 s latency.
MAX_BYTES = 2.0**50  # 1 PiB a sample or a task's weights
MAX_FLOPS = 1e18  # a sample's work in one task
MAX_SECONDS = 3600.0  # a measured time of one task, or an edge's hop, a sample


def _plausible(value: float, high: float, what: str) -> None:
    if not (math.isfinite(value) and 0 <= value <= high):
        raise GraphError(
            f"{what} must be finite, >= 0 and at most {high:g} (a plausible model; docs/inputs.md), got {value}"
        )


def _check_task_numbers(where: str, t: Task) -> None:
    for f in _TASK_SIZES:
        _plausible(getattr(t, f), MAX_FLOPS if f == "flops_per_sample" else MAX_BYTES, f"{where}: {f}")
    for kind, v in t.time_s_by_kind:
        _plausible(v, MAX_SECONDS, f"{where}.time_s_by_kind.{kind}: time on {kind!r}")


def _check_tensor_parallel(graph: str, t: Task) -> None:
    where = f"graph {graph!r}: task {t.name!r}"
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in t.tp_divides):
        raise GraphError(f"{where}: tp_divides must be positive integers, got {list(t.tp_divides)}")
    for f in ("tp_allreduces", "tp_allgathers"):
        v = getattr(t, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise GraphError(f"{where}: {f} must be an integer >= 0, got {v!r}")
    if (
        max(t.weight_bytes_indexed, t.tp_replicated_weight_bytes) > t.weight_bytes
        or t.tp_replicated_bytes_per_sample > t.bytes_per_sample
        or t.tp_replicated_mem_bytes_per_sample > t.mem_bytes_per_sample
        or t.tp_replicated_indexed_bytes > min(t.weight_bytes_indexed, t.tp_replicated_weight_bytes)
    ):
        raise GraphError(
            f"{where}: indexed or replicated weights exceed the task's weights, replicated bytes its bytes, "
            "replicated memory its memory, or replicated indexed tables the indexed or the replicated weights"
        )
    if t.tp_divides and t.time_s_by_kind:
        raise GraphError(
            f"{where}: a task with explicit times (time_s_by_kind) cannot shard over tensor-parallel groups"
        )


def _task_to_dict(t: Task) -> dict[str, Any]:
    out: dict[str, Any] = {"name": t.name}
    for f in fields(Task):
        if f.name == "name":
            continue
        v = getattr(t, f.name)
        if v == f.default:
            continue
        if f.name in ("time_s_by_kind", "labels"):
            v = dict(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


_TASK_FIELDS = {f.name for f in fields(Task)}
_EDGE_FIELDS = {f.name for f in fields(Edge)}


def graph_from_dict(data: dict[str, Any], source: str = "<memory>") -> TaskGraph:
    """Inverse of TaskGraph.to_dict; raises GraphError naming `source` and the field."""
    if not isinstance(data, dict) or data.get("format") != GRAPH_FORMAT:
        raise GraphError(f'{source}: not a task graph file (expected "format": "{GRAPH_FORMAT}")')
    if not is_version(data.get("version"), GRAPH_VERSION):
        raise GraphError(
            f"{source}: version: unsupported version {data.get('version')!r} (this build reads {GRAPH_VERSION})"
        )
    unknown = sorted(set(data) - {"format", "version", "name", "meta", "tasks", "edges"}, key=str)
    if unknown:
        raise GraphError(f"{source}: unknown key(s) {unknown}")
    tasks = [
        _read_task(raw, f"{source}: tasks[{i}]") for i, raw in enumerate(_records(data, "tasks", MAX_TASKS, source))
    ]
    edges = [
        _read_edge(raw, f"{source}: edges[{i}]") for i, raw in enumerate(_records(data, "edges", MAX_EDGES, source))
    ]
    if not tasks:
        raise GraphError(f"{source}: tasks: the graph has no tasks")
    name, meta = data.get("name", Path(source).stem), data.get("meta", {})
    if not isinstance(name, str) or not name:
        raise GraphError(f"{source}: name: expected a non-empty string, got {quote(name)}")
    _check_length(name, MAX_GRAPH_NAME_CHARS, f"{source}: name")
    if not isinstance(meta, dict):
        raise GraphError(f"{source}: meta: expected a mapping, got {type(meta).__name__}")
    graph = TaskGraph(name=name, tasks=tuple(tasks), edges=tuple(edges), meta=tuple(meta.items()))
    try:
        return graph.validate()
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None


def _records(data: dict, key: str, limit: int, source: str) -> list:
    """The list `key` of the file (missing: empty), at most `limit` long."""
    items = data.get(key, [])
    if not isinstance(items, list):
        raise GraphError(f"{source}: {key}: expected a list, got {type(items).__name__}")
    if len(items) > limit:
        raise GraphError(f"{source}: {key}: {len(items):,} {key}; the limit is {limit:,} (docs/inputs.md)")
    return items


def _read_task(raw: Any, where: str) -> Task:
    if not isinstance(raw, dict):
        raise GraphError(f"{where}: expected a mapping, got {type(raw).__name__}")
    unknown = set(raw) - _TASK_FIELDS
    if unknown or "name" not in raw:
        what = f"unknown key(s) {sorted(unknown, key=str)}" if unknown else "missing required field 'name'"
        raise GraphError(f"{where}: {what}")
    kw = _checked_fields(dict(raw), where)
    for key in ("time_s_by_kind", "labels"):
        if key in kw:
            kw[key] = tuple(kw[key].items())
    for key in ("device_types", "mem_device_types", "tp_divides"):
        if key in kw:
            kw[key] = tuple(kw[key])
    return Task(**kw)


def _read_edge(raw: Any, where: str) -> Edge:
    if not isinstance(raw, dict):
        raise GraphError(f"{where}: expected a mapping, got {type(raw).__name__}")
    unknown = set(raw) - _EDGE_FIELDS
    if unknown or "src" not in raw or "dst" not in raw:
        what = f"unknown key(s) {sorted(unknown, key=str)}" if unknown else "missing 'src' or 'dst'"
        raise GraphError(f"{where}: {what}")
    return Edge(**_checked_fields(dict(raw), where))


_NUMBER_FIELDS = {
    "flops_per_sample",
    "bytes_per_sample",
    "weight_bytes",
    "mem_bytes_per_sample",
    "hop_s_per_sample",
    "weight_bytes_indexed",
    "workspace_bytes_per_sample",
    "tp_replicated_indexed_bytes",
    "tp_replicated_weight_bytes",
    "tp_replicated_bytes_per_sample",
    "tp_allreduce_bytes_per_sample",
    "tp_allgather_bytes_per_sample",
}
_INT_FIELDS = {"tp_allreduces", "tp_allgathers"}
_MAPPING_FIELDS = {"time_s_by_kind", "labels"}
_LIST_FIELDS = {"device_types", "mem_device_types"}
_STRING_FIELDS = {"name", "kind", "colocate_group", "src", "dst"}


def _checked_fields(kw: dict[str, Any], where: str) -> dict[str, Any]:
    """Raise GraphError naming `where` and the field when a value has the wrong type."""
    for key, value in kw.items():
        if key in _NUMBER_FIELDS and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise GraphError(f"{where}.{key}: expected a number, got {value!r}")
        if key in _MAPPING_FIELDS and not isinstance(value, dict):
            raise GraphError(f"{where}.{key}: expected a mapping, got {value!r}")
        if key in _LIST_FIELDS and not (isinstance(value, list) and all(v in DEVICE_TYPES for v in value)):
            raise GraphError(
                f"{where}.{key}: expected a list of device types ({', '.join(DEVICE_TYPES)}), got {value!r}"
            )
        if key in _INT_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
            raise GraphError(f"{where}.{key}: expected an integer, got {value!r}")
        if key == "tp_divides" and not (
            isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise GraphError(f"{where}.{key}: expected a list of integers, got {value!r}")
        if key in _STRING_FIELDS and not isinstance(value, str):
            raise GraphError(f"{where}.{key}: expected a string, got {value!r}")
        if key in ("name", "src", "dst") and not value:
            raise GraphError(f"{where}.{key}: expected a non-empty string")
        if key in ("name", "src", "dst"):
            _check_length(value, MAX_TASK_NAME_CHARS, f"{where}.{key}")
    for kind, seconds in kw.get("time_s_by_kind", {}).items():
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise GraphError(f"{where}.time_s_by_kind.{kind}: expected a number of seconds, got {seconds!r}")
    return kw


def _check_length(name: str, limit: int, where: str) -> None:
    """A name within `limit` characters that a plan file can hold (UTF-8: no lone surrogate)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise GraphError(f"{where}: {quote(name)} is not text UTF-8 can hold (a lone surrogate)") from None
    if len(name) > limit:
        raise GraphError(f"{where}: {quote(name)} is longer than {limit} characters, the limit (docs/inputs.md)")


def load_graph_json(path: str | Path) -> TaskGraph:
    data = read_document(path, GraphError, finite=True)
    return graph_from_dict(data, source=str(path))
