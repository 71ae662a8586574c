"""Plan files: the versioned YAML (or JSON, for a .json path) a solver writes and the verifier, `show` and
`launch` read. The format is documented in docs/plan-format.md.

Contract (scripts rely on these top-level keys): `objective_s` (latency in
seconds, or seconds per sample for throughput), `lower_bound_s`, `gap`, and
`assignment` (task name -> device name, or the list of its members' names for a
tensor-parallel group; of shard 0 when the batch is split, every shard's assignment
is under `shards`). Inside the program a group is one name ("node/kind:0-7", see
llm_planner.groups); `schedule` and `device_order` use that name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llm_planner.fileio import read_document
from llm_planner.groups import is_group_name, member_names

PLAN_FORMAT = "llm_planner.plan"
PLAN_VERSION = 1


class PlanError(ValueError):
    """A plan file that cannot be read; the message names the file and field."""


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """What the plan was made from; enough to rebuild the problem and verify it."""

    cluster: str | None  # path of the cluster YAML; None when the graph file defines devices
    cluster_sha256: str
    model: dict[str, Any]  # ModelSpec fields (name, phase, seq_len, ...) or {"graph": path}
    graph_sha256: str
    objective: str
    batch_size: int
    max_shards: int
    dtype: str
    options: dict[str, Any] = field(default_factory=dict)  # solver options, for the record
    profile: str | None = None  # measured-cost profile (llm_planner.profile) the costs came from; None: roofline only
    profile_sha256: str = ""
    max_tp: int = 1  # largest tensor-parallel group offered (1: none)


@dataclass(frozen=True, kw_only=True)
class ScheduledTask:
    task: str
    shard: int
    device: str
    start_s: float
    finish_s: float


@dataclass(frozen=True, kw_only=True)
class SolverInfo:
    name: str  # "milp", "milp-split", "baseline:heft", ...
    status: str  # "optimal", "feasible", "time_limit", "heuristic"
    time_s: float
    backend: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # nodes, model size, ...


@dataclass(frozen=True, kw_only=True)
class Plan:
    inputs: PlanInputs
    objective: str  # "latency" | "throughput"
    objective_s: float  # latency (s) or seconds per sample (throughput)
    lower_bound_s: float
    shard_sizes: tuple[int, ...]
    shard_assignments: tuple[dict[str, str], ...]  # per shard: task -> device
    schedule: tuple[ScheduledTask, ...]  # one batch, every (task, shard)
    solver: SolverInfo
    max_load_s: float = 0.0  # throughput: busiest device's load per batch

    @property
    def gap(self) -> float:
        """(objective - bound) / objective; 0 means proven optimal."""
        if self.objective_s <= 0:
            return 0.0
        return max(0.0, (self.objective_s - self.lower_bound_s) / self.objective_s)

    @property
    def assignment(self) -> dict[str, str]:
        return dict(self.shard_assignments[0])

    @property
    def batch_size(self) -> int:
        return sum(self.shard_sizes)

    def devices_used(self) -> list[str]:
        used = {d for b, a in zip(self.shard_sizes, self.shard_assignments) if b > 0 for d in a.values()}
        order = [s.device for s in self.schedule]
        return sorted(used, key=lambda d: (order.index(d) if d in order else len(order), d))

    def physical_devices_used(self) -> list[str]:
        """The devices used, each member of a tensor-parallel group counted."""
        return [m for d in self.devices_used() for m in member_names(d)]

    def device_order(self) -> dict[str, list[tuple[int, str]]]:
        """Each device's (shard, task) in execution order."""
        out: dict[str, list[tuple[int, str]]] = {}
        for s in sorted(self.schedule, key=lambda s: (s.start_s, s.finish_s)):
            out.setdefault(s.device, []).append((s.shard, s.task))
        return out

    @property
    def throughput_samples_per_s(self) -> float:
        """Samples per second: 1 / (s per sample) for throughput, batch / latency otherwise."""
        if self.objective_s <= 0:
            return math.inf
        per_sample = self.objective_s if self.objective == "throughput" else self.objective_s / self.batch_size
        return 1.0 / per_sample

    # -- file form -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "objective": self.objective,
            "objective_s": float(self.objective_s),
            "lower_bound_s": float(self.lower_bound_s),
            "gap": float(self.gap),
            "throughput_samples_per_s": float(self.throughput_samples_per_s),
            "max_load_s": float(self.max_load_s),
            "batch_size": self.batch_size,
            "assignment": _written(self.assignment),
            "solver": {
                "name": self.solver.name,
                "backend": self.solver.backend,
                "status": self.solver.status,
                "time_s": float(self.solver.time_s),
                "details": dict(self.solver.details),
            },
            "inputs": dict(self.inputs.__dict__),
            "shards": [{"size": int(b), "assignment": _written(a)} for b, a in zip(self.shard_sizes, self.shard_assignments)],
            "device_order": {d: [f"{s}:{t}" for s, t in order] for d, order in self.device_order().items()},
            "schedule": [
                {"task": s.task, "shard": s.shard, "device": s.device, "start_s": float(s.start_s), "finish_s": float(s.finish_s)}
                for s in self.schedule
            ],
        }


