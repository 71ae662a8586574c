"""Plan files: the versioned YAML (or JSON, for a .json path) a solver writes and the verifier, `show` and
`launch` read. The format is documented in docs/plan-format.md.

Input paths (cluster, graph, profile, a model's config) are stored relative to the plan file's folder
and read back against it (llm_planner.core.plan_paths), so a plan works from any working directory.

Contract (scripts rely on these top-level keys): `objective_s` (latency in
seconds, or seconds per sample for throughput), `lower_bound_s`, `gap`, and
`assignment` (task name -> device name, or the list of its members' names for a
tensor-parallel group; of shard 0 when the batch is split, every shard's assignment
is under `shards`). Inside the program a group is one name ("node/kind:0-7", see
llm_planner.core.tensor_groups); `schedule` and `device_order` use that name.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_planner.core.atomic import write_atomic
from llm_planner.core.fileio import dump_yaml, is_version, read_document
from llm_planner.core.gap import gap as gap_of
from llm_planner.core.plan_paths import model_paths, plan_folder, relative_to_plan, resolve_from_plan
from llm_planner.core.plan_read import MISSING, Fields, check_finite_tree
from llm_planner.core.tensor_groups import is_group_name, member_names

PLAN_FORMAT = "llm_planner.core.plan"
PLAN_VERSION = 1
PLAN_FIELDS = (
    "format",
    "version",
    "objective",
    "objective_s",
    "lower_bound_s",
    "gap",
    "throughput_samples_per_s",
    "max_load_s",
    "batches_in_flight",
    "batch_size",
    "assignment",
    "solver",
    "inputs",
    "shards",
    "device_order",
    "schedule",
)
OBJECTIVES = ("latency", "throughput")
# optimal: proven within the relative gap; time_limit: stopped at the time limit; interrupted: stopped by the
# user (Ctrl-C), the best plan found so far; feasible: stopped for another reason; heuristic: no proof sought
STATUSES = ("optimal", "time_limit", "interrupted", "feasible", "heuristic")
DERIVED_REL_TOL = 1e-9  # derived floats (gap, throughput) against their re-derivation: the writer round-trips exactly
MAX_SEED = 2**63 - 1  # inputs.model.seed: the largest seed every generator the runtime seeds accepts


class PlanError(ValueError):
    """A plan file that cannot be read; the message names the file and field."""


def batches_in_flight(objective: str, makespan_s: float, max_load_s: float) -> int:
    """Batches a plan keeps in flight: 1 for latency plans; for throughput plans the steady state
    that keeps the busiest device busy, ceil(one batch's makespan / the busiest device's load per
    batch) (a new batch enters every max_load_s, and each stays makespan_s). The launcher runs this
    many (llm_planner.runtime.plan_schedule), and every device holds the per-sample memory (KV cache)
    of each of them (problem.fit.steady_state_memory, verify)."""
    if objective != "throughput" or not max_load_s > 0 or not math.isfinite(makespan_s):
        return 1
    return max(1, math.ceil(makespan_s / max_load_s - 1e-9))


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
    profile: str | None = (
        None  # measured-cost profile (llm_planner.cost.profile) the costs came from; None: roofline only
    )
    profile_sha256: str = ""
    max_tp: int = 1  # largest tensor-parallel group offered (1: none)
    model_file_sha256: str = (
        ""  # sha256 of the bytes of the graph file or the config.json the model names ("": a preset)
    )


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
    status: str  # one of STATUSES
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
        """The gap (llm_planner.core.gap) of the objective and the lower bound; 0 means proven optimal."""
        return gap_of(self.objective_s, self.lower_bound_s, maximize=False)

    @property
    def assignment(self) -> dict[str, str]:
        return dict(self.shard_assignments[0])

    @property
    def makespan_s(self) -> float:
        """One batch's makespan: the schedule's last finish."""
        return max((t.finish_s for t in self.schedule), default=0.0)

    @property
    def batches_in_flight(self) -> int:
        """The batches the plan's steady state keeps in flight (`batches_in_flight` above)."""
        return batches_in_flight(self.objective, self.makespan_s, self.max_load_s)

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
        steady = {"batches_in_flight": self.batches_in_flight} if self.objective == "throughput" else {}
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "objective": self.objective,
            "objective_s": float(self.objective_s),
            "lower_bound_s": float(self.lower_bound_s),
            "gap": float(self.gap),
            "throughput_samples_per_s": float(self.throughput_samples_per_s),
            "max_load_s": float(self.max_load_s),
            **steady,
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
            "shards": [
                {"size": int(b), "assignment": _written(a)} for b, a in zip(self.shard_sizes, self.shard_assignments)
            ],
            "device_order": {d: [f"{s}:{t}" for s, t in order] for d, order in self.device_order().items()},
            "schedule": [
                {
                    "task": s.task,
                    "shard": s.shard,
                    "device": s.device,
                    "start_s": float(s.start_s),
                    "finish_s": float(s.finish_s),
                }
                for s in self.schedule
            ],
        }


def _written(assignment: dict[str, str]) -> dict[str, str | list[str]]:
    """A group as the list of its members' names, a device as its name."""
    return {t: member_names(d) if is_group_name(d) else d for t, d in assignment.items()}


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write a plan as JSON to a .json path and as YAML to any other, atomically (llm_planner.core.atomic):
    an interrupted or failing write leaves the old file, never part of the new one."""
    path = Path(path)
    data = dataclasses.replace(plan, inputs=_inputs_as_stored(plan.inputs, path)).to_dict()
    plan_from_dict(data, source=f"{path} (the plan about to be written)")  # never a file its readers refuse
    if path.suffix == ".json":
        text = json.dumps(data, indent=1, allow_nan=False) + "\n"
    else:
        text = dump_yaml(data)
    write_atomic(path, text, PlanError)


def load_plan(path: str | Path) -> Plan:
    """Read and check a plan file (llm_planner.core.fileio, then llm_planner.core.plan_read); PlanError naming the file
    and field. Its input paths come back resolved against the plan file's folder (llm_planner.core.plan_paths)."""
    plan = plan_from_dict(read_document(path, PlanError), source=str(path))
    return dataclasses.replace(plan, inputs=_inputs_resolved(plan.inputs, path))


def _inputs_as_stored(inputs: PlanInputs, plan_path: Path) -> PlanInputs:
    """The inputs as the plan file at `plan_path` records them: paths relative to its folder."""

    def stored(path: str) -> str | None:
        return relative_to_plan(path, plan_path)

    model = model_paths(inputs.model, stored, os.getcwd())
    return dataclasses.replace(inputs, cluster=stored(inputs.cluster), profile=stored(inputs.profile), model=model)


def _inputs_resolved(inputs: PlanInputs, plan_path: str | Path) -> PlanInputs:
    """The inputs a plan file at `plan_path` records, with paths that work from any working directory."""

    def resolved(path: str) -> str | None:
        return resolve_from_plan(path, plan_path)

    model = model_paths(inputs.model, resolved, plan_folder(plan_path))
    return dataclasses.replace(inputs, cluster=resolved(inputs.cluster), profile=resolved(inputs.profile), model=model)