def _written(assignment: dict[str, str]) -> dict[str, str | list[str]]:
    """A group as the list of its members' names, a device as its name."""
    return {t: member_names(d) if is_group_name(d) else d for t, d in assignment.items()}


def _read_device(value: Any, where: str) -> str:
    """A device name, or a group's name from the list of its members' names."""
    if isinstance(value, str):
        return value
    if not (isinstance(value, list) and len(value) >= 2 and all(isinstance(v, str) for v in value)):
        raise PlanError(f"{where}: expected a device name or a list of 2+ device names (a tensor-parallel group), got {value!r}")
    node_kind = {v.rsplit(":", 1)[0] for v in value}
    try:
        index = [int(v.rsplit(":", 1)[1]) for v in value]
    except (IndexError, ValueError):
        raise PlanError(f"{where}: {value!r} are not device names of the form node/kind:index") from None
    if len(node_kind) != 1 or index != list(range(index[0], index[0] + len(index))):
        raise PlanError(f"{where}: group {value!r} must be consecutive devices of one kind in one node")
    return f"{node_kind.pop()}:{index[0]}-{index[-1]}"


def _read_assignment(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: expected a mapping of task name to device, got {type(raw).__name__}")
    return {str(t): _read_device(d, f"{where}.{t}") for t, d in raw.items()}


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write a plan as JSON to a .json path and as YAML to any other (as fileio.read_document reads it back)."""
    path = Path(path)
    if path.suffix == ".json":
        path.write_text(json.dumps(plan.to_dict(), indent=1) + "\n")
    else:
        path.write_text(yaml.safe_dump(plan.to_dict(), sort_keys=False, width=120))


def _need(data: dict, key: str, source: str, where: str = "") -> Any:
    if not isinstance(data, dict) or key not in data:
        raise PlanError(f"{source}: {where}{key}: missing required field")
    return data[key]


def plan_from_dict(data: Any, source: str = "<memory>") -> Plan:
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise PlanError(f"{source}: not a plan file (expected format: {PLAN_FORMAT})")
    if data.get("version") != PLAN_VERSION:
        raise PlanError(f"{source}: version: unsupported plan version {data.get('version')!r}")
    try:
        inputs = PlanInputs(**_need(data, "inputs", source))
        solver = SolverInfo(**_need(data, "solver", source))
        shards = _need(data, "shards", source)
        schedule = tuple(ScheduledTask(**s) for s in _need(data, "schedule", source))
        return Plan(
            inputs=inputs,
            objective=_need(data, "objective", source),
            objective_s=float(_need(data, "objective_s", source)),
            lower_bound_s=float(_need(data, "lower_bound_s", source)),
            shard_sizes=tuple(int(s["size"]) for s in shards),
            shard_assignments=tuple(_read_assignment(s["assignment"], f"{source}: shards[{n}].assignment") for n, s in enumerate(shards)),
            schedule=schedule,
            solver=solver,
            max_load_s=float(data.get("max_load_s", 0.0)),
        )
    except (TypeError, KeyError, ValueError) as exc:
        raise PlanError(f"{source}: malformed plan: {exc}") from None


def load_plan(path: str | Path) -> Plan:
    data = read_document(path, PlanError)
    return plan_from_dict(data, source=str(path))


def hf_device_map(plan: Plan, module_of_task: dict[str, str], cpu_devices: set[str]) -> dict[str, str | int]:
    """A Hugging Face `device_map` (module name -> device) for a single-node plan.

    `module_of_task` maps task names to module names of the HF model
    (e.g. "block.3" -> "transformer.h.3"); devices in `cpu_devices` become
    "cpu", the others a CUDA index in the order they first appear.
    """
    groups = sorted({d for d in plan.assignment.values() if is_group_name(d)})
    if groups:
        raise PlanError(f"a device_map puts each module on one device; this plan runs tasks on tensor-parallel groups "
                        f"({', '.join(groups)}): export it with --export vllm or megatron, or plan with --max-tp 1")
    nodes = {d.split("/")[0] for d in plan.assignment.values()}
    if len(nodes) > 1:
        raise PlanError(f"a device_map describes one machine; this plan spans nodes {sorted(nodes)}")
    gpu_index: dict[str, int] = {}
    out: dict[str, str | int] = {}
    for task, device in plan.assignment.items():
        if task not in module_of_task:
            continue
        if device in cpu_devices:
            out[module_of_task[task]] = "cpu"
        else:
            out[module_of_task[task]] = gpu_index.setdefault(device, len(gpu_index))
    return out