def plan_from_dict(data: Any, source: str = "<memory>") -> Plan:
    """A Plan from its file form: every field typed and finite, the derived fields (gap,
    throughput_samples_per_s, batches_in_flight, batch_size, assignment, device_order) equal to what the others give."""
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        where = "format: " if isinstance(data, dict) else ""
        got = f", got {str(data.get('format'))[:60]!r}" if isinstance(data, dict) and "format" in data else ""
        raise PlanError(
            f"{source}: {where}not a plan file (expected format: {PLAN_FORMAT} for a placement plan, or "
            f"llm_planner.serving_plan for a serving plan{got})"
        )
    top = Fields(data, source, "", PlanError)
    if not is_version(data.get("version"), PLAN_VERSION):
        raise top.fail(
            "version", f"unsupported plan version {data.get('version')!r} (this reader knows {PLAN_VERSION})"
        )
    top.only(PLAN_FIELDS)
    objective = top.string("objective")
    if objective not in OBJECTIVES:
        raise top.fail("objective", f"must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    objective_s = top.number("objective_s")
    if objective_s <= 0:
        raise top.fail("objective_s", f"must be > 0, got {objective_s}")
    sizes, assignments = _read_shards(top)
    plan = Plan(
        inputs=_read_inputs(top.mapping("inputs")),
        objective=objective,
        objective_s=objective_s,
        lower_bound_s=top.number("lower_bound_s", minimum=0.0),
        shard_sizes=sizes,
        shard_assignments=assignments,
        schedule=_read_schedule(top),
        solver=_read_solver(top.mapping("solver")),
        max_load_s=top.number("max_load_s", minimum=0.0),
    )
    _check_derived(plan, top)
    return plan


def _read_shards(top: Fields) -> tuple[tuple[int, ...], tuple[dict[str, str], ...]]:
    raw = top.sequence("shards")
    if not raw:
        raise top.fail("shards", "at least one shard is needed")
    sizes, assignments = [], []
    for n, item in enumerate(raw):
        shard = top.item("shards", n, item)
        shard.only(("size", "assignment"))
        sizes.append(shard.integer("size", minimum=1))
        assignments.append(_read_assignment(shard.mapping("assignment")))
    return tuple(sizes), tuple(assignments)


def _read_assignment(fields: Fields) -> dict[str, str]:
    return {task: _read_device(value, fields, task) for task, value in fields.data.items()}


def _read_device(value: Any, fields: Fields, key: str) -> str:
    """A device name, or a group's name from the list of its members' names."""
    if isinstance(value, str):
        return value
    if not (isinstance(value, list) and len(value) >= 2 and all(isinstance(v, str) for v in value)):
        raise fields.fail(
            key, f"expected a device name or a list of 2+ device names (a tensor-parallel group), got {value!r}"
        )
    node_kind = {v.rsplit(":", 1)[0] for v in value}
    try:
        index = [int(v.rsplit(":", 1)[1]) for v in value]
    except (IndexError, ValueError):
        raise fields.fail(key, f"{value!r} are not device names of the form node/kind:index") from None
    if len(node_kind) != 1 or index != list(range(index[0], index[0] + len(index))):
        raise fields.fail(key, f"group {value!r} must be consecutive devices of one kind in one node")
    return f"{node_kind.pop()}:{index[0]}-{index[-1]}"


def _read_schedule(top: Fields) -> tuple[ScheduledTask, ...]:
    out = []
    for n, item in enumerate(top.sequence("schedule")):
        entry = top.item("schedule", n, item)
        entry.only(("task", "shard", "device", "start_s", "finish_s"))
        out.append(
            ScheduledTask(
                task=entry.string("task"),
                shard=entry.integer("shard", minimum=0),
                device=entry.string("device"),
                start_s=entry.number("start_s"),
                finish_s=entry.number("finish_s"),
            )
        )
    return tuple(out)


def _read_solver(fields: Fields) -> SolverInfo:
    fields.only(("name", "backend", "status", "time_s", "details"))
    status = fields.string("status")
    if status not in STATUSES:
        raise fields.fail("status", f"must be one of {', '.join(STATUSES)}, got {status!r}")
    details = fields.mapping("details", {})
    check_finite_tree(details.data, fields, "details")
    return SolverInfo(
        name=fields.string("name"),
        status=status,
        time_s=fields.number("time_s", minimum=0.0),
        backend=fields.string("backend", ""),
        details=dict(details.data),
    )


# inputs.model's fields of a fixed type (graph.models.ModelSpec's, and a workload file's `graph`)
MODEL_FIELD_TYPES = {
    "name": str,
    "phase": str,
    "granularity": str,
    "dtype": str,
    "graph": str,
    "seq_len": int,
    "seed": int,
}


def _read_inputs(fields: Fields) -> PlanInputs:
    fields.only(tuple(f.name for f in dataclasses.fields(PlanInputs)))
    model, options = fields.mapping("model"), fields.mapping("options", {})
    for key, value in model.data.items():
        if not (value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            raise model.fail(key, f"expected a string, an integer or null, got {value!r}")
        want = MODEL_FIELD_TYPES.get(key)
        if want is not None and value is not None and not isinstance(value, want):
            raise model.fail(key, f"expected {'an integer' if want is int else 'a string'}, got {value!r}")
    if "seed" in model.data:  # seeds weights, prompts and random graphs (torch.manual_seed takes 64 bits)
        seed = model.integer("seed", minimum=0)
        if seed > MAX_SEED:
            raise model.fail("seed", f"must be at most {MAX_SEED} (2**63 - 1), got {seed}")
    check_finite_tree(options.data, fields, "options")
    # a hash of no file could only come from an edit; but a workload graph file brings its own devices, whose hash
    # stands in the cluster's place (verify notices when the workload's device fields change)
    for name in ("cluster", "profile"):
        from_graph = name == "cluster" and "graph" in model.data
        if fields.data.get(name) is None and fields.data.get(f"{name}_sha256") and not from_graph:
            raise fields.fail(f"{name}_sha256", f"a hash, but inputs.{name} names no file")
        if isinstance(fields.data.get(name), str) and not fields.data.get(f"{name}_sha256"):
            raise fields.fail(f"{name}_sha256", f"missing: inputs.{name} names a file, whose sha256 a plan records")
    return PlanInputs(
        cluster=fields.string("cluster", nullable=True),
        cluster_sha256=fields.string("cluster_sha256"),
        model=dict(model.data),
        graph_sha256=fields.string("graph_sha256"),
        objective=fields.string("objective"),
        batch_size=fields.integer("batch_size", minimum=1),
        max_shards=fields.integer("max_shards", minimum=1),
        dtype=fields.string("dtype"),
        options=dict(options.data),
        profile=fields.string("profile", None, nullable=True),
        profile_sha256=fields.string("profile_sha256", ""),
        max_tp=fields.integer("max_tp", 1, minimum=1),
        model_file_sha256=fields.string("model_file_sha256", ""),
    )


def _check_derived(plan: Plan, top: Fields) -> None:
    """The fields that follow from the others must say what the others give."""
    per_sample = "1 / objective_s" if plan.objective == "throughput" else "batch_size / objective_s"
    for key, want, formula in (
        ("gap", plan.gap, "max(0, (objective_s - lower_bound_s) / objective_s)"),
        ("throughput_samples_per_s", plan.throughput_samples_per_s, per_sample),
    ):
        got = top.number(key)
        if not math.isclose(got, want, rel_tol=DERIVED_REL_TOL, abs_tol=1e-15):
            raise top.fail(key, f"the file says {got!r}, but {formula} is {want!r}")
    required = plan.objective == "throughput"  # a latency plan runs one batch: the field may be left out
    if (required or "batches_in_flight" in top.data) and top.integer(
        "batches_in_flight", minimum=1
    ) != plan.batches_in_flight:
        formula = (
            "ceil(makespan / max_load_s), the makespan the schedule's last finish"
            if plan.objective == "throughput"
            else "1 for a latency plan"
        )
        raise top.fail(
            "batches_in_flight",
            f"the file says {top.data['batches_in_flight']}, but {formula} is {plan.batches_in_flight}",
        )
    if top.integer("batch_size") != plan.batch_size:
        raise top.fail(
            "batch_size", f"the file says {top.data['batch_size']}, but its shard sizes sum to {plan.batch_size}"
        )
    assignment = top.mapping("assignment")
    if _read_assignment(assignment) != plan.assignment:
        raise top.fail(
            "assignment",
            "differs from shards[0].assignment (the top-level assignment is shard 0's: "
            f"{_first_difference(_read_assignment(assignment), plan.assignment)})",
        )
    order = top.mapping("device_order")
    want_order = plan.to_dict()["device_order"]
    for device, items in order.data.items():
        if not (isinstance(items, list) and all(isinstance(i, str) for i in items)):
            raise order.fail(device, f"expected a list of SHARD:TASK strings, got {items!r}")
    if order.data != want_order:
        raise top.fail(
            "device_order",
            f"differs from the order of the schedule's start times ({_first_difference(order.data, want_order)})",
        )


def _first_difference(got: dict, want: dict) -> str:
    for key in sorted(set(got) | set(want), key=str):
        if got.get(key, MISSING) != want.get(key, MISSING):
            shown = {
                k: "(missing)" if v is MISSING else v
                for k, v in (("got", got.get(key, MISSING)), ("want", want.get(key, MISSING)))
            }
            return f"{key}: the file has {shown['got']!r}, expected {shown['want']!r}"
    return "same entries"


def hf_device_map(plan: Plan, module_of_task: dict[str, str], cpu_devices: set[str]) -> dict[str, str | int]:
    """A Hugging Face `device_map` (module name -> device) for a single-node plan.

    `module_of_task` maps task names to module names of the HF model
    (e.g. "block.3" -> "transformer.h.3"); devices in `cpu_devices` become
    "cpu", the others a CUDA index in the order they first appear.
    """
    groups = sorted({d for d in plan.assignment.values() if is_group_name(d)})
    if groups:
        raise PlanError(
            f"a device_map puts each module on one device; this plan runs tasks on tensor-parallel groups "
            f"({', '.join(groups)}): export it with --export vllm or megatron, or plan with --max-tp 1"
        )
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
